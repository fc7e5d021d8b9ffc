"""Every long-running mode, one command each: `roq gcm`, `roq host`, `roq up`, `roq http`, and the
`roq monitor` and `roq exchange` that a host starts as its children."""

from __future__ import annotations

import asyncio
import faulthandler
import logging
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

import typer

from roq import config, limits
from roq.cli.app import app
from roq.cli.common import (
    CONFIG_OPTION,
    DEFINE_OPTION,
    errors_to_exit,
    serving,
    setup_logging,
    stop_event,
)
from roq.cli.logformat import use_log_format
from roq.errors import EXIT_FAILURE, EXIT_FENCED, EXIT_RETIRED
from roq.system import notify


@app.command(rich_help_panel="Daemons")
def gcm(
    config_file: Path | None = CONFIG_OPTION,
    define: list[str] = DEFINE_OPTION,
) -> None:
    """Run a Global Configuration Manager (topology, admin API, config broadcast).

    Several may run against one ZooKeeper: one leads, the others stand by.
    """
    setup_logging()
    stop = stop_event()
    with errors_to_exit():
        loaded = config.load_gcm(
            config_file or config.home_file("GCM.properties"), config.parse_overrides(define)
        )
        _log_format(loaded, "gcm")
        settings = config.GcmSettings.from_settings(loaded)
        secure(settings.security, generate=True)
        from roq.gcm.service import GlobalConfigurationManager

        manager = GlobalConfigurationManager(settings)
        _stop_deadline(stop, f"gcm {manager.id}")
        _serve(manager, f"gcm {manager.id}", stop)


def _stop_deadline(stop: threading.Event, name: str) -> None:
    """A GCM keeps no data of its own: once told to stop it is gone within
    `limits.gcm_stop_deadline_s`, whatever it waits for. Killed with its ZooKeeper (`roq up`
    killed), a request it was serving waited 10 s per ZooKeeper call and the GCM outlived
    roq up by over 15 s. Past the deadline it logs every thread's stack and exits 1."""

    def watch() -> None:
        stop.wait()
        time.sleep(limits.gcm_stop_deadline_s)
        logging.getLogger("roq").warning(
            "%s: not stopped %.0f s after the request to stop; exiting now (stacks below)",
            name, limits.gcm_stop_deadline_s,
        )  # fmt: skip
        faulthandler.dump_traceback(all_threads=True)
        os._exit(EXIT_FAILURE)

    threading.Thread(target=watch, name="roq-stop-deadline", daemon=True).start()


@app.command(rich_help_panel="Daemons")
def host(
    config_file: Path | None = CONFIG_OPTION,
    define: list[str] = DEFINE_OPTION,
) -> None:
    """Run a Host Configuration Manager: registers this machine, runs monitors and exchanges."""
    setup_logging()
    stop = stop_event()
    with errors_to_exit():
        loaded = _hcm(config_file, define, home=True)
        settings = config.HostSettings.from_settings(loaded)
        _log_format(loaded, "host", host=settings.name or settings.interface)
        _check_log_directory(settings)
        secure(settings.security, generate=True)
        from roq.host.service import HostConfigManager

        manager = HostConfigManager(settings)
        _serve(manager, f"host {manager.name}", stop)


class _Manager(Protocol):
    def bind(self) -> None: ...
    def run(self, stop: threading.Event, on_ready: Callable[[], object]) -> None: ...
    def close(self) -> None: ...


def _serve(manager: _Manager, name: str, stop: threading.Event) -> None:
    """A GCM's or host's life: bind its sockets, serve until SIGTERM (telling systemd when it is
    ready and when it stops), close. `stop` is made first thing in the command: a SIGTERM while
    the daemon still imports, loads keys or binds (seconds on a loaded machine, past
    supervisord's startsecs) is a stop like any other, not Python's default death by signal."""
    # A missed watchdog ends the process with SIGABRT: every thread's stack goes to the journal
    # first, so the stuck loop shows where it is stuck.
    faulthandler.enable()
    try:
        manager.bind()
        with serving(name):
            manager.run(stop, on_ready=lambda: notify.ready(f"{name} serving"))
        notify.stopping()
    finally:
        manager.close()


class _Child(Protocol):
    def run(self, stop: threading.Event) -> None: ...
    def close(self) -> None: ...


def _serve_child(server: _Child, name: str, context: Any) -> None:
    """A monitor's or exchange's life: serve until SIGTERM, close it and then its context."""
    try:
        with serving(name):
            server.run(stop_event())
    finally:
        server.close()
        context.term()


def _hcm(config_file: Path | None, define: list[str], home: bool = False) -> config.Settings:
    """HCM.properties: `config_file`, or with `home` (a daemon an operator starts: roq host,
    roq http) $ROQ_HOME/config/HCM.properties. A host's children never look there: the host
    hands them its settings (-D), which a file it did not read must not change."""
    if home and config_file is None:
        config_file = config.home_file("HCM.properties")
    return config.load_hcm(config_file, config.parse_overrides(define))


def _log_format(settings: config.Settings, process: str, **fields: str) -> None:
    """log.format as soon as the daemon's settings are read: its every later line in it."""
    use_log_format(config.LoggingSettings.from_settings(settings).format, process, **fields)


def secure(settings: config.SecuritySettings, *, generate: bool, lease: str = "") -> None:
    """CURVE for this daemon with the cluster's key pair (docs/security.md). A GCM or host that
    finds no cluster.json writes one (the first start of a cluster); a monitor or exchange uses
    its host's, which exists by then, and follows the principal table its host writes beside
    its lease (a GCM or host follows ZooKeeper's: client/credentials.py)."""
    from roq.client.credentials import principals_file
    from roq.protocol.principals import reserve_gateway_queues
    from roq.transport import security

    reserve_gateway_queues(settings.gateway_queue_prefix)
    if not settings.enabled:
        security.use_off("security=off in the configuration")
        return
    directory = Path(settings.directory)
    secrets = security.generate(directory) if generate else security.load_cluster(directory)
    identity = secrets.identity()
    if not settings.zk_tls:
        identity = security.without_zk_tls(identity, "zk.tls=false in the configuration")
    security.use(identity, secrets.principals)
    table = principals_file(lease)
    if table is not None:
        security.follow_principals(table, secrets.principals)


def _check_log_directory(settings: config.HostSettings) -> None:
    if not settings.use_log:
        return
    from roq.errors import EXIT_CANTCREAT, RoqError

    directory = Path(settings.log_root)
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / ".roq-write-test"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as error:
        err = RoqError(f"log directory {directory} is not writable: {error.strerror}")
        err.exit_code = EXIT_CANTCREAT
        raise err from None


@app.command(rich_help_panel="Daemons")
def http(
    config_file: Path | None = CONFIG_OPTION,
    define: list[str] = DEFINE_OPTION,
    if_enabled: bool = typer.Option(
        False, "--if-enabled", help="Exit 0 at once when http.enabled is false (systemd unit)."
    ),
) -> None:
    """Run the HTTP gateway: the mq API (topics, publish, get, ack) on http.port.

    /v1: the mq seed's API (200; 230 message evicted; 231 no message; 400 with a reason).

    /v2: the same, plus batch publish, a long-polling get, application/problem+json errors.

    GET /metrics: counters in the Prometheus text format.

    Messages are stored in roq queues (http.queue.prefix-N, created when missing).

    Topics, owners, heads and subscriber positions are in the state logs of those queues'
    monitors (delivery.state=log; zookeeper keeps them in ZooKeeper): gateways agree.

    Each gateway keeps a snapshot of its index under directory/.http-PORT: it starts from it.

    Every call shows a principal's bearer token (roq keys token); http.tls.cert/key: HTTPS.

    Reads HCM.properties: http.*, maxQueueSize, maxNameLen, maxMsgSize, maxTopics, ...

    SIGTERM or Ctrl-C: exit 0. Exit 75: http.port taken; 78: bad configuration (TLS files too);

    69: ZooKeeper or the GCM unreachable. See docs/http.md.
    """
    setup_logging()
    with errors_to_exit():
        loaded = _hcm(config_file, define, home=True)
        _log_format(loaded, "http")
        settings = config.HttpSettings.from_settings(loaded)
        if if_enabled and not settings.enabled:
            typer.echo("roq http: http.enabled=false; not serving", err=True)
            return
        secure(settings.security, generate=False)
        from roq.http.service import run

        stop = stop_event()  # uvicorn calls these handlers again once it has stopped
        faulthandler.enable()  # as _serve: the stacks of a gateway its watchdog ends
        with serving("http gateway"):
            run(settings, on_ready=_http_ready, stopping=stop)
        notify.stopping()


_beating: set[asyncio.Task[None]] = set()  # the watchdog task (a task needs a reference)


def _http_ready(where: str) -> None:
    """Called on the gateway's event loop once it serves: READY=1, then systemd's watchdog
    beaten by a task of that loop, which a blocked loop stops running."""
    notify.ready(f"http gateway serving on {where}")
    _beating.add(asyncio.get_running_loop().create_task(notify.keep_alive_while_the_loop_turns()))


@app.command(rich_help_panel="Daemons")
def up(
    data_dir: Path = typer.Option(Path("roq-data"), "--data-dir", help="All state goes here."),
    gcm_config: Path | None = typer.Option(None, "--gcm-config", help="GCM.properties to use."),
    hcm_config: Path | None = typer.Option(None, "--hcm-config", help="HCM.properties to use."),
    port_base: int | None = typer.Option(
        None,
        "--port-base",
        min=1024,
        max=60000,
        help="Every port of this cluster from here (ZooKeeper, GCM, host, monitors, exchanges, "
        "HTTP; see docs/operations.md): a second cluster beside the first in one option. "
        "-D keys still win.",
    ),
    define: list[str] = DEFINE_OPTION,
) -> None:
    """Run a one-machine cluster in the foreground: ZooKeeper (if none is reachable), a GCM and
    a host. Ctrl-C or SIGTERM stops all of it."""
    setup_logging()
    from roq.local.up import Cluster, port_keys

    with errors_to_exit():
        overrides = {**port_keys(port_base), **config.parse_overrides(define)}
        cluster = Cluster(data_dir, gcm_config, hcm_config, overrides)
        use_log_format(cluster.settings.logging.format, "up", host=cluster.settings.host_name)
        stop = stop_event()
        try:
            cluster.start(stop)
            typer.echo(cluster.banner())
            cluster.wait(stop)
        finally:
            cluster.stop()


LEASE_OPTION = typer.Option(
    "",
    "--lease",
    help="The host's lease file (fencing): act only while it is valid. Empty: always act.",
)


EPOCH_OPTION = typer.Option(
    0,
    "--epoch",
    min=0,
    help="The queue's assignment epoch (from ZooKeeper): the monitor's messages carry it, an "
    "exchange refuses a monitor's messages of an older one.",
)


@app.command(rich_help_panel="Daemons (started by roq host)")
def monitor(
    queue: str = typer.Argument(..., help="Logical queue this monitor serves."),
    bind: str = typer.Option("127.0.0.1", "--bind", help="Address to bind."),
    port: int = typer.Option(..., "--port", help="Base port B (B..B+5)."),
    stat_port: int = typer.Option(..., "--stat-port", help="Stat port S (S, S+1)."),
    lease: str = LEASE_OPTION,
    epoch: int = EPOCH_OPTION,
    config_file: Path | None = CONFIG_OPTION,
    define: list[str] = DEFINE_OPTION,
) -> None:
    """Run a queue's monitor: exchange liveness, publisher placement and re-allocation, KPIs."""
    setup_logging()
    with errors_to_exit():
        loaded = _hcm(config_file, define)
        settings = config.MonitorSettings.from_settings(loaded)
        _log_format(loaded, "monitor", host=settings.host_name or bind, queue=queue)
        secure(settings.security, generate=False, lease=lease)
        from roq.monitor.service import Monitor
        from roq.transport import new_context

        context = new_context()
        server = Monitor(context, queue, bind, port, stat_port, settings, lease=lease, epoch=epoch)
        _serve_child(server, f"monitor {queue}", context)
        if server.fenced_out:  # its host decides, from ZooKeeper, whether it starts again
            raise typer.Exit(EXIT_FENCED)


@app.command(rich_help_panel="Daemons (started by roq host)")
def exchange(
    queue: str = typer.Argument(..., help="Logical queue this exchange belongs to."),
    bind: str = typer.Option("127.0.0.1", "--bind", help="Address to bind."),
    port: int = typer.Option(..., "--port", help="Front port F (F..F+3)."),
    monitor_endpoint: str = typer.Option(..., "--monitor", help="tcp://IP:B of the monitor."),
    stat: str = typer.Option(..., "--stat", help="tcp://IP:S of the stat monitor."),
    exchange_id: str = typer.Option(..., "--id", help="Exchange id (unique in the cluster)."),
    keeper: bool = typer.Option(
        False,
        "--keeper",
        help="Keep the log of this lost exchange for reads and re-copying; take no publishers.",
    ),
    follower: bool = typer.Option(
        False,
        "--follower",
        help="A log follower (log.followers): hold copies of the queue's logs that its "
        "monitor assigns; take no publishers and no subscribers' stream.",
    ),
    lease: str = LEASE_OPTION,
    epoch: int = EPOCH_OPTION,
    config_file: Path | None = CONFIG_OPTION,
    define: list[str] = DEFINE_OPTION,
) -> None:
    """Run an exchange: receives publishers' batches and fans them out to subscribers. With
    --keeper, the log keeper of an exchange lost with its host, started by that host when it
    returns: it serves reads of the log and its copies until live exchanges hold them. With
    --follower, a log follower, started for log.followers: it holds copies, nothing else."""
    setup_logging()
    with errors_to_exit():
        loaded = _hcm(config_file, define)
        settings = config.ExchangeSettings.from_settings(loaded)
        _log_format(loaded, "exchange", host=settings.host_name or bind, queue=queue,
                    exchange=exchange_id)  # fmt: skip
        secure(settings.security, generate=False, lease=lease)
        from roq.exchange.service import Exchange, ExchangeSpec
        from roq.transport import new_context

        if keeper and follower:
            raise ValueError("--keeper and --follower: an exchange is one or the other")
        spec = ExchangeSpec(
            queue, exchange_id, bind, port, monitor_endpoint, stat, lease, epoch, keeper, follower
        )
        context = new_context()
        server = Exchange(context, spec, settings)
        _serve_child(server, spec.name, context)
        if server.retired:  # a keeper whose logs live exchanges hold: its host restarts none
            raise typer.Exit(EXIT_RETIRED)
        if server.fenced_out:  # its host decides, from ZooKeeper, whether it starts again
            raise typer.Exit(EXIT_FENCED)
