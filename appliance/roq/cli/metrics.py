"""`roq metrics scrape-config` and `roq health`: the cluster's metrics and health listeners, found
in ZooKeeper (`<ns>/metrics`, coordination/targets.py), as a Prometheus scrape configuration,
or checked one by one (docs/operations.md, "Metrics" and "Health")."""

from __future__ import annotations

import json
import ssl
import urllib.error
import urllib.request
from pathlib import Path
from typing import TYPE_CHECKING

import typer

from roq import limits
from roq.cli.app import app
from roq.cli.common import errors_to_exit, fail, table
from roq.errors import EXIT_UNAVAILABLE, CoordinationError

if TYPE_CHECKING:
    from roq.coordination.targets import Target

metrics_app = typer.Typer(help="Prometheus metrics of the cluster.", no_args_is_help=True)
app.add_typer(metrics_app, name="metrics", rich_help_panel="Operations")

ZK = typer.Option("127.0.0.1:2181", "--zk", help="ZooKeeper connect string of the cluster.")
NAMESPACE = typer.Option("/roq", "--namespace", help="The cluster's zk.namespace.")
JOBS = {"gcm": "roq-gcm", "host": "roq-host", "http": "roq-http"}


def _targets(zk: str, namespace: str) -> list[Target]:
    from roq.coordination import session
    from roq.coordination.paths import Paths
    from roq.coordination.targets import read_targets
    from roq.transport import security

    client = session.connect(
        zk,
        limits.zk_client_session_ms,
        connect_timeout_s=5.0,
        auth=security.zk_auth(),
        tls=security.zk_tls(),
    )
    try:
        found = read_targets(client, Paths(namespace))
    finally:
        session.close(client)
    if not found:
        raise CoordinationError(
            f"no metrics listener is registered under {namespace} at {zk}: set metrics.port "
            "(GCM) and hcm.metrics.port (host), which roq up sets"
        )
    return found


def _quoted(text: str) -> str:
    """A YAML double-quoted scalar (JSON's string syntax is one)."""
    return json.dumps(text)


def scrape_yaml(
    targets: list[Target], interval_s: int, cluster: str, token_file: Path | None
) -> str:
    """A Prometheus configuration scraping `targets`: one job per role, `cluster` a label of
    every series. The gateways' job needs `token_file` (their /metrics wants a bearer token)."""
    lines = [
        f"# Written by `roq metrics scrape-config` for the cluster {cluster}: its listeners as",
        "# ZooKeeper named them then (run it again after adding a host or a GCM).",
        "global:",
        f"  scrape_interval: {interval_s}s",
        f"  scrape_timeout: {min(interval_s, 10)}s",
        "scrape_configs:",
    ]
    for role, job in JOBS.items():
        mine = [t for t in targets if t.role == role]
        if not mine:
            continue
        if role == "http" and token_file is None:
            lines.append(f"  # {job} left out: its /metrics wants a token (--token-file)")
            continue
        lines += [f"  - job_name: {_quoted(job)}", f"    scheme: {mine[0].scheme}"]
        if role == "http":
            lines += ["    authorization:", f"      credentials_file: {_quoted(str(token_file))}"]
        addresses = ", ".join(_quoted(t.address) for t in mine)
        lines += [
            "    static_configs:",
            f"      - targets: [{addresses}]",
            f"        labels: {{cluster: {_quoted(cluster)}}}",
        ]
    return "\n".join(lines) + "\n"


@metrics_app.command("scrape-config")
def scrape_config(
    zk: str = ZK,
    namespace: str = NAMESPACE,
    out: Path | None = typer.Option(None, "--out", "-o", help="Write it here (default: stdout)."),
    interval: int = typer.Option(
        15, "--interval", min=1, max=3600, help="scrape_interval in seconds."
    ),
    token_file: Path | None = typer.Option(
        None,
        "--token-file",
        help="A file holding a bearer token (roq keys token): the HTTP gateways' /metrics "
        "wants one; without it they are left out.",
    ),
) -> None:
    """Write a Prometheus configuration that scrapes every GCM, host (its monitors' and
    exchanges' series included) and HTTP gateway of the cluster, as registered in ZooKeeper."""
    with errors_to_exit():
        text = scrape_yaml(_targets(zk, namespace), interval, namespace,
                           token_file.resolve() if token_file else None)  # fmt: skip
    if out is None:
        typer.echo(text, nl=False)
        return
    out.write_text(text, encoding="utf-8")
    typer.echo(f"wrote {out}")


def check(url: str, timeout_s: float) -> tuple[bool, str]:
    """Whether `url` answers 200, and its first line (or why it did not answer)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout_s,  # noqa: S310 (http and https only)
                                    context=ssl.create_default_context()) as response:  # fmt: skip
            return True, _first_line(response.read(4096))
    except urllib.error.HTTPError as error:
        return False, f"{error.code}: {_first_line(error.read(4096))}"
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        return False, f"no answer: {reason}"


def _first_line(body: bytes) -> str:
    lines = body.decode("utf-8", "replace").strip().splitlines()
    more = f" (+{len(lines) - 1} more)" if len(lines) > 1 else ""
    return (lines[0][:200] if lines else "") + more


@app.command(rich_help_panel="Operations")
def health(
    zk: str = ZK,
    namespace: str = NAMESPACE,
    url: list[str] = typer.Option(
        [],
        "--url",
        help="Check this listener (http://host:port) instead of those ZooKeeper "
        "names (repeatable): works while ZooKeeper is down.",
    ),
    live: bool = typer.Option(
        False,
        "--live",
        help="Ask /healthz (the process runs and its loop turns) rather than /readyz (it serves).",
    ),
) -> None:
    """Ask every GCM, host and HTTP gateway of the cluster whether it is ready (/readyz); exit 0
    if all are, 69 if any is not or does not answer."""
    path = "/healthz" if live else "/readyz"
    for given in url:
        if not given.startswith(("http://", "https://")):
            raise fail(f"--url {given}: expected http://host:port or https://host:port", 2)
    with errors_to_exit():
        if url:
            rows = [("-", u.rstrip("/"), u.rstrip("/")) for u in url]
        else:
            rows = [(t.role, t.name, f"{t.scheme}://{t.address}") for t in _targets(zk, namespace)]
    results = [(row, check(row[2] + path, limits.health_check_timeout_ms / 1000)) for row in rows]
    typer.echo(table(["ROLE", "NAME", "URL", "STATE", "DETAIL"], [
        (role, name, base, "ok" if good else "FAIL", detail)
        for (role, name, base), (good, detail) in results
    ]))  # fmt: skip
    failed = sum(1 for _, (good, _) in results if not good)
    if failed:
        raise fail(f"{failed} of {len(results)} not {'alive' if live else 'ready'}",
                   EXIT_UNAVAILABLE)  # fmt: skip
