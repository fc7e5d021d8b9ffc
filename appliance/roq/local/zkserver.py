"""A local ZooKeeper server from the system's install (Debian/Ubuntu package `zookeeper`).

Used by `roq up` when `zk.servers` is not reachable, and by the tests. The server binds
127.0.0.1 only, keeps its data under the given directory, and is stopped with SIGTERM (then
SIGKILL) within a bound. With the cluster's TLS material it serves TLS only (docs/security.md
§4): its one port is ZooKeeper's secure port, and its readiness probe speaks TLS too.
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
from roq.coordination.session import tls_context
from roq.errors import EXIT_UNAVAILABLE, RoqError
from roq.protocol.zktls import ZkTls
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
    # Logging jars make the server log instead of printing "NOP logger". Netty's codec and
    # resolver: the TLS listener (NettyServerCnxnFactory) needs them, and Debian's zookeeper.jar
    # leaves them out of its Class-Path (NoClassDefFoundError at the first TLS connection).
    for extra in ("slf4j-log4j12.jar", "log4j-1.2.jar", "netty-codec.jar", "netty-resolver.jar"):
        if (JAR_DIR / extra).exists():
            parts.append(str(JAR_DIR / extra))
    return ":".join(parts)


def is_serving(host: str, port: int, timeout_s: float = 1.0, tls: ZkTls | None = None) -> bool:
    """True if a ZooKeeper answers the `ruok` four-letter word with `imok` (over TLS, with
    `tls`'s certificate, when given)."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s) as raw:
            sock = tls_context(tls).wrap_socket(raw) if tls is not None else raw
            sock.sendall(b"ruok")
            sock.settimeout(timeout_s)
            return sock.recv(16) == b"imok"
    except OSError:  # ssl.SSLError too: a plain server, or one of another cluster
        return False


def first_reachable(servers: str, tls: ZkTls | None = None) -> bool:
    for server in servers.split(","):
        host, _, port = server.strip().partition(":")
        if host and port.isdigit() and is_serving(host, int(port), tls=tls):
            return True
    return False


# --- TLS (zktls): the listener's lines of zoo.cfg and its files ----------------------------------
def listener_config(port: int, address: str, tls_dir: Path | None) -> str:
    """zoo.cfg's client listener, on `address`:`port`. With `tls_dir` (where `write_tls_files`
    put the cluster's files) TLS only: the secure port, clients must present a certificate of
    the cluster's CA (`ssl.clientAuth=need`: an anonymous peer opens no session at all), no host
    name checked (no certificate names one), TLS 1.2; the plain port is not opened, since
    nothing of roq needs it (the probe speaks TLS). Without: plain TCP (zk.tls=false)."""
    if tls_dir is None:
        return f"clientPort={port}\nclientPortAddress={address}\n"
    return (
        f"secureClientPort={port}\nsecureClientPortAddress={address}\n"
        "serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory\n"
        f"ssl.keyStore.location={tls_dir / KEYSTORE}\nssl.keyStore.type=PEM\n"
        f"ssl.trustStore.location={tls_dir / TRUSTSTORE}\nssl.trustStore.type=PEM\n"
        "ssl.clientAuth=need\nssl.hostnameVerification=false\n"
        # the Debian package's Netty (4.1.48) fails every TLS 1.3 handshake under Java 17
        "ssl.protocol=TLSv1.2\nssl.enabledProtocols=TLSv1.2\n"
    )


KEYSTORE = "keystore.pem"  # the node's private key and certificate
TRUSTSTORE = "truststore.pem"  # the cluster CA's certificate


def write_tls_files(directory: Path, tls: ZkTls) -> Path:
    """The PEM files ZooKeeper reads, from cluster.json's `zk_tls`, each replaced whole, mode
    0600 in a 0700 directory (the key store holds the node's private key). Returns `directory`."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(directory, 0o700)
    for name, text in ((KEYSTORE, tls.key + tls.cert), (TRUSTSTORE, tls.ca)):
        temporary = directory / f".{name}.{os.getpid()}"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w") as file:
            file.write(text)
        os.replace(temporary, directory / name)
    return directory


# --- the server ------------------------------------------------------------------------------


# --- closed to strangers (issue 31; docs/security.md §4) ------------------------------------
# The same lines are in ami/files/zoo.cfg (tests/unit/test_zookeeper_closed_unit.py compares them).
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

    def __init__(
        self, data_dir: Path, port: int, host: str = "127.0.0.1", tls: ZkTls | None = None
    ):
        self.data_dir = data_dir
        self.port = port
        self.host = host
        self.tls = tls  # the cluster's: TLS only (listener_config)
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def connect_string(self) -> str:
        return f"{self.host}:{self.port}"

    def _write_config(self) -> Path:
        self.data_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        config = self.data_dir / "zoo.cfg"
        config.write_text(
            "tickTime=500\ninitLimit=10\nsyncLimit=5\n"
            f"dataDir={self.data_dir / 'data'}\n"
            "admin.enableServer=false\n"
            "minSessionTimeout=1000\nmaxSessionTimeout=60000\n"
            # roq's znodes carry digest ACLs (docs/security.md): ZooKeeper must check them.
            "skipACL=no\n" + closed_config()
        )
        with config.open("a") as file:  # TLS (zktls): the client listener, below the rest
            file.write(self._listener())
        return config

    # --- TLS (zktls) ---------------------------------------------------------------------------
    def _listener(self) -> str:
        tls_dir = write_tls_files(self.data_dir / "tls", self.tls) if self.tls else None
        return listener_config(self.port, self.host, tls_dir)

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
            if is_serving(self.host, self.port, timeout_s=0.5, tls=self.tls):
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
