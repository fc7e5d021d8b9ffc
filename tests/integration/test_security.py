"""Security (issue 23, docs/security.md): CURVE on every socket of a real cluster, with the keys
a first start generates.

Raw pyzmq here on purpose: these clients are the strangers roq's own code would never build (no
security, a key the cluster does not know), and the test watches their handshakes directly."""

from __future__ import annotations

import json
import re
import stat
import subprocess
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zmq
from kazoo.exceptions import NoAuthError
from zmq.utils.monitor import parse_monitor_message

from roq import limits, replication
from roq.client.admin import AdminClient, AdminError
from roq.client.locate import locate_monitor
from roq.client.publisher import Publisher
from roq.coordination import session
from roq.coordination.paths import Paths
from roq.coordination.principals import PrincipalStore, principal_node
from roq.errors import AuthenticationRefused
from roq.local.zkserver import ZooKeeperServer
from roq.protocol import principals
from roq.protocol.commands import ChildCommand, Reason
from roq.protocol.ports import ExchangePort, GcmPort, MonitorPort, StatPort, port_at, sibling
from roq.protocol.principals import Permission, Principal
from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import LOOPBACK, LocalCluster, PortBlocks, wait_for
from roq.transport import new_context, security
from roq.transport.rpc import Requester

# Each server socket kind of a cluster, with the kind of socket a client of it opens.
PEER = {"REP": zmq.DEALER, "ROUTER": zmq.DEALER, "PUB": zmq.SUB, "XPUB": zmq.SUB}
PEER.update({"SUB": zmq.PUB, "PULL": zmq.PUSH})
FAILED = (
    zmq.EVENT_HANDSHAKE_FAILED_AUTH
    | zmq.EVENT_HANDSHAKE_FAILED_PROTOCOL
    | zmq.EVENT_HANDSHAKE_FAILED_NO_DETAIL
)
# The refusal must come within the handshake bound; the slack covers a loaded test machine.
REFUSED_WITHIN_S = limits.handshake_timeout_ms / 1000 + 1.0


@dataclass(frozen=True)
class Server:
    name: str
    kind: str
    endpoint: str

    @property
    def cluster_only(self) -> bool:
        """Sockets only the cluster's own processes may connect to (docs/security.md §5)."""
        return self.name in ("host", "monitor REPORTS", "monitor RULES")


@pytest.fixture
def servers(cluster: LocalCluster) -> Iterator[list[Server]]:
    """Every server socket of a cluster with one queue: GCM, host, monitor, stat monitor and
    exchange."""
    cluster.start_gcm()
    cluster.start_host("h1")
    cluster.wait_ready()
    with cluster.admin() as admin:
        admin.create_queue("q1")
        status = admin.status()
    gcm = [
        Server(f"gcm {offset.name}", kind, f"tcp://{LOOPBACK}:{port_at(cluster.gcm_base, offset)}")
        for offset, kind in (
            (GcmPort.TOPOLOGY, "REP"),
            (GcmPort.ADMIN, "REP"),
            (GcmPort.BROADCAST, "PUB"),
        )
    ]
    host = [Server("host", "REP", h.hcm) for h in status.hosts]
    monitor = locate_monitor("q1", gcm=cluster.gcm)
    kinds = ("SUB", "ROUTER", "PUB", "PUB", "PULL", "REP")
    monitors = [
        Server(f"monitor {o.name}", k, monitor.at(o))
        for o, k in zip(MonitorPort, kinds, strict=True)
    ]
    stats = [
        Server("stat IN", "SUB", monitor.stat_in),
        Server("stat KPI", "PUB", sibling(monitor.stat, StatPort.KPI, StatPort.KPI)),
    ]
    queue = next(q.fields() for q in status.queues if q.info.name == "q1")
    front = queue["Exchanges"][0]["Front"]
    exchange = [
        Server(f"exchange {o.name}", k, sibling(front, ExchangePort.FRONT, o))
        for o, k in zip(ExchangePort, ("ROUTER", "XPUB", "REP", "ROUTER"), strict=True)
    ]
    yield gcm + host + monitors + stats + exchange


def _handshake(
    context: zmq.Context,
    server: Server,
    keys: tuple[bytes, bytes] | None,
    *,
    server_key: bytes | None = None,
) -> tuple[int, float]:
    """Connect as a stranger and return the first handshake event and how long it took."""
    sock = context.socket(PEER[server.kind])
    sock.linger = 0
    if keys is not None:
        sock.curve_publickey, sock.curve_secretkey = keys
        sock.curve_serverkey = server_key
    events = sock.get_monitor_socket(FAILED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
    started = time.monotonic()
    try:
        sock.connect(server.endpoint)
        if not events.poll(int(REFUSED_WITHIN_S * 1000) + 1000):
            return 0, time.monotonic() - started
        event = parse_monitor_message(events.recv_multipart())
        return int(event["event"]), time.monotonic() - started
    finally:
        sock.disable_monitor()
        events.close(0)
        sock.close(0)


def _cluster_key(cluster: LocalCluster) -> bytes:
    return security.load_credentials(cluster.credentials).server_public.encode()


def test_null_and_unknown_key_clients_are_refused_by_every_socket_within_the_handshake_bound(
    cluster: LocalCluster, servers: list[Server]
):
    assert len(servers) == 3 + 1 + 6 + 2 + 4
    server_key = _cluster_key(cluster)
    own = security.load_cluster(cluster.security_dir).keys
    admin = security.load_credentials(cluster.credentials).keys
    stranger = zmq.curve_keypair()
    context = zmq.Context()
    try:
        for server in servers:
            # the controls: the cluster's key is let in everywhere, the admin's wherever it is
            # not the cluster's alone; so a refusal below means something
            for who, keys, let_in in (
                ("cluster", own, True),
                ("admin", admin, not server.cluster_only),
            ):
                pair = (keys.public.encode(), keys.secret.encode())
                event, _ = _handshake(context, server, pair, server_key=server_key)
                wanted = (
                    zmq.EVENT_HANDSHAKE_SUCCEEDED if let_in else zmq.EVENT_HANDSHAKE_FAILED_AUTH
                )
                assert event == wanted, f"{server.name}: {who} {'not ' * let_in}let in ({event})"
            for who, pair in (("NULL", None), ("unknown key", stranger)):
                event, took = _handshake(context, server, pair, server_key=server_key)
                assert event & FAILED, f"{server.name} did not refuse a {who} client ({event})"
                assert took < REFUSED_WITHIN_S, f"{server.name}: {who} refused after {took} s"
    finally:
        context.term()


def test_a_client_with_another_clusters_key_gets_a_clear_error_not_a_hang(
    cluster: LocalCluster, tmp_path
):
    cluster.start_gcm()
    cluster.wait_ready(hosts=0)  # the GCM answers its own cluster: any refusal below is the key's
    other = security.generate(tmp_path / "other")
    security.reset()
    security.use(security.load_credentials(tmp_path / "other" / security.ADMIN_FILE))
    started = time.monotonic()
    with (
        pytest.raises(AuthenticationRefused) as refused,
        AdminClient(gcm=cluster.gcm, timeout_ms=10_000, retries=1) as admin,
    ):
        admin.status()
    assert time.monotonic() - started < REFUSED_WITHIN_S
    assert "cluster key" in str(refused.value), refused.value
    assert other.keys.public not in str(refused.value)


def test_the_first_start_writes_private_keys_and_clients_find_them(cluster: LocalCluster):
    for name in (security.CLUSTER_FILE, security.ADMIN_FILE):
        mode = stat.S_IMODE((cluster.security_dir / name).stat().st_mode)
        assert mode == 0o600, f"{name} has mode {oct(mode)}"
    cluster.start_gcm()
    cluster.start_host("h1")
    cluster.wait_ready()
    created = cluster.cli("queue", "create", "q1", "--gcm", cluster.gcm)
    assert created.returncode == 0, created.stderr
    # Without any credentials a command says where it looked, and does not hang.
    bare = cluster.cli(
        "--credentials", str(cluster.tmp / "nowhere.json"), "status", "--gcm", cluster.gcm
    )
    assert bare.returncode == 77 and "no roq credentials found" in bare.stderr, bare.stderr


def test_zookeeper_without_the_clusters_credential_cannot_read_or_change_its_namespace(
    cluster: LocalCluster,
):
    cluster.start_gcm()
    cluster.start_host("h1")
    cluster.wait_ready()
    with cluster.admin() as admin:
        admin.create_queue("q1")
    paths = Paths(cluster.namespace)
    stranger = session.connect(cluster.zk, 4000)
    try:
        for read in (
            lambda: stranger.get_children(cluster.namespace),
            lambda: stranger.get(paths.leader),
            lambda: stranger.get_children(f"{cluster.namespace}/queues"),
            lambda: stranger.create(f"{cluster.namespace}/intruder", b""),
            lambda: stranger.delete(f"{cluster.namespace}/queues/q1", recursive=True),
        ):
            with pytest.raises(NoAuthError):
                read()
    finally:
        session.close(stranger)
    # the control: roq's own credential reads all of it
    member = session.connect(cluster.zk, 4000, auth=cluster.zk_auth)
    try:
        assert "q1" in member.get_children(f"{cluster.namespace}/queues")
        assert member.get_acls(f"{cluster.namespace}/queues/q1")[0] == session.digest_acl(
            str(cluster.zk_auth)
        )
    finally:
        session.close(member)


# --- principals and permissions ----------------------------------------------------------------
def _principal(cluster: LocalCluster, name: str, *grant: str) -> Path:
    """A principal made with `roq keys`, granted `grant` (prefix, permissions...) if given."""
    where = ["--zk", cluster.zk, "--namespace", cluster.namespace]
    path = cluster.tmp / f"{name}.json"
    made = cluster.cli("keys", "create", name, "--out", str(path), *where)
    assert made.returncode == 0, made.stderr
    if grant:
        granted = cluster.cli("keys", "grant", name, *grant, *where)
        assert granted.returncode == 0, granted.stderr
    # A principal is known everywhere within about a second: the host's file, then its
    # children's next look at it (limits.principals_poll_s).
    table = cluster.tmp / "h1" / "log" / ".host-h1.principals"
    wait_for(lambda: table.exists() and f'"{name}"' in table.read_text(), 10, f"{name} known")
    time.sleep(2 * limits.principals_poll_s)
    return path


def _as(cluster: LocalCluster, credentials: Path, *args: str, timeout_s: float = 60.0) -> Any:
    return cluster.cli("--credentials", str(credentials), *args, timeout_s=timeout_s)


@pytest.fixture
def one_queue(cluster: LocalCluster) -> LocalCluster:
    cluster.start_gcm()
    cluster.start_host("h1")
    cluster.wait_ready()
    with cluster.admin() as admin:
        admin.create_queue("q1")
    return cluster


def test_a_principal_at_its_queue_quota_creates_no_more_while_another_still_can(
    cluster: LocalCluster,
):
    """Issue 31, finding 7: queues.per.principal bounds the queues under a principal's admin
    grants; past it `roq queue create` is refused naming the key, another principal creates
    on, and the operator (admin on every queue) is held to none."""
    cluster.start_gcm(**{"queues.per.principal": 1})
    cluster.start_host("h1")
    cluster.wait_ready()
    gcm = ["--gcm", cluster.gcm]
    tenant = _principal(cluster, "tenant", "t.", "admin")
    other = _principal(cluster, "other", "u.", "admin")
    made = _as(cluster, tenant, "queue", "create", "t.1", *gcm)
    assert made.returncode == 0, made.stderr
    refused = _as(cluster, tenant, "queue", "create", "t.2", *gcm)
    assert refused.returncode != 0
    assert "principal tenant administers 1 queues: its quota (queues.per.principal = 1)" in (
        refused.stderr), refused.stderr  # fmt: skip
    assert _as(cluster, other, "queue", "create", "u.1", *gcm).returncode == 0
    with cluster.admin() as admin:  # the operator
        admin.create_queue("t.2")
        assert {q.name for q in admin.list_queues()} >= {"t.1", "t.2", "u.1"}


def test_permissions_per_queue_prefix_refuse_by_name(one_queue: LocalCluster):
    cluster, gcm = one_queue, ["--gcm", one_queue.gcm]
    writer = _principal(cluster, "writer", "q", "publish")
    reader = _principal(cluster, "reader", "q1", "subscribe")
    nobody = _principal(cluster, "nobody")

    sent = _as(cluster, writer, "pub", "q1", "--count", "3", *gcm)
    assert sent.returncode == 0, sent.stderr
    got = _as(cluster, reader, "sub", "q1", "--from-beginning", "--count", "3", "--timeout",
              "30", *gcm)  # fmt: skip
    assert got.returncode == 0 and len(got.stdout.splitlines()) == 3, got.stderr

    refusals = [
        (reader, ["pub", "q1", "--count", "1"], "lacks permission 'publish' on queue 'q1'"),
        (writer, ["sub", "q1", "--count", "1", "--timeout", "10"], "permission 'subscribe'"),
        (reader, ["queue", "create", "q2"], "principal reader lacks permission 'admin'"),
        (nobody, ["queue", "delete", "q1"], "principal nobody lacks permission 'admin'"),
        # refused by the GCM before any monitor is asked: it names what the client wanted
        (nobody, ["pub", "q1", "--count", "1"], "nobody lacks permission 'publish' on queue"),
        (nobody, ["sub", "q1", "--count", "1", "--timeout", "10"], "lacks permission 'subscribe'"),
    ]
    for who, args, why in refusals:
        started = time.monotonic()
        done = _as(cluster, who, *args, *gcm)
        assert done.returncode != 0 and why in done.stderr, (args, done.stderr)
        assert time.monotonic() - started < 15, f"{args}: refused only after a long wait"
    # the state of a queue is anyone's to read (roq status asks its monitor), stopping its
    # processes is not
    shown = _as(cluster, nobody, "status", *gcm)
    assert shown.returncode == 0 and "unreachable" not in shown.stdout, shown.stdout
    front = _queue(cluster)["Exchanges"][0]["Front"]
    context = new_context()
    requester = Requester(context, sibling(front, ExchangePort.FRONT, ExchangePort.CONTROL))
    try:
        reply = requester.request({"CMD": ChildCommand.SHUTDOWN})  # as admin: not the cluster
        assert reply["ERROR"] == Reason.FORBIDDEN and "cluster role" in reply["COMMENT"], reply
    finally:
        requester.close()
        context.term()
    listed = cluster.cli("keys", "list", "--zk", cluster.zk, "--namespace", cluster.namespace)
    assert "writer" in listed.stdout and "q: publish" in listed.stdout, listed.stdout
    with cluster.admin() as admin:
        assert admin.queue_exists("q1")  # nobody's delete was refused


def test_a_revoked_key_is_cut_off_within_5_s(one_queue: LocalCluster):
    _revoke_reader_while_it_receives(one_queue)


def test_a_revocation_reaches_monitors_and_exchanges_past_1_mib_of_principals(
    one_queue: LocalCluster,
):
    """Issue 31, finding 6: children read at most 1 MiB of their host's principals file and
    kept the old table, so a revoked key passed. 1,000 more principals with 16 tokens each,
    added while the reader receives, make the file ~1.3 MB; the reader's revocation must still
    cut it off within the bound."""
    table = one_queue.tmp / "h1" / "log" / ".host-h1.principals"

    def grow() -> None:
        member = session.connect(one_queue.zk, 4000, auth=one_queue.zk_auth)
        try:
            paths = Paths(one_queue.namespace)
            for n in range(1_000):
                tokens = tuple(principals.token_digest(f"roq_{n}_{t}") for t in range(16))
                extra = Principal(f"extra{n}", f"{n:040d}", tokens=tokens)
                node = principal_node(extra.name, str(one_queue.zk_auth))
                member.create(paths.principal(node), json.dumps(extra.encode()).encode())
            member.set(paths.principals, b"grown")  # what every `roq keys` change sets
        finally:
            session.close(member)
        wait_for(lambda: table.stat().st_size > 1024 * 1024, 20, "the host's file past 1 MiB")

    _revoke_reader_while_it_receives(one_queue, grow)


def _revoke_reader_while_it_receives(
    cluster: LocalCluster, before_revoking: Callable[[], None] = lambda: None
) -> None:
    """A reader receiving as a subscriber is revoked and must hear nothing more after the
    revocation's bound; `before_revoking` runs while it receives."""
    reader = _principal(cluster, "reader", "q1", "subscribe")
    heard: list[float] = []
    sub = subprocess.Popen(
        roq_command("--credentials", str(reader), "sub", "q1", "--gcm", cluster.gcm),
        env=child_environment(), stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip

    def listen() -> None:
        assert sub.stdout is not None
        for _ in sub.stdout:
            heard.append(time.monotonic())

    threading.Thread(target=listen, daemon=True).start()
    try:
        with Publisher("q1", gcm=cluster.gcm) as publisher:

            def publish_for(seconds: float) -> None:
                end = time.monotonic() + seconds
                while time.monotonic() < end:
                    publisher.send(b"m")
                    time.sleep(0.02)

            wait_for(lambda: publish_for(0.5) or heard, 30, "the reader receiving")
            before_revoking()
            revoked = cluster.cli("keys", "revoke", "reader", "--zk", cluster.zk,
                                  "--namespace", cluster.namespace)  # fmt: skip
            assert revoked.returncode == 0, revoked.stderr
            at = time.monotonic()
            publish_for(limits.revocation_cut_s + 3)
        assert heard and heard[-1] <= at + limits.revocation_cut_s, (
            f"the revoked reader still received {heard[-1] - at:.1f} s after the revocation"
        )
    finally:
        sub.kill()
        sub.wait(10)


def _queue(cluster: LocalCluster, name: str = "q1") -> dict[str, Any]:
    with cluster.admin() as admin:
        status = admin.status()
    return next(q.fields() for q in status.queues if q.info.name == name)


def test_replication_is_refused_to_a_peer_without_the_cluster_role(one_queue: LocalCluster):
    cluster = one_queue
    front = _queue(cluster)["Exchanges"][0]["Front"]
    admin_keys = security.load_credentials(cluster.credentials).keys
    context = zmq.Context()
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.curve_publickey, sock.curve_secretkey = (
        admin_keys.public.encode(),
        admin_keys.secret.encode(),
    )
    sock.curve_serverkey = _cluster_key(cluster)
    try:
        sock.connect(sibling(front, ExchangePort.FRONT, ExchangePort.LOG))
        sock.send_multipart([replication.PROBE, b"some-leader"])
        assert sock.poll(10_000), "no answer to a replication probe"
        reply = sock.recv_multipart()
        assert reply[0] == replication.WRITTEN and reply[2] == replication.FAILED, reply
        assert b"principal admin lacks the cluster role" in reply[4], reply
    finally:
        sock.close(0)
        context.term()


def test_a_zookeeper_restart_leaves_every_process_authorised(
    tmp_path: Path, port_blocks: PortBlocks
):
    """kazoo sends the digest credential again on every reconnection (coordination/session.py):
    after ZooKeeper's restart the GCM still writes a new queue's znodes, the host registers its
    exchange, the principal watch still fires, and nobody logs an authorisation error. A
    ZooKeeper of this test's own, so restarting it touches no other test."""
    server = ZooKeeperServer(tmp_path / "zookeeper", port_blocks.take(1))
    server.start()
    cluster = LocalCluster(tmp_path / "cluster", server.connect_string, port_blocks)
    try:
        cluster.start_gcm()
        cluster.start_host("h1")
        cluster.wait_ready()
        with cluster.admin() as admin:
            admin.create_queue("q1")
        server.stop()
        # down for half a session (zk.session.timeout 4 s in tests): every process loses its
        # connection and keeps its session
        time.sleep(2.0)
        server.start()
        with cluster.admin() as admin:
            wait_for(lambda: _created(admin, "q2"), 30, "q2 created after the restart")
        for queue in ("q1", "q2"):
            with Publisher(queue, gcm=cluster.gcm, acks="leader") as publisher:
                publisher.send(b"after the restart")
                publisher.flush(timeout_s=20)
        _principal(cluster, "late")  # the watch on the principal table still fires
        assert all(d.process.poll() is None for d in cluster.daemons), cluster.logs()
        for daemon in cluster.daemons:
            text = daemon.log_text()
            assert not re.search(r"NoAuth|AuthFailed|not authori[sz]ed", text), text[-3000:]
    finally:
        cluster.stop()
        server.stop()


def _created(admin: AdminClient, queue: str) -> bool:
    try:
        admin.create_queue(queue)
    except AdminError:  # the GCM has not reconnected yet
        return False
    return admin.queue_exists(queue)


def test_two_changes_of_one_principal_at_once_both_take_effect(zookeeper: str) -> None:
    """`roq keys grant` reads a principal and writes it back by compare-and-set: a change that
    lands between the read and the write makes the first read again instead of undoing it."""
    namespace = f"/roq-test-{uuid.uuid4().hex[:10]}"
    first, second = (session.connect(zookeeper, 4000) for _ in range(2))
    try:
        auth = "roq:a-test-credential"  # names the znodes (anonymous sessions: open ACLs)
        store, other = (PrincipalStore(c, namespace, auth) for c in (first, second))
        store.put(Principal("p", "k" * 40))
        raced = []

        def grant_publish(p: Principal) -> Principal:
            if not raced:  # the other command's grant lands after this read
                raced.append(other.update("p", lambda q: q.granted("b", [Permission.SUBSCRIBE])))
            return p.granted("a", [Permission.PUBLISH])

        store.update("p", grant_publish)
        final = store.get("p")
        assert final is not None and raced[0] is not None
        assert final.allows(Permission.PUBLISH, "a1") and final.allows(Permission.SUBSCRIBE, "b1")
        assert store.update("nobody", lambda q: q) is None
    finally:
        first.delete(namespace, recursive=True)
        for client in (first, second):
            session.close(client)


def test_a_rotated_key_is_refused_and_the_new_one_keeps_the_grants(one_queue: LocalCluster):
    cluster = one_queue
    gcm = ["--gcm", cluster.gcm]
    old = _principal(cluster, "rotating", "q1", "publish")
    assert _as(cluster, old, "pub", "q1", "--count", "1", "--acks", "leader", *gcm).returncode == 0
    new = cluster.tmp / "rotating-2.json"
    where = ["--zk", cluster.zk, "--namespace", cluster.namespace]
    rotated = cluster.cli("keys", "rotate", "rotating", "--out", str(new), *where)
    assert rotated.returncode == 0, rotated.stderr
    assert stat.S_IMODE(new.stat().st_mode) == 0o600

    def publishes(credentials: Path) -> int:
        return int(_as(cluster, credentials, "pub", "q1", "--count", "1", "--acks", "leader",
                       *gcm, timeout_s=30).returncode)  # fmt: skip

    wait_for(lambda: publishes(old) == 77, 15, "the old key refused")
    wait_for(lambda: publishes(new) == 0, 15, "the new key publishing, with the old grant")
    missing = cluster.cli("keys", "rotate", "nobody-here", "--out", str(cluster.tmp / "n.json"),
                          *where)  # fmt: skip
    assert missing.returncode != 0 and "no principal nobody-here" in missing.stderr
    assert not (cluster.tmp / "n.json").exists()
