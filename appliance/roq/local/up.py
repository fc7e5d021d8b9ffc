"""`roq up`: a one-machine cluster in the foreground — ZooKeeper when none is reachable, one GCM
and one host as child processes, all state under one data directory. Stopping it (Ctrl-C,
SIGTERM) stops the host (which stops its monitors and exchanges), the GCM, then ZooKeeper.

With `http.enabled` (the default) it also starts the HTTP gateway (`roq http`, on `http.port`)
once the host is registered, and supervises it like the others.

Once up, it supervises what it started: a GCM, host, gateway or ZooKeeper that dies is started again
after a back-off (doubling, logged), and the restarted host re-adopts its queues from ZooKeeper
(host/adoption.py). Only a configuration error (exit 78) stops everything: it would recur.
Started again on the same data directory, `roq up` resumes the same cluster: the queues come
back with their logs."""

from __future__ import annotations

import fcntl
import logging
import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from roq import config, limits
from roq.backoff import backoff_s
from roq.client.admin import AdminClient
from roq.errors import EXIT_CONFIG, EXIT_TEMPFAIL, ConfigError, RoqError
from roq.local.zkserver import ZooKeeperServer, first_reachable
from roq.protocol.ports import GcmPort, port_at
from roq.system.spawn import child_environment, die_with_parent, roq_command
from roq.transport import security

log = logging.getLogger(__name__)


class ClusterFailed(RoqError):
    pass


class DataDirInUse(RoqError):
    """Another `roq up` runs on this data directory: a second one would start a second GCM and
    host under the same name, which restart each other's children for ever."""

    exit_code = EXIT_TEMPFAIL


def lock_data_dir(data_dir: Path) -> object:
    """Hold `<data_dir>/up.pid` locked for this process's life (the lock dies with it, kill -9
    included) and write our pid in it; raises DataDirInUse, naming the holder, if taken."""
    handle = (data_dir / "up.pid").open("a+")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.seek(0)
        holder = handle.read().strip() or "unknown"
        handle.close()
        raise DataDirInUse(
            f"another roq up (pid {holder}) runs on {data_dir}: stop it first, or give this "
            "one another --data-dir"
        ) from None
    handle.seek(0)
    handle.truncate()
    handle.write(f"{os.getpid()}\n")
    handle.flush()
    return handle


@dataclass
class Restarts:
    """The restart schedule of one supervised process."""

    started_at: float = 0.0
    failures: int = 0
    due: float | None = None  # when to start it again; None while it runs

    def died(self, now: float) -> float:
        """Schedule the restart; returns the back-off in seconds."""
        if now - self.started_at > limits.up_stable_after_s:
            self.failures = 0
        self.failures += 1
        delay = backoff_s(
            self.failures, limits.up_restart_backoff_s_min, limits.up_restart_backoff_s_max
        )
        self.due = now + delay
        return delay


UMASK = 0o077  # roq up's and its children's (the units' UMask is 0027: group roq reads)

# Where each kind of port starts, from `roq up --port-base N` (the defaults' layout from 5000;
# ZooKeeper and the HTTP gateway, which default elsewhere, just under the host's port; the GCM's
# and the host's metrics listeners at +70 and +110)
PORT_OFFSETS = {
    "ports.base": 0, "metrics.port": 70, "zk.servers": 90, "http.port": 80, "hcm.port": 100,
    "hcm.metrics.port": 110, "monitor.base.port": 500, "statmonitor.base.port": 800,
    "exchange.base.port": 1000,
}  # fmt: skip
DEFAULT_BASE = 5000  # ports.base's default: the layout PORT_OFFSETS repeats


def metrics_ports(
    settings: config.UpSettings, gcm_over: dict[str, str], hcm_over: dict[str, str]
) -> bool:
    """Without --port-base, on the default layout (ports.base 5000, hcm.port 5100), `roq up`
    serves metrics too, at 5070 and 5110, unless a file or -D sets them (0: none). Not on a
    layout of one's own, where those ports may be another's: set the two keys there. Whether
    any key was added."""
    default = settings.gcm_ports_base == DEFAULT_BASE and (
        settings.hcm_port == DEFAULT_BASE + PORT_OFFSETS["hcm.port"]
    )
    changed = False
    for key, over, value in (
        ("metrics.port", gcm_over, settings.gcm_metrics_port),
        ("hcm.metrics.port", hcm_over, settings.host_metrics_port),
    ):
        if default and value == 0 and key not in over:
            over[key] = str(DEFAULT_BASE + PORT_OFFSETS[key])
            changed = True
    return changed


def port_keys(base: int | None) -> dict[str, str]:
    """The port keys of a cluster whose ports start at `base` ({} for None: the defaults)."""
    if base is None:
        return {}
    keys = {key: str(base + offset) for key, offset in PORT_OFFSETS.items()}
    keys["zk.servers"] = f"127.0.0.1:{keys['zk.servers']}"
    return keys


def split_overrides(overrides: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    gcm_names = {key.name for key in config.GCM_KEYS}
    hcm_names = {key.name for key in config.HCM_KEYS}
    for name in overrides:
        if name not in gcm_names | hcm_names:
            raise ConfigError(f"command line: unknown key '{name}'")
    return (
        {k: v for k, v in overrides.items() if k in gcm_names},
        {k: v for k, v in overrides.items() if k in hcm_names},
    )


class Cluster:
    def __init__(
        self,
        data_dir: Path,
        gcm_config: Path | None,
        hcm_config: Path | None,
        overrides: dict[str, str],
    ):
        self.data_dir = data_dir.resolve()
        gcm_over, hcm_over = split_overrides(overrides)
        hcm_over.setdefault("directory", str(self.data_dir / "log"))
        # The cluster's secrets live with the rest of its state (both daemons need the same).
        for over in (gcm_over, hcm_over):
            over.setdefault("security.dir", str(self.data_dir / "security"))
        self.settings = config.UpSettings.from_settings(
            config.load_gcm(gcm_config, gcm_over), config.load_hcm(hcm_config, hcm_over)
        )
        if metrics_ports(self.settings, gcm_over, hcm_over):
            self.settings = config.UpSettings.from_settings(
                config.load_gcm(gcm_config, gcm_over), config.load_hcm(hcm_config, hcm_over)
            )
        self._gcm_args = self._args(gcm_config, gcm_over)
        self._hcm_args = self._args(hcm_config, hcm_over)
        self.zookeeper: ZooKeeperServer | None = None
        self._lock: object | None = None  # the data directory's, from start() on
        self.processes: dict[str, subprocess.Popen[bytes]] = {}
        self.restarts: dict[str, Restarts] = {
            mode: Restarts() for mode in ("zookeeper", "gcm", "host", "http")
        }
        # what `roq up` supervises, with the arguments each is started with
        self.modes = {"gcm": self._gcm_args, "host": self._hcm_args}

    @staticmethod
    def _args(path: Path | None, overrides: dict[str, str]) -> list[str]:
        args = ["--config", str(path)] if path is not None else []
        for name, value in overrides.items():
            args += ["-D", f"{name}={value}"]
        return args

    @property
    def zk_servers(self) -> str:
        return self.settings.zk_servers

    def start(self, stop: threading.Event) -> None:
        # What roq up and its children create (ZooKeeper's files, logs, keys) is the user's
        # alone: directories 0700, files 0600 (they were 0755 and 0644).
        os.umask(UMASK)
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock = lock_data_dir(self.data_dir)  # held until this process exits
        self._secure()
        self._ensure_zookeeper()
        self._spawn("gcm", self._gcm_args)
        self._spawn("host", self._hcm_args)
        self._wait_ready(stop)
        if self.settings.http_enabled and not stop.is_set():
            # after the host: the gateway creates its queue, which needs a host to place it
            self.modes["http"] = self._hcm_args
            self._spawn("http", self._hcm_args)

    def _secure(self) -> None:
        """Generate the cluster's keys on the first start (the GCM and the host then find them),
        and talk to the GCM as the cluster's own process."""
        settings = self.settings.security
        if not settings.enabled:
            security.use_off("security=off in the configuration")
            return
        secrets = security.generate(Path(settings.directory))
        identity = secrets.identity()
        if not settings.zk_tls:
            identity = security.without_zk_tls(identity, "zk.tls=false in the configuration")
        security.use(identity, secrets.principals)

    def _ensure_zookeeper(self) -> None:
        servers, tls = self.zk_servers, security.zk_tls()
        if first_reachable(servers, tls):
            log.info("using the ZooKeeper at %s%s", servers, " over TLS" if tls else "")
            return
        if tls is not None and first_reachable(servers):
            raise ClusterFailed(f"the ZooKeeper at {servers} does not speak TLS: stop it, or "
                                "use it with -D zk.tls=false (traffic in clear)")  # fmt: skip
        host, _, port = servers.split(",")[0].partition(":")
        if host not in ("127.0.0.1", "localhost") or not port.isdigit():
            raise ClusterFailed(f"ZooKeeper at {servers} is not reachable")
        log.info("no ZooKeeper at %s: starting one under %s", servers, self.data_dir)
        self.zookeeper = ZooKeeperServer(self.data_dir / "zookeeper", int(port), tls=tls)
        self.zookeeper.start()
        overrides = ["-D", f"zk.servers={self.zookeeper.connect_string}"]
        # Its own ZooKeeper serves this cluster alone: the GCM closes its root to strangers.
        closed = ["-D", "zk.close.root=true"] if self.settings.security.enabled else []
        self._gcm_args += [*overrides, *closed]
        self._hcm_args += overrides
        self.modes = {"gcm": self._gcm_args, "host": self._hcm_args}

    def _spawn(self, mode: str, args: list[str]) -> None:
        self.restarts[mode].started_at = time.monotonic()
        self.processes[mode] = subprocess.Popen(
            roq_command(mode, *args),
            env=child_environment(),
            stdin=subprocess.DEVNULL,
            preexec_fn=die_with_parent,  # noqa: PLW1509
        )

    def _wait_ready(self, stop: threading.Event) -> None:
        deadline = time.monotonic() + limits.up_ready_timeout_s
        host_name = self.settings.host_name
        with AdminClient(gcm=self.gcm_address, timeout_ms=1000, retries=1) as admin:
            while time.monotonic() < deadline and not stop.is_set():
                self._check_alive()
                try:
                    hosts = admin.status().hosts
                    if any(host_name in (h.name, h.address) for h in hosts):
                        return
                except RoqError:
                    pass
                time.sleep(0.2)
        if not stop.is_set():
            raise ClusterFailed(
                f"the cluster was not ready within {limits.up_ready_timeout_s:.0f} s"
            )

    def _check_alive(self) -> None:
        for mode, process in self.processes.items():
            code = process.poll()
            if code is not None:
                raise ClusterFailed(f"roq {mode} exited with code {code}")

    @property
    def gcm_address(self) -> str:
        return f"{self.settings.gcm_interface}:{self.settings.gcm_ports_base}"

    def banner(self) -> str:
        gcm = self.gcm_address
        return "\n".join(
            [
                "roq is up.",
                f"  ZooKeeper   {self._zk_text()}",
                f"  GCM         {gcm} (admin API on port "
                f"{port_at(self.settings.gcm_ports_base, GcmPort.ADMIN)})",
                f"  host        {self.settings.host_interface}:{self.settings.hcm_port}",
                *self._http_lines(),
                *self._metrics_lines(),
                f"  data        {self.data_dir}",
                "From another terminal:",
                # clients default to 127.0.0.1:5000: elsewhere (--port-base) they are told
                *([] if gcm == "127.0.0.1:5000" else [f"  export ROQ_GCM={gcm}"]),
                "  roq queue create q1",
                "  roq sub q1 --count 10 &",
                "  roq pub q1 --count 10",
                "  roq status",
                "Stop with Ctrl-C.",
            ]
        )

    def _http_lines(self) -> list[str]:
        if "http" not in self.modes:
            return []
        where = f"{self.settings.host_interface}:{self.settings.http_port}"
        scheme = "https" if self.settings.http_tls else "http"
        token = "; a bearer token: roq keys token" if self.settings.security.enabled else ""
        return [f"  HTTP        {scheme}://{where} (the mq API, docs/http.md{token})"]

    def _metrics_lines(self) -> list[str]:
        gcm, host = self.settings.gcm_metrics_port, self.settings.host_metrics_port
        if not (gcm or host):
            return []
        where = [f"GCM :{gcm}"] * bool(gcm) + [f"host :{host}"] * bool(host)
        return [f"  metrics     {', '.join(where)} (/metrics, /healthz, /readyz; "
                "roq metrics scrape-config)"]  # fmt: skip

    def _zk_text(self) -> str:
        if self.zookeeper is None:
            return self.zk_servers
        tls = ", TLS only" if self.zookeeper.tls is not None else ""
        return f"{self.zookeeper.connect_string} (started here{tls})"

    def wait(self, stop: threading.Event) -> None:
        while not stop.wait(0.5):
            self.supervise(time.monotonic())

    def supervise(self, now: float) -> None:
        """Notice a dead child and start it again when its back-off has passed."""
        self._supervise_zookeeper(now)
        for mode, args in self.modes.items():
            restarts = self.restarts[mode]
            code = self.processes[mode].poll()
            if code is not None and restarts.due is None:
                if code == EXIT_CONFIG:
                    raise ClusterFailed(f"roq {mode} rejected its configuration (exit 78)")
                delay = restarts.died(now)
                log.error("roq %s exited with code %d; restarting it in %.1f s", mode, code, delay)
            if restarts.due is not None and now >= restarts.due:
                restarts.due = None
                log.warning("restarting roq %s (restart %d)", mode, restarts.failures)
                self._spawn(mode, args)

    def _supervise_zookeeper(self, now: float) -> None:
        server, restarts = self.zookeeper, self.restarts["zookeeper"]
        if server is None:
            return
        process = server.process
        if process is not None and process.poll() is None:
            return
        if restarts.due is None:
            delay = restarts.died(now)
            log.error("ZooKeeper (started here) exited; restarting it in %.1f s", delay)
        elif now >= restarts.due:
            restarts.due = None
            restarts.started_at = now
            try:
                server.start()
            except RoqError as error:
                log.error("ZooKeeper did not start again: %s", error)

    def _signal(self, modes: list[str]) -> list[tuple[str, subprocess.Popen[bytes]]]:
        """SIGTERM to those of `modes` that run (taken out of the supervised set)."""
        running = [(m, self.processes.pop(m)) for m in modes if m in self.processes]
        for _, process in running:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        return running

    @staticmethod
    def _reap(
        running: list[tuple[str, subprocess.Popen[bytes]]], deadline: float, kill: bool = True
    ) -> None:
        """Wait for each until `deadline`; then kill it (`kill`) or leave it for later."""
        for mode, process in running:
            try:
                process.wait(timeout=max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                if not kill:
                    continue
                log.error("roq %s did not stop in time; killing it", mode)
                process.kill()
                process.wait(timeout=5)

    def stop(self) -> None:
        """SIGTERM to the gateway first (its publisher flushes to the exchanges, which must
        still run), then to the host and the GCM together; everything is given until one
        deadline (`limits.up_stop_s`), then killed (the host's children, started to die with
        it, get their SIGTERM then); ZooKeeper last. Whatever they were doing (a queue's
        start included), `roq up` is gone within about that bound (issue 32: 25 s before)."""
        deadline = time.monotonic() + limits.up_stop_s
        gateway = self._signal(["http"])
        self._reap(gateway, min(deadline, time.monotonic() + limits.up_gateway_stop_s), kill=False)
        self._reap(gateway + self._signal(["host", "gcm"]), deadline)
        if self.zookeeper is not None:
            self.zookeeper.stop()
