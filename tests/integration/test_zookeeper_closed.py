"""Issue 31: the ZooKeeper `roq up` starts is closed to clients without the cluster's credential
(finding 2), and what `roq up` writes is its user's alone; a process logs a bounded number of
refusal lines whatever the keys (finding 8). docs/security.md §4.

One `roq up` for the module (its own ZooKeeper, which its GCM closes: zk.close.root), attacked
by a raw anonymous kazoo client as a stranger on the network would; the cluster must serve on.
"""

from __future__ import annotations

import json
import socket
import stat
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import zmq
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from test_resume import Up
from zmq.utils.monitor import parse_monitor_message

from roq.coordination import session
from roq.coordination.paths import Paths
from roq.coordination.principals import PrincipalStore, principal_node
from roq.protocol.ports import GcmPort, port_at
from roq.protocol.principals import Principal
from roq.testing.cluster import LocalCluster, PortBlocks
from roq.transport import security

pytestmark = pytest.mark.integration


class Cluster:
    """The module's `roq up` and the helper whose keys and CLI it uses."""

    def __init__(self, up: Up, helper: LocalCluster):
        self.up, self.helper = up, helper
        defines = dict(a.split("=", 1) for a in up.args if "=" in a)
        self.zk, self.namespace = defines["zk.servers"], defines["zk.namespace"]
        self.gcm = up.gcm

    def cli(self, *args: str) -> Any:
        return self.helper.cli(*args, timeout_s=60)

    def keys(self, *args: str) -> Any:
        return self.cli("keys", *args, "--zk", self.zk, "--namespace", self.namespace)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory, port_blocks: PortBlocks) -> Iterator[Cluster]:
    tmp = tmp_path_factory.mktemp("closed")
    helper = LocalCluster(tmp, "", port_blocks)  # its keys and CLI; it starts nothing
    local = Up(tmp, port_blocks)
    try:
        local.start()
        yield Cluster(local, helper)
    finally:
        local.stop()


@pytest.fixture
def stranger(up: Cluster) -> Iterator[Any]:
    """A kazoo client with no credential at all (what anyone who reaches the port can open)."""
    client = KazooClient(hosts=up.zk, timeout=4.0)
    client.start(timeout=10)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def _refused(what: Callable[[], Any]) -> None:
    with pytest.raises(NoAuthError):
        what()


def test_a_stranger_creates_nothing_at_the_root_nor_in_the_namespace(
    up: Cluster, stranger: Any
) -> None:
    """The fill (80 MB in 1.2 s until OutOfMemoryError) and the squat, before: each create
    refused, bounded here to 8 MB of attempts, and the cluster serves on."""
    payload = b"x" * (512 * 1024)
    for n in range(16):
        _refused(lambda n=n: stranger.create(f"/fill-{n}", payload))
        _refused(lambda n=n: stranger.create(f"{up.namespace}/fill-{n}", payload))
    _refused(lambda: stranger.create("/roq-other", b""))  # another cluster's namespace, squatted
    _refused(lambda: stranger.create("/zookeeper/squat", b""))
    _refused(lambda: stranger.create("/zookeeper/quota/roq-other", b""))  # a quota, set
    _refused(lambda: stranger.get_children("/"))
    member = session.connect(up.zk, 4000, auth=up.helper.zk_auth)
    try:
        assert sorted(member.get_children("/")) == sorted(["zookeeper", up.namespace[1:]])
        acl = session.digest_acl(str(up.helper.zk_auth))
        for path in session.CLOSED_ROOTS:
            assert member.get_acls(path)[0] == acl, path
    finally:
        session.close(member)
    assert "closed to every client without this cluster's credential" in up.up.log_text()
    _serves(up)


def _serves(up: Cluster) -> None:
    """A queue created, published to and read back: the cluster serves."""
    name = f"q{uuid.uuid4().hex[:6]}"
    made = up.cli("queue", "create", name, "--gcm", up.gcm)
    assert made.returncode == 0, made.stderr + up.up.log_text()[-3000:]
    sent = up.helper.cli("pub", name, "--acks", "leader", "--gcm", up.gcm, input_text="a\nb\n")
    assert sent.returncode == 0, sent.stderr
    read = up.cli("sub", name, "--from-beginning", "--count", "2", "--timeout", "30",
                  "--gcm", up.gcm)  # fmt: skip
    assert read.returncode == 0 and read.stdout.split() == ["a", "b"], read.stderr


def _outcome(what: Callable[[], Any]) -> str:
    try:
        return repr(what())
    except Exception as error:  # the outcome is what is compared
        return type(error).__name__


def test_a_stranger_cannot_tell_a_principal_from_a_missing_one(up: Cluster, stranger: Any) -> None:
    """ZooKeeper answers `exists` without any permission, and a read tells a missing znode
    (NoNode) from a forbidden one (NoAuth): the table named its znodes by the principal's name,
    so `exists <ns>/security/principals/admin` told anyone that admin is a principal."""
    created = up.keys("create", "alice", "--out", str(up.helper.tmp / "alice.json"))
    assert created.returncode == 0, created.stderr
    table = Paths(up.namespace).principals

    def probes(name: str) -> list[str]:
        path = f"{table}/{name}"
        return [
            _outcome(lambda: stranger.exists(path)),
            _outcome(lambda: stranger.get(path)),
            _outcome(lambda: stranger.set(path, b"")),
            _outcome(lambda: stranger.get_acls(path)),
            _outcome(lambda: stranger.delete(path)),
            _outcome(lambda: stranger.create(path, b"")),
        ]

    missing = probes(f"nobody-{uuid.uuid4().hex[:8]}")
    for name in ("admin", "alice"):
        assert probes(name) == missing, name
    _refused(lambda: stranger.get_children(table))
    # the names are in the records, for the cluster's credential
    listed = up.keys("list")
    assert listed.returncode == 0 and "alice" in listed.stdout, listed.stderr
    assert up.keys("revoke", "alice").returncode == 0
    auth = str(up.helper.zk_auth)
    member = session.connect(up.zk, 4000, auth=auth)
    try:
        assert member.get_children(table) == [principal_node("admin", auth)]
    finally:
        session.close(member)


# Not `srvr`: ZooKeeper 3.8 enables it whatever the whitelist says (zkServer.sh status asks it);
# it tells the version, mode and counts, not who is connected or what they watch.
FOUR_LETTER_WORDS = ("stat", "mntr", "conf", "cons", "envi", "wchs", "wchc", "dump", "crst")


def _ask(zk: str, word: str) -> bytes:
    host, _, port = zk.partition(":")
    with socket.create_connection((host, int(port)), timeout=5) as sock:
        sock.sendall(word.encode())
        return b"".join(iter(lambda: sock.recv(4096), b""))


def test_only_ruok_is_answered_among_the_four_letter_words(up: Cluster) -> None:
    """`stat`, `mntr`… told anyone its clients' addresses and sessions (`stat`, `cons`), the
    paths they watch (`wchc`), its environment (`envi`) and configuration (`conf`)."""
    assert _ask(up.zk, "ruok") == b"imok"
    for word in FOUR_LETTER_WORDS:
        answer = _ask(up.zk, word).strip()
        assert answer == f"{word} is not executed because it is not in the whitelist.".encode(), (
            word,
            answer[:200],
        )


def test_300_random_keys_make_a_bounded_number_of_refusal_lines(up: Cluster) -> None:
    """Finding 8: the limit was per key, so whoever holds the cluster's public key (every
    credentials file does) made one log line per random key: 300 lines in 0.5 s."""
    server_key = security.load_credentials(up.helper.credentials).server_public.encode()
    endpoint = f"tcp://127.0.0.1:{port_at(int(up.gcm.rsplit(':', 1)[1]), GcmPort.ADMIN)}"
    before = up.up.log_text().count("a client key unknown to this cluster")
    context = zmq.Context()
    try:
        for _ in range(300):
            _refused_handshake(context, endpoint, server_key)
    finally:
        context.term()
    deadline = time.monotonic() + 5  # the GCM's log lines reach roq up's file
    lines = 0
    while time.monotonic() < deadline:
        lines = up.up.log_text().count("a client key unknown to this cluster") - before
        time.sleep(0.5)
    assert 1 <= lines <= 10, f"{lines} refusal lines for 300 keys"


def _refused_handshake(context: zmq.Context, endpoint: str, server_key: bytes) -> None:
    sock = context.socket(zmq.DEALER)
    sock.linger = 0
    sock.curve_publickey, sock.curve_secretkey = zmq.curve_keypair()
    sock.curve_serverkey = server_key
    events = sock.get_monitor_socket(
        zmq.EVENT_HANDSHAKE_FAILED_AUTH | zmq.EVENT_HANDSHAKE_SUCCEEDED
    )
    try:
        sock.connect(endpoint)
        assert events.poll(5000), "no handshake event within 5 s"
        event = parse_monitor_message(events.recv_multipart())
        assert event["event"] == zmq.EVENT_HANDSHAKE_FAILED_AUTH, event
    finally:
        sock.disable_monitor()
        events.close(0)
        sock.close(0)


def test_what_roq_up_writes_is_its_users_alone(up: Cluster) -> None:
    """Finding 8: its directories were 0755 and ZooKeeper's log 0644 (any local user read the
    cluster's znodes in ZooKeeper's snapshots and the log's client addresses)."""
    data = up.up.data
    exposed = [
        f"{oct(stat.S_IMODE(p.lstat().st_mode))} {p}"
        for p in [data, *data.rglob("*")]
        if not p.is_symlink() and stat.S_IMODE(p.lstat().st_mode) & 0o077
    ]
    assert exposed == [], exposed
    for path in (data, data / "zookeeper", data / "log"):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700, path
    assert stat.S_IMODE((data / "zookeeper" / "zookeeper.log").stat().st_mode) == 0o600
    assert (data / "zookeeper" / "data" / "version-2").is_dir()  # its snapshots and logs


def test_a_table_named_by_name_is_renamed_at_the_next_start(zookeeper: str) -> None:
    """A cluster's table written before (znodes named by the principal) is moved to the digests'
    names by the next GCM or host to start (`seed`), and found by name again."""
    namespace, auth = f"/roq-test-{uuid.uuid4().hex[:10]}", "roq:a-test-credential"
    table = Paths(namespace).principals
    client = session.connect(zookeeper, 4000)  # anonymous: open ACLs, as in a test namespace
    try:
        client.ensure_path(table)
        old = Principal("carol", "k" * 40)
        client.create(f"{table}/carol", json.dumps(old.encode()).encode())
        store = PrincipalStore(client, namespace, auth)
        assert not store.seed([Principal("admin", "a" * 40)])  # not a first start
        assert client.get_children(table) == [principal_node("carol", auth)]
        assert store.get("carol") == old
        assert [p.name for p in store.all()] == ["carol"]
    finally:
        client.delete(namespace, recursive=True)
        session.close(client)
