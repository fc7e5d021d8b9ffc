"""A local ZooKeeper server from the system's install (Debian/Ubuntu package `zookeeper`).

Used by `roq up` when `zk.servers` is not reachable, and by the tests. The server binds
127.0.0.1 only, keeps its data under the given directory, and is stopped with SIGTERM (then
SIGKILL) within a bound.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from roq import limits
from roq.errors import EXIT_UNAVAILABLE, RoqError
from roq.system.spawn import die_with_parent

log = logging.getLogger(__name__)

JAR_DIR = Path("/usr/share/java")
CONF_DIR = Path("/etc/zookeeper/conf")


class ZooKeeperUnavailable(RoqError):
    exit_code = EXIT_UNAVAILABLE


def classpath() -> str:
    jar = JAR_DIR / "zookeeper.jar"
    if not jar.exists():
        raise ZooKeeperUnavailable(
            f"{jar} not found: install ZooKeeper with `apt-get install zookeeper` "
            "(make run and make test do it for you)"
        )
    parts = [str(CONF_DIR), str(jar)]
    # Logging jars make the server log instead of printing "NOP logger".
    for extra in ("slf4j-log4j12.jar", "log4j-1.2.jar"):
        if (JAR_DIR / extra).exists():
            parts.append(str(JAR_DIR / extra))
    return ":".join(parts)


def is_serving(host: str, port: int, timeout_s: float = 1.0) -> bool:
    """True if a ZooKeeper answers the `ruok` four-letter word with `imok`."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as sock:
            sock.sendall(b"ruok")
            sock.settimeout(timeout_s)
            return sock.recv(16) == b"imok"
    except OSError:
        return False


def first_reachable(servers: str) -> bool:
    for server in servers.split(","):
        host, _, port = server.strip().partition(":")
        if host and port.isdigit() and is_serving(host, int(port)):
            return True
    return False


# --- closed to strangers (issue 31; docs/security.md §4) ------------------------------------
# The same lines are in ami/files/zoo.cfg (tests/unit/test_zookeeper_closed.py compares them).
# The root's ACL is the GCM's part (zk.close.root, coordination/session.py::close_root).
def closed_config() -> str:
    """The zoo.cfg lines that bound what a client may hold and ask: only `ruok` (readiness:
    `is_serving`) among the four-letter words, which otherwise tell anyone the server's
    clients and what they watch (ZooKeeper adds `srvr`, counts only, whatever the list);
    connections per address and in all; the requests held in memory (ZooKeeper reads each of
    these keys as the system property zookeeper.<key>)."""
    return (
        "4lw.commands.whitelist=ruok\n"
        f"maxClientCnxns={limits.zk_server_connections_per_address_max}\n"
        f"maxCnxns={limits.zk_server_connections_max}\n"
        f"globalOutstandingLimit={limits.zk_server_outstanding_max}\n"
        f"largeRequestThreshold={limits.zk_server_large_request_bytes}\n"
        f"largeRequestMaxBytes={limits.zk_server_large_requests_bytes_max}\n"
    )


# jute.maxbuffer is read as itself, a JVM option only (a zoo.cfg key would become
# zookeeper.jute.maxbuffer): the largest request, and znode, the server reads.
CLOSED_JVM_OPTIONS = (f"-Djute.maxbuffer={limits.zk_server_request_bytes_max}",)


def _private_child() -> None:
    """In the server's process before it runs: its snapshots and transaction logs (the
    cluster's znodes, digest credentials' hashes included) are the user's alone."""
    os.umask(0o077)
    die_with_parent()


class ZooKeeperServer:
    """One standalone ZooKeeper process. Owned by the thread that started it."""

    def __init__(self, data_dir: Path, port: int, host: str = "127.0.0.1"):
        self.data_dir = data_dir
        self.port = port
        self.host = host
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def connect_string(self) -> str:
        return f"{self.host}:{self.port}"

    def _write_config(self) -> Path:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        config = self.data_dir / "zoo.cfg"
        config.write_text(
            "tickTime=500\ninitLimit=10\nsyncLimit=5\n"
            f"dataDir={self.data_dir / 'data'}\nclientPort={self.port}\n"
            f"clientPortAddress={self.host}\nadmin.enableServer=false\n"
            "minSessionTimeout=1000\nmaxSessionTimeout=60000\n"
            # roq's znodes carry digest ACLs (docs/security.md): ZooKeeper must check them.
            "skipACL=no\n" + closed_config()
        )
        return config

    def start(self, timeout_s: float = limits.zk_server_start_timeout_s) -> None:
        java = shutil.which("java")
        if java is None:
            raise ZooKeeperUnavailable(
                "java not found: install it with `apt-get install zookeeper`"
            )
        command = [
            java,
            "-Xmx256m",
            "-cp",
            classpath(),
            "-Dzookeeper.root.logger=WARN,CONSOLE",
            "-Dzookeeper.log.dir=" + str(self.data_dir),
            *CLOSED_JVM_OPTIONS,
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(self._write_config()),
        ]
        # the user's alone, whatever the umask: the log names clients and paths
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND
        log_fd = os.open(self.data_dir / "zookeeper.log", flags, 0o600)
        os.fchmod(log_fd, 0o600)  # one an older version wrote 0644, too
        log_file = os.fdopen(log_fd, "ab")
        self.process = subprocess.Popen(
            command,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            # Its own session: a Ctrl-C in the terminal reaches `roq up`, which stops the GCM
            # and host before ZooKeeper. Dying with the parent: a SIGKILLed `roq up` (OOM
            # killer, supervisord past stopwaitsecs) left a java process holding the port.
            start_new_session=True,
            preexec_fn=_private_child,  # noqa: PLW1509 (started before any other thread)
        )
        log_file.close()
        self._wait_ready(timeout_s)
        log.info("ZooKeeper serving on %s (pid %d)", self.connect_string, self.process.pid)

    def _wait_ready(self, timeout_s: float) -> None:
        assert self.process is not None
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise ZooKeeperUnavailable(
                    f"ZooKeeper exited with code {self.process.returncode}; "
                    f"see {self.data_dir / 'zookeeper.log'}"
                )
            if is_serving(self.host, self.port, timeout_s=0.5):
                return
            time.sleep(0.1)
        self.stop()
        raise ZooKeeperUnavailable(f"ZooKeeper did not answer on port {self.port} in {timeout_s} s")

    def stop(self) -> None:
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=limits.shutdown_grace_ms / 1000)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=5)
