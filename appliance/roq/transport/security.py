"""CurveZMQ on every TCP socket: the keys, who is let in, and the options a socket needs.

Every socket is opened by `sockets.open_socket` and joined to the network by `sockets.bind` or
`sockets.connect`; those two call `secure_server` and `secure_client` here, so no socket of roq
can miss CURVE. Authentication is pyzmq's own ZAP handler (`zmq.auth.ThreadAuthenticator`, one
per context that binds) asking a `Gate` whether a client key belongs to a known principal; the
crypto is libzmq's (libsodium / tweetnacl), none of it is written here.

Keys (docs/security.md). A cluster has one CURVE key pair of its own (`cluster.json`, mode 0600
under `security.dir`): every server socket of every GCM, host, monitor and exchange presents it,
and the cluster's processes present it as clients too: holding it is the super-user role.
Clients hold a key pair of their own (`admin.json` for the generated admin principal) and the
cluster's public key, which they check every server against: a server without the cluster's
secret key cannot finish the handshake. Decision: one cluster server key rather than one per node,
because every endpoint roq hands out (ZooKeeper records, monitor notices, exchange lists) would
otherwise have to carry its node's key through every message that names it; the cost is that a
node's stolen key lets its thief pose as any node until the key is rotated (docs/security.md).

The process-wide state here is set once at start (`use`, `use_off`), or on first use by a client
from the credentials it finds (`find_credentials`). Only the principal table (`Gate.replace`)
changes later, swapped whole, so the ZAP thread reads it without a lock.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import os
import socket
import sys
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import zmq
from zmq.auth.thread import ThreadAuthenticator
from zmq.utils.monitor import parse_monitor_message

from roq import limits
from roq.errors import SecurityError
from roq.protocol import principals as principal_table
from roq.protocol.principals import ALL as ALL_PERMISSIONS
from roq.protocol.principals import TOPIC, Permission, Principal
from roq.protocol.zktls import ZkTls
from roq.protocol.zktls import decode as decode_zk_tls

log = logging.getLogger(__name__)

CLUSTER_FILE = "cluster.json"  # the cluster's key pair: only the cluster's own processes read it
ADMIN_FILE = "admin.json"  # the admin principal's credentials: what `roq` commands use
CREDENTIALS_ENV = "ROQ_CREDENTIALS"  # a credentials file, for clients
HOME_ENV = "ROQ_HOME"  # a data directory: clients use its security/admin.json
SECURITY_ENV = "ROQ_SECURITY"  # "off": clients talk to a cluster run with security=off
ZK_TLS_ENV = "ROQ_ZK_TLS"  # "off": plain TCP to ZooKeeper (an external one without TLS: zk.tls)
ZAP_DOMAIN = "roq"  # any principal of the cluster
CLUSTER_DOMAIN = "cluster"  # only the cluster's own processes
CLUSTER_PRINCIPAL = "cluster"
ADMIN_PRINCIPAL = "admin"

_HANDSHAKE_FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)


@dataclass(frozen=True)
class KeyPair:
    """A CURVE key pair, each key in Z85 text (40 characters)."""

    public: str
    secret: str

    @classmethod
    def new(cls) -> KeyPair:
        public, secret = zmq.curve_keypair()
        return cls(public.decode("ascii"), secret.decode("ascii"))


@dataclass(frozen=True)
class Identity:
    """How this process shows itself: its principal and key pair, the key it requires of every
    server, and whether its own server sockets present its key pair (the cluster's processes)."""

    principal: str
    keys: KeyPair
    server_public: str
    serves: bool = False
    zk_auth: str = ""  # the ZooKeeper digest credential, for those who may read the cluster's state
    token: str = ""  # an HTTP bearer token of this principal (admin.json's), for `roq keys token`
    zk_tls: ZkTls | None = None  # ZooKeeper's TLS (CA, certificate, key); None: plain TCP


@dataclass(frozen=True)
class ClusterSecrets:
    """What `cluster.json` holds: the cluster's key pair and the principals it starts with."""

    keys: KeyPair
    principals: tuple[Principal, ...]  # the seed: the admin principal, every right on every queue
    zk_auth: str  # "user:password", the ZooKeeper digest credential of roq's znodes
    zk_tls: ZkTls | None = None  # None in a cluster.json written before ZooKeeper TLS

    def identity(self) -> Identity:
        return Identity(
            CLUSTER_PRINCIPAL, self.keys, self.keys.public, True, self.zk_auth, zk_tls=self.zk_tls
        )


class Gate:
    """The principals this process's servers accept, by public key, the cluster's own included.
    The ZAP thread asks `callback`; the owner replaces the whole table, never edits it in place.

    A socket's ZAP domain says what a client needs to connect at all (`access_domain`): "roq",
    any principal; "cluster", the cluster's own processes; "publish:q1", a principal that may
    publish to q1; "subscribe|consume:q1", one that may do either."""

    def __init__(self) -> None:
        self._by_key: Mapping[str, Principal] = {}
        self._cluster: Principal | None = None
        self.generation = 0  # bumped at each replacement

    def replace(self, principals: Iterable[Principal], cluster_key: str | None = None) -> None:
        if cluster_key is not None:
            self._cluster = Principal(CLUSTER_PRINCIPAL, cluster_key, superuser=True)
        table = {p.key: p for p in principals}
        if self._cluster is not None:
            table[self._cluster.key] = self._cluster
        # a token issued or dropped is the HTTP gateway's business, no change of a key's rights
        shrunk = any(_rights(table.get(key)) != _rights(old) for key, old in self._by_key.items())
        self._by_key = table
        self.generation += 1
        if shrunk:  # a key revoked or a grant narrowed: its open connections must go too
            _cutter.cut_soon()

    def principal(self, key: str) -> Principal | None:
        return self._by_key.get(key)

    def principals(self) -> list[Principal]:
        return [p for p in self._by_key.values() if not p.superuser]

    def callback(self, domain: str, key: bytes) -> bool:
        """pyzmq's credentials-provider interface: `key` is the client's Z85 public key."""
        principal = self._by_key.get(key.decode("ascii", "replace"))
        if principal is None:
            _log_refusal(key, domain, "a client key unknown to this cluster")
            return False
        if domain == ZAP_DOMAIN:
            return True
        if domain == CLUSTER_DOMAIN:
            allowed = principal.superuser
        else:
            permissions, _, queue = domain.partition(":")
            allowed = any(principal.allows(Permission(p), queue) for p in permissions.split("|"))
        if not allowed:
            _log_refusal(key, domain, f"principal {principal.name}")
        return allowed


def _rights(principal: Principal | None) -> object:
    # a topic grant is the HTTP gateway's business too: no ZeroMQ connection needs cutting
    return None if principal is None else (principal.queue_grants(), principal.superuser)


class _RefusalLog:
    """The refusal lines of one process. A refused client retries its connection every 100 ms
    or so: each (key, domain) is said once a minute. And a stranger holding the cluster's
    public key can try a new random key each time: at most `limits.refusal_log_lines_max` lines
    a minute in all, the rest counted and the count said with the next line after the minute.
    Called by the ZAP thread only."""

    def __init__(self) -> None:
        self.said: dict[tuple[bytes, str], float] = {}
        self.window_start = -1e9
        self.lines = 0  # said in the current window
        self.suppressed = 0  # not said since the last line

    def refused(self, key: bytes, domain: str, who: str, now: float) -> None:
        interval = limits.refusal_log_interval_s
        if now - self.said.get((key, domain), -1e9) < interval:
            return
        if now - self.window_start >= interval:
            self.window_start, self.lines = now, 0
        if self.lines >= limits.refusal_log_lines_max:
            self.suppressed += 1
            return
        if len(self.said) >= limits.refusal_log_keys_max:
            self.said.clear()
        self.said[(key, domain)] = now
        self.lines += 1
        log.warning("refused %s (socket domain %s); said once a minute", who, domain)
        if self.suppressed:
            log.warning("%d more refusals were not logged (at most %d lines a minute)",
                        self.suppressed, limits.refusal_log_lines_max)  # fmt: skip
            self.suppressed = 0


_refusals = _RefusalLog()


def _log_refusal(key: bytes, domain: str, who: str) -> None:
    _refusals.refused(key, domain, who, time.monotonic())


class _State:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.mode = "unset"  # "on", "off", or "unset" until the first socket needs to know
        self.identity: Identity | None = None
        self.gate = Gate()


_state = _State()


def use(identity: Identity, principals: Iterable[Principal] = ()) -> Gate:
    """Turn CURVE on for this process with `identity`; servers accept `principals` and, when
    `identity` serves, the cluster's own key (the super-user)."""
    with _state.lock:
        _state.mode, _state.identity = "on", identity
        _state.gate.replace(principals, identity.server_public if identity.serves else None)
    return _state.gate


def use_off(why: str) -> None:
    """No CURVE: every socket is open to anyone who can reach it. Logged as a warning."""
    with _state.lock:
        _state.mode, _state.identity = "off", None
    log.warning(
        "SECURITY IS OFF (%s): no socket authenticates or encrypts anything; anyone who can "
        "reach these ports can publish, read and administer every queue",
        why,
    )


def reset() -> None:
    """Forget the configuration (a process that serves several clusters in turn: tests, bench)."""
    with _state.lock:
        _state.mode, _state.identity = "unset", None
        _state.gate = Gate()


def enabled() -> bool:
    return _identity() is not None


def zk_auth() -> str | None:
    """The ZooKeeper digest credential to connect with; None with security off (or a principal
    that holds none: it then reads nothing of the cluster's, and must use --gcm)."""
    identity = _identity()
    return (identity.zk_auth or None) if identity is not None else None


def zk_tls() -> ZkTls | None:
    """The TLS material to open ZooKeeper sessions with; None for plain TCP: security off,
    credentials written before ZooKeeper TLS (or a principal's, which hold none), `zk.tls=false`
    in a daemon's configuration, or ROQ_ZK_TLS=off in the environment (docs/security.md §4)."""
    identity = _identity()
    if identity is None or os.environ.get(ZK_TLS_ENV, "").lower() == "off":
        return None
    return identity.zk_tls


def without_zk_tls(identity: Identity, why: str) -> Identity:
    """`identity` talking to ZooKeeper in plain TCP (zk.tls=false), logged as a warning."""
    if identity.zk_tls is not None:
        log.warning("ZOOKEEPER TLS IS OFF (%s): the ZooKeeper credential and every znode cross "
                    "the network in clear", why)  # fmt: skip
    return dataclasses.replace(identity, zk_tls=None)


def gate() -> Gate:
    return _state.gate


def _identity() -> Identity | None:
    """The identity in use; a client that configured nothing loads the credentials it finds."""
    with _state.lock:
        if _state.mode == "unset":
            if os.environ.get(SECURITY_ENV, "").lower() == "off":
                _state.mode = "off"
            else:
                _state.identity = load_credentials(find_credentials(None))
                _state.mode = "on"
        return _state.identity


def find_credentials(explicit: str | os.PathLike[str] | None) -> Path:
    """A client's credentials file: `explicit` (--credentials), else $ROQ_CREDENTIALS, else
    $ROQ_HOME/security/admin.json, else roq-data/security/admin.json (what `roq up` wrote)."""
    tried: list[Path] = []
    named = [explicit, os.environ.get(CREDENTIALS_ENV)]
    home = os.environ.get(HOME_ENV)
    candidates: list[str | os.PathLike[str] | None] = [
        *named,
        Path(home) / "security" / ADMIN_FILE if home else None,
        Path(limits.security_dir_default) / ADMIN_FILE,
    ]
    for candidate in candidates:
        if candidate is None or str(candidate) == "":
            continue
        path = Path(candidate)
        if path.is_file():
            return path
        tried.append(path)
        if candidate in named:
            break  # a file named by --credentials or ROQ_CREDENTIALS is meant, not a hint
    raise SecurityError(
        "no roq credentials found (looked for "
        + ", ".join(str(p) for p in tried)
        + "): run `roq up` once, pass --credentials FILE, or set ROQ_CREDENTIALS; "
        "ROQ_SECURITY=off talks to a cluster run with security=off"
    )


def _read_json(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as file:
            raw = file.read(limits.security_file_bytes_max + 1)
    except OSError as error:
        raise SecurityError(f"cannot read credentials {path}: {error.strerror}") from None
    if len(raw) > limits.security_file_bytes_max:
        raise SecurityError(f"credentials {path} is larger than any roq writes")
    try:
        doc = json.loads(raw)
    except ValueError as error:
        raise SecurityError(f"credentials {path} is not valid JSON: {error}") from None
    if not isinstance(doc, dict):
        raise SecurityError(f"credentials {path} is not a JSON object")
    return doc


def _key(doc: Mapping[str, Any], name: str, path: Path | str) -> str:
    value = doc.get(name)
    if not isinstance(value, str) or len(value) != 40:
        raise SecurityError(f"credentials {path}: '{name}' is not a 40-character Z85 key")
    return value


def load_credentials(path: Path) -> Identity:
    """A client's identity from its credentials file (`admin.json` or one `roq keys` wrote)."""
    doc = _read_json(path)
    principal = doc.get("principal")
    if not isinstance(principal, str) or not principal:
        raise SecurityError(f"credentials {path}: 'principal' is missing")
    keys = KeyPair(_key(doc, "public", path), _key(doc, "secret", path))
    zk_auth = doc.get("zk_auth", "")
    if not isinstance(zk_auth, str):
        raise SecurityError(f"credentials {path}: 'zk_auth' is not user:password")
    token = doc.get("token", "")  # none in files written before HTTP tokens, nor by `roq keys`
    if not isinstance(token, str):
        raise SecurityError(f"credentials {path}: 'token' is not a string")
    server = _key(doc, "server", path)
    return Identity(principal, keys, server, zk_auth=zk_auth, token=token,
                    zk_tls=_zk_tls(doc, path))  # fmt: skip


def _zk_tls(doc: Mapping[str, Any], path: Path | str) -> ZkTls | None:
    try:
        return decode_zk_tls(doc.get("zk_tls"), f"credentials {path}")
    except ValueError as error:
        raise SecurityError(str(error)) from None


def load_cluster(directory: Path) -> ClusterSecrets:
    path = directory / CLUSTER_FILE
    return parse_cluster(_read_json(path), path)


def read_cluster_doc(directory: Path) -> dict[str, Any]:
    """cluster.json under `directory` as its JSON object, checked as `load_cluster` checks it
    (`roq keys ssm-put` uploads it)."""
    path = directory / CLUSTER_FILE
    doc = _read_json(path)
    parse_cluster(doc, path)
    return doc


def parse_cluster(doc: Mapping[str, Any], path: Path | str) -> ClusterSecrets:
    """The cluster's secrets in a cluster.json's object; SecurityError naming `path` (a file, or
    where the object came from) when it is not one roq would write."""
    keys = KeyPair(_key(doc, "public", path), _key(doc, "secret", path))
    seeds = doc.get("principals", {})
    zk_auth = doc.get("zk_auth")
    if not isinstance(seeds, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in seeds.items()
    ):
        raise SecurityError(f"credentials {path}: 'principals' is not a map of key to name")
    if not isinstance(zk_auth, str) or ":" not in zk_auth:
        raise SecurityError(f"credentials {path}: 'zk_auth' is not user:password")
    tokens = _seed_tokens(doc, path)
    everything = {"": ALL_PERMISSIONS, TOPIC: ALL_PERMISSIONS}  # every queue, every topic
    seeded = (Principal(n, k, everything, tokens=tokens.get(n, ())) for k, n in seeds.items())
    return ClusterSecrets(keys, tuple(seeded), zk_auth, _zk_tls(doc, path))


def _seed_tokens(doc: Mapping[str, Any], path: Path | str) -> dict[str, tuple[str, ...]]:
    """cluster.json's `tokens`: principal name -> the digests of its HTTP tokens. A file written
    before HTTP tokens has none: its admin then gets one from `roq keys token admin`."""
    tokens = doc.get("tokens", {})
    if not isinstance(tokens, dict):
        raise SecurityError(f"credentials {path}: 'tokens' is not a map of name to digests")
    try:
        return {name: principal_table.decode_tokens(name, value) for name, value in tokens.items()}
    except ValueError as error:
        raise SecurityError(f"credentials {path}: 'tokens': {error}") from None


def write_private(path: Path, doc: Mapping[str, Any]) -> bool:
    """Write `doc` to `path` with mode 0600 unless the file exists; True when written. The file
    appears whole or not at all (a link from a private temporary), so a reader racing the
    writer, or two processes generating at once, never see half of one."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        with os.fdopen(descriptor, "w") as file:
            json.dump(doc, file, indent=2)
            file.write("\n")
        os.link(temporary, path)
    except FileExistsError:
        return False
    finally:
        temporary.unlink(missing_ok=True)
    return True


def generate(directory: Path) -> ClusterSecrets:
    """The cluster's secrets under `directory`, created on the first start: the cluster key
    pair, an admin principal with its own key pair and HTTP bearer token (admin.json, for `roq`
    commands; cluster.json seeds only the token's digest), the ZooKeeper digest credential, and
    ZooKeeper's TLS: a cluster CA's certificate with the node's certificate and key (cluster.json)
    and the admin's (admin.json). Files that exist are kept: a second start uses them."""
    cluster_path, admin_path = directory / CLUSTER_FILE, directory / ADMIN_FILE
    if not cluster_path.exists():
        cluster, admin = KeyPair.new(), KeyPair.new()
        zk_auth = f"roq:{KeyPair.new().secret}"  # 40 random Z85 characters, ~256 bits
        token = principal_table.new_token()  # the admin's for the HTTP gateway
        from roq.transport.certificates import new_cluster_tls  # `cryptography`: first starts

        node_tls, admin_tls = new_cluster_tls()
        written = write_private(
            cluster_path,
            {
                "public": cluster.public,
                "secret": cluster.secret,
                "principals": {admin.public: ADMIN_PRINCIPAL},
                "tokens": {ADMIN_PRINCIPAL: [principal_table.token_digest(token)]},
                "zk_auth": zk_auth,
                "zk_tls": node_tls.encode(),
            },
        )
        if written:
            admin_doc: dict[str, Any] = {"principal": ADMIN_PRINCIPAL, "server": cluster.public}
            admin_doc |= {**_pair(admin), "zk_auth": zk_auth, "token": token}
            admin_doc["zk_tls"] = admin_tls.encode()
            write_private(admin_path, admin_doc)
            log.warning(
                "generated this cluster's keys in %s (cluster.json: copy it to every GCM and "
                "host machine; admin.json: the admin credential for roq commands)",
                directory,
            )
    return load_cluster(directory)


def _pair(keys: KeyPair) -> dict[str, str]:
    return {"public": keys.public, "secret": keys.secret}


class _GateProvider:
    """The process's current gate, looked up at each handshake (`reset` replaces it)."""

    def callback(self, domain: str, key: bytes) -> bool:
        return _state.gate.callback(domain, key)


def principal_of(frame: Any) -> Principal | None:
    """The principal who sent `frame` (a message received with copy=False): the key ZAP
    checked, looked up in the gate now, so a revoked principal is None at its next request.
    With security off there is no principal: every request is the cluster's."""
    if _state.identity is None:
        return Principal(CLUSTER_PRINCIPAL, "", superuser=True)
    try:
        key = frame.get("User-Id")
    except zmq.ZMQError:
        return None
    return _state.gate.principal(key) if isinstance(key, str) else None


def write_principals(path: Path, principals: Iterable[Principal]) -> None:
    """The principal table for a host's children (no ZooKeeper of their own), replaced whole."""
    temporary = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            json.dump([p.encode() for p in principals], file)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):  # a full disk: leave no half-written table behind
            os.unlink(temporary)
        raise


def publish_principals(path: Path, principals: Iterable[Principal]) -> None:
    """For a host: write its children's table, or, when it cannot, remove the old one, so that
    the children deny every key but the cluster's (a stale table would let a revoked key pass)
    until the next change is written."""
    try:
        write_principals(path, principals)
    except OSError as error:
        log.error("principals file %s not written (%s): its monitors and exchanges refuse "
                  "every key but the cluster's until the next change is written",
                  path, error)  # fmt: skip
        try:
            path.unlink(missing_ok=True)
        except OSError as gone:
            log.error("principals file %s: the stale table could not be removed either (%s): "
                      "revocations do not reach this host's children", path, gone)  # fmt: skip


def read_principals(path: Path) -> list[Principal]:
    """The table a host wrote; a principal that does not decode is left out (denied).
    SecurityError when the file cannot be read whole or is no table: the caller then denies."""
    try:
        with path.open("rb") as file:
            raw = file.read(limits.principals_file_bytes_max + 1)
    except OSError as error:
        raise SecurityError(f"principals file {path}: cannot read it: {error}") from None
    if len(raw) > limits.principals_file_bytes_max:
        raise SecurityError(f"principals file {path} is larger than "
                            f"{limits.principals_file_bytes_max} bytes")  # fmt: skip
    try:
        docs = json.loads(raw)
    except (ValueError, RecursionError) as error:
        raise SecurityError(f"principals file {path} is not JSON: {error}") from None
    if not isinstance(docs, list):
        raise SecurityError(f"principals file {path} is not a list of principals")
    found = []
    for doc in docs:
        try:
            found.append(principal_table.decode(doc))
        except ValueError as error:
            log.warning("principals file %s: left out: %s", path, error)
    return found


class PrincipalsFile:
    """How a monitor or exchange follows its host's principals file: `check` reloads the gate
    when the file changed. Fails closed: a file that cannot be read or is no table, or one gone
    after it was read (its host could not write the last change), leaves only the cluster's key
    allowed, logged as an error once per state of the file; the next change is read again."""

    def __init__(self, path: Path, seed: Iterable[Principal], gate: Gate | None = None):
        self.path, self.seed = path, list(seed)
        self.gate = gate or _state.gate  # this process's, unless given one
        self.seen: tuple[int, int] | None = None  # the file's (mtime, size) last acted on
        self.denying = False

    def check(self) -> None:
        try:
            stat = self.path.stat()
        except FileNotFoundError:
            self._gone()
            return
        except OSError as error:
            self._deny(f"cannot look at it: {error}", None)
            return
        now = (stat.st_mtime_ns, stat.st_size)
        if now == self.seen:
            return
        try:
            table = read_principals(self.path)
        except SecurityError as error:
            self._deny(str(error), now)
            return
        self.gate.replace(table)  # the table: the seed no more
        self.seen, self.denying = now, False

    def _gone(self) -> None:
        if self.seen is None and not self.denying:
            self.gate.replace(self.seed)  # until the host writes it: cluster.json's
        elif not self.denying:
            self._deny("it is gone (its host could not write the last change)", None)

    def _deny(self, why: str, state: tuple[int, int] | None) -> None:
        if self.denying and state == self.seen:
            return  # said already; read again at the file's next change
        self.gate.replace([])
        self.seen, self.denying = state, True
        log.error("principals file %s: %s; every key but the cluster's is refused until it can "
                  "be read", self.path, why)  # fmt: skip


def follow_principals(path: Path, seed: Iterable[Principal]) -> threading.Thread:
    """A thread that reloads the gate from `path` whenever the file changes, every
    `limits.principals_poll_s`: how a monitor or exchange learns of grants and revocations."""
    follower = PrincipalsFile(path, seed)

    def run() -> None:
        while True:
            follower.check()
            time.sleep(limits.principals_poll_s)

    thread = threading.Thread(target=run, name="roq-principals", daemon=True)
    thread.start()
    return thread


class _Cutter:
    """Cuts the open connections of a process's server sockets when a key is revoked or a grant
    narrowed, so the revoked principal is out within `limits.revocation_cut_s`, not only at its
    next handshake. libzmq cannot drop one peer of a socket, and ZAP does not tell which
    connection a key came on; so every connection of every non-cluster server socket is shut
    down (the TCP connection, under libzmq's feet: it sees the peer go), and every client
    reconnects and passes ZAP again under the new table. The others lose what was in flight on
    that connection, as after any reconnection (docs/security.md §6).

    The sockets' monitors say which descriptors are accepted connections; a descriptor is shut
    down only if it is still a TCP connection on the socket's own port (a number reused by
    another socket of the process is left alone)."""

    _EVENTS = zmq.EVENT_ACCEPTED | zmq.EVENT_DISCONNECTED | zmq.EVENT_CLOSED
    # (a monitor's other events, MONITOR_STOPPED at the socket's close, carry no descriptor
    # of ours: DISCONNECTED and CLOSED only remove, so a stray value removes nothing)

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.handed: list[tuple[Any, int]] = []  # (monitor PAIR, port), from owner threads
        self.cut = threading.Event()
        self.thread: threading.Thread | None = None

    def watch(self, sock: Any, port: int) -> None:
        """From the socket's owner thread, before it binds: its monitor, handed to the cutter."""
        endpoint = f"inproc://roq-cut-{id(sock)}"
        sock.monitor(endpoint, self._EVENTS)
        events = sock.context.socket(zmq.PAIR)
        events.connect(endpoint)  # connected now, so no event is lost before the thread runs
        with self.lock:
            self.handed.append((events, port))
            if self.thread is None:
                self.thread = threading.Thread(target=self._run, name="roq-cutter", daemon=True)
                self.thread.start()

    def cut_soon(self) -> None:
        self.cut.set()

    def _run(self) -> None:
        open_fds: dict[Any, set[int]] = {}
        ports: dict[Any, int] = {}
        poller = zmq.Poller()
        while True:
            with self.lock:
                handed, self.handed = self.handed, []
            for events, port in handed:
                open_fds[events], ports[events] = set(), port
                poller.register(events, zmq.POLLIN)
            try:
                ready = dict(poller.poll(limits.poll_interval_ms))
                for events in ready:
                    self._track(events, open_fds)
            except zmq.ZMQError:
                # A context is terminating: it waits for these sockets, so let them all go (a
                # daemon binds in one context only, which is the one ending).
                for events in open_fds:
                    poller.unregister(events)
                    events.close(0)
                open_fds.clear()
                ports.clear()
                continue
            if self.cut.is_set():
                self.cut.clear()
                for events, fds in open_fds.items():
                    _shut_down(fds, ports[events])

    @staticmethod
    def _track(events: Any, open_fds: dict[Any, set[int]]) -> None:
        while events.poll(0):
            event = parse_monitor_message(events.recv_multipart())
            fd = int(event["value"])
            if event["event"] == zmq.EVENT_ACCEPTED:
                open_fds[events].add(fd)
            else:
                open_fds[events].discard(fd)


def _shut_down(fds: set[int], port: int) -> None:
    for fd in list(fds):
        try:
            with socket.fromfd(fd, socket.AF_INET, socket.SOCK_STREAM) as duplicate:
                if duplicate.getsockname()[1] != port:
                    fds.discard(fd)
                    continue
                duplicate.shutdown(socket.SHUT_RDWR)
        except OSError:
            fds.discard(fd)  # closed meanwhile


_cutter = _Cutter()


class _Context(zmq.Context):  # type: ignore[type-arg]
    """A context that stops its ZAP handler before it terminates (term() would wait for ever on
    the handler's own sockets otherwise)."""

    _roq_authenticator: Any = None

    def term(self) -> None:
        if self._roq_authenticator is not None:
            self._roq_authenticator.stop()
            self._roq_authenticator = None
        super().term()

    def __del__(self) -> None:
        """A context dropped without term(). pyzmq's finalizer destroys it: it closes every
        socket from whatever thread runs the collector, while their owners (the cutter, a
        leaked client thread) may be inside a call on them, and then terminates; a clean-clone
        CI run hung there for good, in a test that merely triggered the collection. Here it is
        terminated from a daemon thread instead: each owner sees ETERM and closes its own
        sockets (the cutter does); if one never does, only that thread waits."""
        if self.closed or getattr(self, "_shadow", False) or sys.is_finalizing():
            return
        threading.Thread(target=self._term_dropped, name="roq-context-term", daemon=True).start()

    def _term_dropped(self) -> None:
        try:
            self.term()
        except zmq.ZMQError:
            pass


def new_context() -> Any:
    return _Context()


def _authenticate(context: Any, domain: str) -> None:
    """Start the context's ZAP handler (once) and have it ask the gate for `domain`'s clients."""
    authenticator = getattr(context, "_roq_authenticator", None)
    if authenticator is None:
        if not isinstance(context, _Context):
            raise SecurityError("a server socket's context must come from new_context()")
        authenticator = ThreadAuthenticator(context, log=logging.getLogger("roq.transport.zap"))
        authenticator.start()
        context._roq_authenticator = authenticator
    # pyzmq keeps one provider per domain; the gate is read at each handshake, never copied
    authenticator.configure_curve_callback(domain, _GateProvider())


def access_domain(*permissions: Permission, queue: str = "", cluster: bool = False) -> str:
    """The ZAP domain of a server socket: who may connect to it at all. With permissions, a
    principal holding one of them on `queue`; with `cluster`, the cluster's own processes;
    with neither, any principal of the cluster."""
    if cluster:
        return CLUSTER_DOMAIN
    if not permissions:
        return ZAP_DOMAIN
    return "|".join(p.value for p in permissions) + f":{queue}"


def secure_server(sock: Any, endpoint: str, domain: str = ZAP_DOMAIN) -> None:
    """Before `sock` binds `endpoint`: present the cluster's key and admit the clients `domain`
    allows (`access_domain`)."""
    identity = _identity()
    if identity is None or not endpoint.startswith("tcp://"):
        return
    if not identity.serves:
        raise SecurityError(
            f"principal {identity.principal} holds no server key to bind {endpoint}"
        )
    _authenticate(sock.context, domain)
    sock.setsockopt(zmq.ZAP_DOMAIN, domain.encode())
    if domain != CLUSTER_DOMAIN:  # the cluster's own key is never revoked
        _cutter.watch(sock, int(endpoint.rpartition(":")[2]))
    sock.setsockopt(zmq.CURVE_SERVER, 1)
    sock.setsockopt(zmq.CURVE_SECRETKEY, identity.keys.secret.encode())


def secure_client(sock: Any, endpoint: str) -> None:
    """Before `sock` connects to `endpoint`: our key pair, and the key the server must hold."""
    identity = _identity()
    if identity is None or not endpoint.startswith("tcp://"):
        return
    sock.setsockopt(zmq.CURVE_SERVERKEY, identity.server_public.encode())
    sock.setsockopt(zmq.CURVE_PUBLICKEY, identity.keys.public.encode())
    sock.setsockopt(zmq.CURVE_SECRETKEY, identity.keys.secret.encode())


class HandshakeWatch:
    """The handshake failures of one client socket, read without blocking: a refused key shows
    here at once, where the socket itself would only stay silent (and retry for ever).

    A refusal by ZAP (AUTH) or a mechanism mismatch (PROTOCOL) is decisive at once. A failure
    without detail is what a wrong server key gives, but also a connection cut mid-handshake
    (a server cutting connections after a revocation, a restart): it is decisive only when
    `limits.handshake_failures_undetailed` come in a row, with no success between."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self.events: Any = sock.get_monitor_socket(
            _HANDSHAKE_FAILED | zmq.EVENT_HANDSHAKE_SUCCEEDED
        )
        self._undetailed = 0

    def failure(self) -> str | None:
        """Why handshakes fail, once that is certain; None while it is not."""
        while self.events.poll(0):
            event = parse_monitor_message(self.events.recv_multipart())
            if event["event"] == zmq.EVENT_HANDSHAKE_SUCCEEDED:
                self._undetailed = 0
            elif event["event"] != zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL:
                return _describe(event)
            else:
                self._undetailed += 1
                if self._undetailed >= limits.handshake_failures_undetailed:
                    return _describe(event)
        return None

    def close(self) -> None:
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass  # the socket is closed already
        self.events.close(0)


def _describe(event: Mapping[str, Any]) -> str:
    endpoint = bytes(event.get("endpoint", b"")).decode(errors="replace")
    identity = _state.identity
    who = f"principal {identity.principal}" if identity else "this client (security off)"
    if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH:
        return f"{endpoint} refused {who}: its key is not allowed by this cluster"
    if event["event"] == zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL:
        return (
            f"{endpoint} and {who} do not speak the same security mechanism "
            "(is one side running with security=off?)"
        )
    return (
        f"{endpoint} did not prove it holds the cluster key {who} expects "
        "(credentials of another cluster?)"
    )


def watch(sock: Any) -> HandshakeWatch:
    """A watch on `sock`'s handshakes, with security on or off: a client running without it
    against a cluster with it fails its handshake too, and must hear so."""
    return HandshakeWatch(sock)
