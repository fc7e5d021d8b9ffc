"""ZooKeeper's traffic is encrypted (issue 31, finding 1; docs/security.md §4).

The bytes between roq's processes and ZooKeeper are captured by a TCP relay in the test: every
byte ZooKeeper and its clients exchange passes through it and is recorded, nothing is mocked.
With TLS neither the digest credential nor a known znode's content shows in them; over plain
TCP (zk.tls=false) both do, so the capture can tell the two apart.
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import ssl
import subprocess
import threading
import uuid
from pathlib import Path

import pytest

from roq.local.zkserver import ZooKeeperServer, is_serving
from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import LocalCluster, PortBlocks, processes_with, wait_for
from roq.transport import security

pytestmark = pytest.mark.integration


class Relay:
    """A TCP relay from `port` to `target`, recording every byte it forwards, both ways."""

    def __init__(self, port: int, target: int):
        self.target = target
        self.listener = socket.create_server(("127.0.0.1", port))
        self.lock = threading.Lock()
        self.captured = bytearray()
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                client, _ = self.listener.accept()
            except OSError:
                continue  # closed: the loop ends
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            server.settimeout(None)
            for source, sink in ((client, server), (server, client)):
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        try:
            while data := source.recv(65536):
                with self.lock:
                    self.captured += data
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for sock in (source, sink):
                try:
                    sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def bytes(self) -> bytes:
        with self.lock:
            return bytes(self.captured)

    def close(self) -> None:
        self.closed.set()
        self.listener.close()


@pytest.mark.parametrize("tls", [True, False], ids=["tls", "plain"])
def test_the_credential_and_znodes_cross_to_zookeeper_only_encrypted(
    tmp_path: Path, port_blocks: PortBlocks, tls: bool
) -> None:
    relay_port, zk_port = port_blocks.take(1), port_blocks.take(1)
    cluster = LocalCluster(tmp_path, f"127.0.0.1:{relay_port}", port_blocks, zk_tls=tls)
    secrets = security.load_cluster(cluster.security_dir)
    server = ZooKeeperServer(tmp_path / "zookeeper", zk_port, tls=secrets.zk_tls if tls else None)
    server.start()
    relay = Relay(relay_port, zk_port)
    try:
        cluster.start_gcm()
        cluster.start_host()
        cluster.wait_ready()
        queue = f"secret-queue-{uuid.uuid4().hex[:8]}"
        with cluster.admin() as admin:
            admin.create_queue(queue, host="h1")
        issued = cluster.cli("keys", "token", "admin", "--zk", cluster.zk,
                             "--namespace", cluster.namespace)  # fmt: skip
        assert issued.returncode == 0, issued.stderr
        digest = hashlib.sha256(issued.stdout.strip().encode()).hexdigest()
        password = secrets.zk_auth.partition(":")[2]
        wait_for(lambda: digest.encode() in relay.bytes() or tls, 10, "the token's write")
        captured = relay.bytes()
        assert len(captured) > 2_000, "the relay saw no session"
        clear = {
            "the digest credential": password.encode() in captured,
            "the queue's name": queue.encode() in captured,
            "a token digest": digest.encode() in captured,
        }
        if tls:
            assert not any(clear.values()), f"in clear over TLS: {clear}"
            assert captured[:3] == b"\x16\x03\x01", "the first bytes are not a TLS ClientHello"
        else:
            assert all(clear.values()), f"a plain capture should show each: {clear}"
    finally:
        cluster.stop()
        relay.close()
        server.stop()


def _tls_handshake_without_certificate(port: int) -> str:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname, context.verify_mode = False, ssl.CERT_NONE
    try:
        with (
            socket.create_connection(("127.0.0.1", port), timeout=3) as raw,
            context.wrap_socket(raw) as sock,
        ):
            sock.sendall(b"ruok")
            return sock.recv(16).decode(errors="replace") or "closed"
    except OSError as error:
        return f"refused: {error}"


def test_roq_up_serves_zookeeper_over_tls_only(tmp_path: Path, port_blocks: PortBlocks) -> None:
    """`roq up`'s own ZooKeeper: one port, TLS only, a certificate of the cluster's CA required;
    its readiness probe (TLS) passes and the cluster serves through it."""
    base = port_blocks.take(1200)
    helper = LocalCluster(tmp_path, "", port_blocks, zk_tls=True)  # its keys and CLI
    data = tmp_path / "data"
    args = ["up", "--data-dir", str(data), "--port-base", str(base),
            "-D", f"security.dir={helper.security_dir}", "-D", "ports.max.perkind=10",
            "-D", f"zk.namespace=/roq-test-{uuid.uuid4().hex[:10]}"]  # fmt: skip
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(
            roq_command(*args), env=child_environment(), stdin=subprocess.DEVNULL,
            stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp_path,
        )  # fmt: skip
    zk_port = base + 90
    try:
        wait_for(lambda: "roq is up" in log_path.read_text() or process.poll() is not None, 60,
                 "roq up ready")  # fmt: skip
        assert process.poll() is None, log_path.read_text()
        cfg = (data / "zookeeper" / "zoo.cfg").read_text()
        assert f"secureClientPort={zk_port}\n" in cfg and "\nclientPort=" not in cfg
        assert "secureClientPortAddress=127.0.0.1\n" in cfg
        tls = security.load_cluster(helper.security_dir).zk_tls
        assert is_serving("127.0.0.1", zk_port, tls=tls)
        assert not is_serving("127.0.0.1", zk_port), "ZooKeeper answered in plain TCP"
        assert _tls_handshake_without_certificate(zk_port) != "imok"
        made = helper.cli("queue", "create", "q1", "--gcm", f"127.0.0.1:{base}")
        assert made.returncode == 0, made.stderr + log_path.read_text()
        listed = helper.cli("queue", "list", "--zk", f"127.0.0.1:{zk_port}",
                            "--namespace", args[-1].partition("=")[2])  # fmt: skip
        assert listed.returncode == 0 and "q1" in listed.stdout, listed.stderr
    finally:
        process.terminate()
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        for pid in processes_with(str(data)):  # its ZooKeeper: a session of its own
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
