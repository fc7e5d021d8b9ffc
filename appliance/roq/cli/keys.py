"""`roq keys create|list|grant|revoke|token`: the cluster's principals (docs/security.md §5) and
their HTTP bearer tokens (docs/http.md).

They are kept in ZooKeeper, so these commands need the cluster's ZooKeeper credential, which
the admin credentials hold (admin.json). Every GCM and host watches the table: a grant or a
revocation takes effect within seconds, without a restart.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from roq.cli.app import app
from roq.cli.common import errors_to_exit, fail
from roq.errors import EXIT_NOPERM, EXIT_USAGE, SecurityError
from roq.protocol.principals import TOPIC, grant_prefix

if TYPE_CHECKING:
    from roq.coordination.principals import PrincipalStore

keys_app = typer.Typer(
    help="Principals: create keys, list, grant and revoke permissions on queue-name prefixes; "
    "HTTP bearer tokens.",
    no_args_is_help=True,
)
app.add_typer(keys_app, name="keys", rich_help_panel="Clients")

ZK = typer.Option("127.0.0.1:2181", "--zk", help="ZooKeeper connect string of the cluster.")
NAMESPACE = typer.Option("/roq", "--namespace", help="The cluster's zk.namespace.")
PERMISSIONS_HELP = "publish, subscribe, consume or admin (several allowed)."
PREFIX_HELP = "Queue-name prefix ('*': every queue); topic:PREFIX for HTTP topics (topic:*: all)."


def _store(zk: str, namespace: str) -> PrincipalStore:
    from roq import limits
    from roq.coordination import session
    from roq.coordination.principals import PrincipalStore
    from roq.transport import security

    auth = security.zk_auth()
    if auth is None:
        raise SecurityError(
            "these credentials hold no ZooKeeper credential: use the admin's (admin.json)"
        )
    client = session.connect(
        zk, limits.zk_client_session_ms, connect_timeout_s=5.0, auth=auth, tls=security.zk_tls()
    )
    return PrincipalStore(client, namespace, auth)


def _close(store: PrincipalStore) -> None:
    from roq.coordination import session

    session.close(store.client)


@keys_app.command("create")
def create(
    name: str = typer.Argument(..., help="The new principal's name."),
    out: Path | None = typer.Option(
        None, "--out", help="Its credentials file (default: NAME.json here), written mode 0600."
    ),
    zk: str = ZK,
    namespace: str = NAMESPACE,
) -> None:
    """Create a principal with a new key pair and no permission (deny by default)."""
    from roq.protocol.principals import Principal, check_name

    with errors_to_exit():
        check_name(name)
        store = _store(zk, namespace)
        try:
            if store.get(name) is not None:
                raise fail(f"principal {name} exists already", EXIT_USAGE)
            path, public = _new_credentials(name, out)
            store.put(Principal(name, public))
        finally:
            _close(store)
        typer.echo(f"principal {name} created; its credentials are in {path} (keep them private)")


def _new_credentials(name: str, out: Path | None) -> tuple[Path, str]:
    """A new key pair for principal `name` in its credentials file (OUT, default NAME.json;
    mode 0600, never over an existing file), with the server key of the credentials in use, and
    their ZooKeeper credential and token when they are `name`'s own (a rotation of the admin's
    key: the new file must do all the old one did). Returns the file and the new public key."""
    from roq.transport import security

    path = out or Path(f"{name}.json")
    keys = security.KeyPair.new()
    current = security.load_credentials(security.find_credentials(None))
    doc: dict[str, Any] = {"principal": name, "public": keys.public, "secret": keys.secret,
                           "server": current.server_public}  # fmt: skip
    if current.principal == name:
        doc.update({k: v for k, v in (("zk_auth", current.zk_auth),
                                      ("token", current.token)) if v})  # fmt: skip
        if current.zk_tls is not None:  # its ZooKeeper sessions, as the old file's
            doc["zk_tls"] = current.zk_tls.encode()
    if not security.write_private(path, doc):
        raise fail(f"{path} exists already: choose another --out", EXIT_USAGE)
    return path, keys.public


@keys_app.command("rotate")
def rotate(
    name: str = typer.Argument(..., help="The principal whose key pair is replaced."),
    out: Path | None = typer.Option(
        None, "--out", help="Its new credentials file (default: NAME.json here), mode 0600."
    ),
    zk: str = ZK,
    namespace: str = NAMESPACE,
) -> None:
    """Give principal NAME a new key pair, keeping its grants and HTTP tokens. Its new
    credentials go to OUT; the old key is refused at its next handshake and request, and its
    open connections are cut within seconds. Rotating the principal of the credentials in use
    (admin) carries their ZooKeeper credential and token into the new file."""
    from dataclasses import replace

    from roq.protocol.principals import check_name

    with errors_to_exit():
        check_name(name)
        path, public = _new_credentials(name, out)
        store = _store(zk, namespace)
        try:
            changed = store.update(name, lambda p: replace(p, key=public))
        except BaseException:
            path.unlink(missing_ok=True)  # the key it holds was never granted anything
            raise
        finally:
            _close(store)
        if changed is None:
            path.unlink(missing_ok=True)
            raise fail(f"no principal {name}", EXIT_NOPERM)
    typer.echo(f"principal {name} has a new key; its credentials are in {path} (the old key "
               "is refused from now on)")  # fmt: skip


@keys_app.command("list")
def list_keys(zk: str = ZK, namespace: str = NAMESPACE) -> None:
    """Every principal, its key, its grants and how many HTTP tokens it holds."""
    with errors_to_exit():
        store = _store(zk, namespace)
        try:
            table = store.all()
        finally:
            _close(store)
    for principal in table:
        grants = "; ".join(
            f"{prefix if prefix not in ('', TOPIC) else prefix + '*'}: {','.join(sorted(perms))}"
            for prefix, perms in sorted(principal.grants.items())
        )
        tokens = f"tokens: {len(principal.tokens)}"  # never the digests
        typer.echo(f"{principal.name:20} {principal.key}  {grants or '(no permission)'}  {tokens}")


def _change(name: str, prefix: str, permissions: list[str], zk: str, namespace: str,
            grant: bool) -> None:  # fmt: skip
    from roq.protocol.principals import parse_permissions

    perms = parse_permissions(permissions)
    store = _store(zk, namespace)
    try:
        changed = store.update(
            name, lambda p: p.granted(prefix, perms) if grant else p.revoked(prefix, perms)
        )
    finally:
        _close(store)
    if changed is None:
        raise fail(f"no principal {name}", EXIT_NOPERM)


@keys_app.command("grant")
def grant(
    name: str = typer.Argument(..., help="The principal."),
    prefix: str = typer.Argument(..., help=PREFIX_HELP),
    permissions: list[str] = typer.Argument(..., help=PERMISSIONS_HELP),
    zk: str = ZK,
    namespace: str = NAMESPACE,
) -> None:
    """Give permissions on every queue whose name starts with PREFIX, or with topic:PREFIX on
    every HTTP gateway topic whose name starts with PREFIX."""
    with errors_to_exit():
        _change(name, grant_prefix(prefix), permissions, zk, namespace, grant=True)
    typer.echo(f"granted {', '.join(permissions)} on '{prefix}' to {name}")


@keys_app.command("revoke")
def revoke(
    name: str = typer.Argument(..., help="The principal."),
    prefix: str | None = typer.Argument(None, help=f"{PREFIX_HELP} None: the whole key."),
    permissions: list[str] = typer.Argument(None, help=PERMISSIONS_HELP),
    zk: str = ZK,
    namespace: str = NAMESPACE,
) -> None:
    """Take permissions away; with no PREFIX, remove the principal: its key is refused at its
    next connection and request, within seconds."""
    with errors_to_exit():
        if prefix is None:
            store = _store(zk, namespace)
            try:
                if not store.remove(name):
                    raise fail(f"no principal {name}", EXIT_NOPERM)
            finally:
                _close(store)
            typer.echo(f"principal {name} removed: its key and tokens are refused from now on")
            return
        if not permissions:
            raise fail("name the permissions to revoke, or no prefix to remove the key", 2)
        _change(name, grant_prefix(prefix), permissions, zk, namespace, grant=False)
    typer.echo(f"revoked {', '.join(permissions)} on '{prefix}' from {name}")


@keys_app.command("token")
def token(
    name: str | None = typer.Argument(
        None, help="The principal; none: print the token of the credentials in use."
    ),
    revoke_all: bool = typer.Option(
        False, "--revoke-all", help="Drop every token of NAME instead (refused from then on)."
    ),
    zk: str = ZK,
    namespace: str = NAMESPACE,
) -> None:
    """Issue a new HTTP bearer token for principal NAME and print it, alone on stdout, once:
    the cluster keeps only its SHA-256. With no NAME, print the token of the credentials in use
    (admin.json's, made on the cluster's first start): export ROQ_TOKEN=$(roq keys token)."""
    with errors_to_exit():
        if name is None:
            if revoke_all:
                raise fail("--revoke-all needs the principal's NAME", EXIT_USAGE)
            typer.echo(_own_token())
            return
        issued = _tokens(name, zk, namespace, revoke_all)
    if issued is None:
        typer.echo(f"every token of {name} dropped: they are refused from now on")
        return
    typer.echo(f"a new token of principal {name}, shown only now:", err=True)
    typer.echo(issued)


def _own_token() -> str:
    from roq.transport import security

    path = security.find_credentials(None)
    found = security.load_credentials(path).token
    if not found:
        raise fail(f"{path} holds no HTTP token (written before tokens, or by `roq keys "
                   "create`): issue one with `roq keys token NAME`", EXIT_NOPERM)  # fmt: skip
    return found


def _tokens(name: str, zk: str, namespace: str, revoke_all: bool) -> str | None:
    """A new token of `name` (its digest stored), or None once every token was dropped."""
    from roq.protocol.principals import new_token, token_digest

    issued = new_token()
    store = _store(zk, namespace)
    try:
        changed = store.update(
            name,
            lambda p: p.without_tokens() if revoke_all else p.with_token(token_digest(issued)),
        )
    finally:
        _close(store)
    if changed is None:
        raise fail(f"no principal {name}", EXIT_NOPERM)
    return None if revoke_all else issued


# --- the cluster's secret in SSM Parameter Store: how EC2 hosts get it (docs/deploy.md) ----------
PARAMETER = typer.Argument(..., help="SSM parameter name, e.g. /roq/prod/cluster.")
SECURITY_DIR = typer.Option(
    None, "--security-dir", help="Directory of cluster.json (default: roq-data/security)."
)
REGION = typer.Option(
    None, "--region", help="AWS region (default: AWS_REGION, ~/.aws/config, on EC2 its own)."
)
ENDPOINT = typer.Option(
    None, "--endpoint", help="SSM endpoint URL (default: the region's, or AWS_ENDPOINT_URL)."
)


def _security_dir(given: Path | None) -> Path:
    from roq import limits

    return given if given is not None else Path(limits.security_dir_default)


@keys_app.command("ssm-put")
def ssm_put(
    parameter: str = PARAMETER,
    security_dir: Path | None = SECURITY_DIR,
    region: str | None = REGION,
    endpoint: str | None = ENDPOINT,
    overwrite: bool = typer.Option(
        False, "--overwrite", help="Replace the parameter if it exists (a new cluster key)."
    ),
    generate: bool = typer.Option(
        False, "--generate", help="Write new keys (cluster.json, admin.json) first if none."
    ),
) -> None:
    """Upload cluster.json as an encrypted (SecureString) SSM parameter, for EC2 hosts to fetch.

    Credentials: boto3's chain (AWS_PROFILE, AWS_* variables, ~/.aws, an instance role).

    They need ssm:PutParameter on the parameter. The secret is never printed."""
    from roq.cloud import parameters
    from roq.transport import security

    directory = _security_dir(security_dir)
    with errors_to_exit():
        if generate:
            security.generate(directory)
        where = parameters.Where(parameter, region, endpoint)
        version = parameters.put_cluster(where, directory, overwrite=overwrite)
    typer.echo(f"{directory / security.CLUSTER_FILE} is in SSM parameter {parameter} (v{version})")


@keys_app.command("ssm-get")
def ssm_get(
    parameter: str = PARAMETER,
    security_dir: Path | None = SECURITY_DIR,
    region: str | None = REGION,
    endpoint: str | None = ENDPOINT,
) -> None:
    """Fetch cluster.json from an SSM parameter into the security directory (mode 0600).

    Run by the image's roq-configure on an EC2 host, with its role (ssm:GetParameter, kms:Decrypt).

    The value is checked before it is written; another cluster's cluster.json is never replaced.

    Exit 0: written, or the same one there; 77: no credentials, or denied; 69: SSM unreachable.

    78: no such parameter, not a cluster.json, or another one there; 73: cannot write."""
    from roq.cloud import parameters

    directory = _security_dir(security_dir)
    with errors_to_exit():
        doc = parameters.fetch_cluster(parameters.Where(parameter, region, endpoint))
        written = parameters.install_cluster(doc, directory)
    what = "written" if written else "there already, the same"
    typer.echo(f"cluster.json from SSM parameter {parameter}: {what} in {directory}")


@keys_app.command("zookeeper-tls")
def zookeeper_tls(
    security_dir: Path | None = SECURITY_DIR,
    port: int = typer.Option(2181, "--port", help="The port ZooKeeper serves TLS on."),
    address: str = typer.Option(
        ..., "--address", help="The address it binds (clientPortAddress: one interface)."
    ),
    generate: bool = typer.Option(
        False, "--generate", help="Write new keys (cluster.json, admin.json) first if none."
    ),
) -> None:
    """Write ZooKeeper's TLS files from cluster.json and print its listener's zoo.cfg lines.

    The files: SECURITY_DIR/zookeeper/keystore.pem and truststore.pem (mode 0600). The lines:
    a secure port only, clients must present a certificate of the cluster's CA.

    Run by the image's roq-configure before roq-zookeeper starts. Exit 78: cluster.json holds no
    ZooKeeper certificates (written before ZooKeeper TLS) or is missing."""
    from roq.errors import EXIT_CONFIG
    from roq.local.zkserver import listener_config, write_tls_files
    from roq.transport import security

    directory = _security_dir(security_dir)
    with errors_to_exit():
        secrets = security.generate(directory) if generate else security.load_cluster(directory)
        if secrets.zk_tls is None:
            raise fail(f"{directory / security.CLUSTER_FILE} holds no ZooKeeper certificates "
                       "(written before ZooKeeper TLS): make new keys (docs/security.md §6), "
                       "or run ZooKeeper without TLS (ROQ_ZK_TLS=off)", EXIT_CONFIG)  # fmt: skip
        tls_dir = write_tls_files(directory / "zookeeper", secrets.zk_tls)
    typer.echo(listener_config(port, address, tls_dir), nl=False)
