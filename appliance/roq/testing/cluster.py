"""A real roq cluster on 127.0.0.1 for tests: `roq gcm` and `roq host` processes against a real
ZooKeeper, each cluster in its own ZooKeeper namespace and its own block of free ports.
Every wait is bounded and a timeout raises with what was being waited for."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from roq.client.admin import AdminClient
from roq.client.publisher import Publisher
from roq.client.requests import Worker
from roq.protocol.ports import EXCHANGE_WIDTH, GCM_WIDTH, MONITOR_WIDTH, STAT_WIDTH
from roq.system.spawn import child_environment, roq_command
from roq.transport import new_context, security
from roq.transport.rpc import Requester

T = TypeVar("T")

LOOPBACK = "127.0.0.1"
SLOTS = 10  # port blocks of each kind a test host may allocate (its `ports.max.perkind`)


def port_is_free(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


class PortBlocks:
    """Hands out blocks of consecutive free ports from a range of its own (one per xdist
    worker, so parallel workers never race for the same ports)."""

    def __init__(self, start: int, end: int):
        self.start = self.next = start
        self.end = end

    def take(self, width: int) -> int:
        """The next free block; past the end it wraps around once (earlier tests' ports are
        free again), so a long suite does not run out."""
        scanned = 0
        while scanned <= self.end - self.start:
            if self.next + width > self.end:
                self.next = self.start
            base, self.next = self.next, self.next + width
            scanned += width
            if all(port_is_free(p) for p in range(base, base + width)):
                return base
        raise RuntimeError("no free port block left for this test worker")


def wait_for(
    predicate: Callable[[], T | None], timeout_s: float, what: str, interval_s: float = 0.1
) -> T:
    """Poll until `predicate` returns something truthy; raise TimeoutError naming `what`."""
    deadline = time.monotonic() + timeout_s
    last_error: Exception | None = None
    while time.monotonic() < deadline:
        try:
            value = predicate()
            if value:
                return value
        except Exception as error:  # the state we wait for may not exist yet
            last_error = error
        time.sleep(interval_s)
    raise TimeoutError(
        f"timed out after {timeout_s} s waiting for {what} (last error: {last_error!r})"
    )


@dataclass
class Daemon:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    args: list[str] = field(default_factory=list)  # its `roq` arguments (`start_again`)

    def log_text(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""


def act_as_admin(security_dir: Path, secure: bool = True, zk_tls: bool = False) -> None:
    """This process (a test) and the `roq` commands it runs act as the admin principal of the
    cluster whose secrets are in `security_dir`, generated there now as a first start would.
    With `secure` False they talk to a cluster run with security=off instead. Without `zk_tls`
    they, and the processes they start, talk to ZooKeeper in plain TCP (ROQ_ZK_TLS=off): the
    tests' shared ZooKeeper is plain, since every test cluster has a CA of its own."""
    security.reset()
    if zk_tls:
        os.environ.pop(security.ZK_TLS_ENV, None)
    else:
        os.environ[security.ZK_TLS_ENV] = "off"
    if not secure:
        os.environ[security.SECURITY_ENV] = "off"
        os.environ.pop(security.CREDENTIALS_ENV, None)
        security.use_off("a test cluster run with security=off")
        return
    os.environ.pop(security.SECURITY_ENV, None)
    security.generate(security_dir)
    credentials = security_dir / security.ADMIN_FILE
    os.environ[security.CREDENTIALS_ENV] = str(credentials)
    security.use(security.load_credentials(credentials))


@dataclass
class LocalCluster:
    """Owned by one test. `stop()` ends every process it started (and their children)."""

    tmp: Path
    zk: str
    ports: PortBlocks
    namespace: str = field(default_factory=lambda: f"/roq-test-{uuid.uuid4().hex[:10]}")
    gcm_base: int = 0
    daemons: list[Daemon] = field(default_factory=list)
    secure: bool = True  # like a user's cluster; False runs it with security=off
    zk_tls: bool = False  # TLS to `zk` (a ZooKeeper serving this cluster's certificates)

    def __post_init__(self) -> None:
        """The cluster's keys, as a first `roq up` makes them, and this process (the test) and
        the `roq` commands it runs as the generated admin principal."""
        act_as_admin(self.security_dir, self.secure, self.zk_tls)

    @contextlib.contextmanager
    def as_cluster(self) -> Iterator[None]:
        """Sockets opened inside play one of the cluster's own processes (a fake exchange, a
        rules listener): they present the cluster key, the super-user's. The test is the admin
        again afterwards; connections made inside keep the cluster key."""
        if not self.secure:
            yield
            return
        secrets = security.load_cluster(self.security_dir)
        security.use(secrets.identity(), secrets.principals)
        try:
            yield
        finally:
            security.use(security.load_credentials(self.credentials))

    @property
    def security_dir(self) -> Path:
        return self.tmp / "security"

    @property
    def credentials(self) -> Path:
        """The admin principal's credentials file (`roq --credentials`)."""
        return self.security_dir / security.ADMIN_FILE

    @property
    def token(self) -> str:
        """The admin's HTTP bearer token (admin.json's; empty with security off: none asked)."""
        return security.load_credentials(self.credentials).token if self.secure else ""

    @property
    def zk_auth(self) -> str | None:
        """The ZooKeeper digest credential of the cluster's znodes (None with security off)."""
        return security.load_cluster(self.security_dir).zk_auth if self.secure else None

    def _security_args(self) -> dict[str, Any]:
        return {"security": self.secure, "security.dir": str(self.security_dir),
                "zk.tls": self.zk_tls}  # fmt: skip

    def gcm_args(self, base: int, **overrides: Any) -> list[str]:
        values = {
            "ports.base": base,
            "network.interface": LOOPBACK,
            "zk.servers": self.zk,
            "zk.namespace": self.namespace,
            "period": 500,
            "zk.session.timeout": 4000,
            "hcmTIMEOUT": 20000,
            **self._security_args(),
            **overrides,
        }
        return [arg for k, v in values.items() for arg in ("-D", f"{k}={_text(v)}")]

    def hcm_args(self, name: str, **overrides: Any) -> list[str]:
        values = {
            "zk.servers": self.zk,
            "zk.namespace": self.namespace,
            "network.interface": LOOPBACK,
            "host.name": name,
            "hcm.port": self.ports.take(1),
            "monitor.base.port": self.ports.take(SLOTS * MONITOR_WIDTH),
            "statmonitor.base.port": self.ports.take(SLOTS * STAT_WIDTH),
            "exchange.base.port": self.ports.take(SLOTS * EXCHANGE_WIDTH),
            "ports.max.perkind": SLOTS,
            "directory": str(self.tmp / name / "log"),
            "zk.session.timeout": 4000,
            "heartbeat.period": 200,
            "monitor.stat.period": 500,
            # One exchange per queue and no copies, which most tests are about; the shipped
            # replicationFactor=2 keeps two exchanges per queue, each copying the other's log
            # (configuration.md, Replication): tests of copies and acks=all ask for it.
            "replicationFactor": 1,
            **self._security_args(),
            **overrides,
        }
        return [arg for k, v in values.items() for arg in ("-D", f"{k}={_text(v)}")]

    def start_gcm(self, **overrides: Any) -> Daemon:
        base = self.ports.take(GCM_WIDTH)
        if not self.gcm_base:
            self.gcm_base = base
        return self._spawn(f"gcm-{base}", ["gcm", *self.gcm_args(base, **overrides)])

    def start_host(self, name: str = "h1", **overrides: Any) -> Daemon:
        return self._spawn(name, ["host", *self.hcm_args(name, **overrides)])

    def start_http(self, name: str = "http", port: int = 0, **overrides: Any) -> tuple[Daemon, int]:
        """A `roq http` gateway on this cluster; (its daemon, its port). Ready once
        `http_ready` answers."""
        port = port or self.ports.take(1)
        values = {
            "zk.servers": self.zk,
            "zk.namespace": self.namespace,
            "network.interface": LOOPBACK,
            "zk.session.timeout": 4000,
            "http.port": port,
            "directory": str(self.tmp / "http"),  # its snapshots (.http-PORT), kept over restarts
            **self._security_args(),
            **overrides,
        }
        args = [arg for k, v in values.items() for arg in ("-D", f"{k}={_text(v)}")]
        return self._spawn(f"{name}-{port}", ["http", *args]), port

    def _spawn(self, name: str, args: list[str]) -> Daemon:
        log_path = self.tmp / f"{name}.log"
        with log_path.open("ab") as log_file:
            process = subprocess.Popen(
                roq_command(*args),
                env=child_environment(),
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        daemon = Daemon(name, process, log_path, list(args))
        self.daemons.append(daemon)
        return daemon

    def start_again(self, daemon: Daemon) -> Daemon:
        """`daemon` started again with its command line (same ports, same directories, so a
        host resumes its queues), as `roq up` started again does; its log goes on in the same
        file. With the environment of this process now."""
        assert daemon.process.poll() is not None, f"{daemon.name} is still running"
        return self._spawn(daemon.name, daemon.args)

    def stop_daemon(self, daemon: Daemon, timeout_s: float = 30.0) -> None:
        """SIGTERM, as `roq up` stops its GCM and host, and wait for the exit (a host stops its
        children first, each within its bounds); SIGKILL of its group past `timeout_s`."""
        if daemon.process.poll() is None:
            daemon.process.send_signal(signal.SIGTERM)
        try:
            daemon.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.process.pid, signal.SIGKILL)
            daemon.process.wait(timeout=5)

    @property
    def gcm(self) -> str:
        return f"{LOOPBACK}:{self.gcm_base}"

    def admin(self, **kwargs: Any) -> AdminClient:
        if "zk" in kwargs:
            return AdminClient(zk=kwargs.pop("zk"), namespace=self.namespace, **kwargs)
        return AdminClient(gcm=self.gcm, **kwargs)

    def wait_ready(self, hosts: int = 1, timeout_s: float = 30.0) -> None:
        with self.admin(timeout_ms=1000, retries=1) as admin:
            wait_for(
                lambda: len(admin.status().hosts) >= hosts,
                timeout_s,
                f"{hosts} host(s) registered\n{self.logs()}",
            )

    def logs(self) -> str:
        return "\n".join(f"--- {d.name}\n{d.log_text()[-4000:]}" for d in self.daemons)

    def cli(
        self, *args: str, timeout_s: float = 60.0, input_text: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            roq_command(*args),
            env=child_environment(),
            capture_output=True,
            text=True,
            timeout=timeout_s,
            input=input_text,
            check=False,
        )

    def start_with_queue(self, hosts: int = 1, **host_settings: Any) -> None:
        """A GCM, hosts h1..h<hosts> with `host_settings`, and queue q1 placed on h1."""
        self.start_gcm()
        for n in range(hosts):
            self.start_host(f"h{n + 1}", **host_settings)
        self.wait_ready(hosts)
        with self.admin() as admin:
            admin.create_queue("q1", host="h1")

    @contextlib.contextmanager
    def worker(
        self, service: str, handler: Callable[[bytes], bytes], concurrency: int = 1
    ) -> Iterator[Worker]:
        """A request/response Worker of q1's `service` on a thread of its own (its sockets are
        that thread's), stopped and joined on the way out."""
        stop, made = threading.Event(), threading.Event()
        holder: list[Worker] = []

        def run() -> None:
            with Worker("q1", service, handler, gcm=self.gcm, concurrency=concurrency) as worker:
                holder.append(worker)
                made.set()
                worker.run(stop)

        thread = threading.Thread(target=run, name=f"roq-test-worker-{service}", daemon=True)
        thread.start()
        assert made.wait(30), "the worker joined"
        try:
            yield holder[0]
        finally:
            stop.set()
            thread.join(30)

    def queue_processes(self, queue: str = "q1", host: str = "") -> list[int]:
        """The queue's monitor and exchange processes of this cluster, or of its host `host`
        (a child's command line carries its host's -D directory; other tests on the machine
        run queues of the same name)."""
        marker = str(self.tmp / host / "log") if host else str(self.tmp)
        return processes_with(f" {queue} --bind ", marker)

    def publisher_on(
        self, fronts: Collection[str], acks: str = "all", *, keep_others: bool = True
    ) -> tuple[Publisher, list[Publisher]]:
        """A publisher of q1 the monitor placed on one of the exchanges at `fronts` (placement
        spreads new publishers by count, so a few tries suffice), and the others made on the
        way: kept open for the caller (they weigh on the placement), or closed."""
        others: list[Publisher] = []
        found = None
        try:
            for _ in range(8):
                publisher = Publisher("q1", gcm=self.gcm, acks=acks, linger_ms=1)
                if publisher.exchange in fronts:
                    found = publisher
                    break
                others.append(publisher)
                time.sleep(0.3)  # past a new exchange's warm-up
        finally:
            if found is None or not keep_others:
                for other in others:
                    other.close()
        if found is None:
            raise AssertionError(f"no publisher was placed on {sorted(fronts)}")
        return found, others if keep_others else []

    def kill(self, daemon: Daemon, sig: int = signal.SIGKILL) -> None:
        os.killpg(daemon.process.pid, sig)
        daemon.process.wait(timeout=10)

    def stop(self) -> None:
        for daemon in reversed(self.daemons):
            if daemon.process.poll() is None:
                daemon.process.send_signal(signal.SIGTERM)
        for daemon in reversed(self.daemons):
            try:
                daemon.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(daemon.process.pid, signal.SIGKILL)
                daemon.process.wait(timeout=5)
            _kill_group(daemon.process.pid)


def _kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def child_pids(pid: int) -> list[int]:
    """Direct and indirect children of `pid`, read from /proc."""
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        parents.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def processes_with(fragment: str, *more: str) -> list[int]:
    """PIDs whose command line contains `fragment` and each of `more` (to prove processes exist
    or are gone), read once each: a process that exits meanwhile is simply not listed."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except OSError:
            continue
        if all(part in cmdline for part in (fragment, *more)):
            pids.append(int(entry.name))
    return pids


def tcp_connections_to(pid: int, port: int) -> int:
    """How many established TCP connections process `pid` holds to `port` (a ZooKeeper's: one
    per session), read from /proc: its sockets' inodes matched against the kernel's tables, so
    no four-letter word has to be enabled on the server and no other process's are counted."""
    fd_dir = Path(f"/proc/{pid}/fd")
    inodes = set()
    for fd in fd_dir.iterdir():
        try:
            target = os.readlink(fd)
        except OSError:
            continue  # closed meanwhile
        if target.startswith("socket:["):
            inodes.add(target[len("socket:[") : -1])
    count = 0
    for table in ("tcp", "tcp6"):
        try:
            lines = Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            remote, state, inode = fields[2], fields[3], fields[9]
            if state == "01" and int(remote.rsplit(":", 1)[1], 16) == port and inode in inodes:
                count += 1  # 01: ESTABLISHED
    return count


def ask_once(endpoint: str, doc: dict[str, Any], timeout_ms: int = 2000) -> dict[str, Any]:
    """One request to a process's REP or ROUTER socket (a child's control port, a monitor's
    placement port), on a context of its own: its reply (RequestTimeout after `timeout_ms`)."""
    context = new_context()
    requester = Requester(context, endpoint, timeout_ms)
    try:
        return requester.request(doc)
    finally:
        requester.close()
        context.term()
