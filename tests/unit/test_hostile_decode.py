"""Issue 16, items 3, 5 and 6 at the decoders and stores: strings that are not endpoints are
refused where a message is decoded, a REPLICAS without its fields is a bad request, a ZooKeeper
timeout anywhere in the registry is a CoordinationError (the GCM answers `busy`), and a replica
copies only the leaders its monitor assigned to it."""

from __future__ import annotations

import struct
import time
from pathlib import Path
from typing import Any

import pytest
from logutil import batch

from roq import limits
from roq.coordination.paths import Paths
from roq.coordination.registry import Fence, HostRecord, QueueRecord, QueueState, Registry
from roq.coordination.session import ZooKeeperTimeout
from roq.errors import CoordinationError, DecodeError
from roq.exchange.logserver import LogServer
from roq.log import Log, LogSettings
from roq.protocol import bsonmsg
from roq.protocol.endpoints import check_endpoint, parse_endpoint, port_plus
from roq.protocol.messages.control import ReplicaAssignment, Replicas
from roq.protocol.messages.monitor import (
    ExchangeIdentity,
    ExchangeReport,
    ReportedLoad,
    decode_exchange_message,
)
from roq.replication import (
    FAILED,
    OK,
    PROBE,
    WRITE,
    WRITTEN,
    NotAssigned,
    ReplicaStore,
    Replicator,
)
from roq.transport import Kind, new_context, wait_readable
from roq.transport.rpc import answer

GOOD = ["tcp://127.0.0.1:6000", "tcp://localhost:1", "tcp://h-1.example.org:65535",
        "tcp://[::1]:7000"]  # fmt: skip
BAD = [
    "fuzz-front", "", "tcp://", "tcp://1.2.3.4", "tcp://1.2.3.4:", "tcp://1.2.3.4:0",
    "tcp://1.2.3.4:65536", "tcp://1.2.3.4:-1", "tcp://1.2.3.4:+5", "tcp://1.2.3.4: 5",
    "tcp://1.2.3.4:٣", "tcp://1.2.3.4:5_0", "tcp://999.1.1.1:5", "tcp://a b:5", "tcp://-a:5",
    "tcp://a..b:5", "udp://1.2.3.4:5", "tcp://1.2.3.4:5/x", "tcp://[zz]:5", "tcp://:5",
    "tcp://" + "a" * 300 + ":5", "tcp://*:5", "ipc:///tmp/x",
]  # fmt: skip


@pytest.mark.parametrize("text", GOOD)
def test_endpoints_are_accepted(text: str) -> None:
    assert check_endpoint(text) == text
    assert port_plus(text, 0) == text


@pytest.mark.parametrize("text", BAD)
def test_strings_that_are_not_endpoints_are_refused(text: str) -> None:
    with pytest.raises(DecodeError, match="endpoint"):
        parse_endpoint(text)


def test_a_block_must_fit_below_65536() -> None:
    assert parse_endpoint("tcp://1.2.3.4:65532", room=3).port == 65532
    with pytest.raises(DecodeError):
        parse_endpoint("tcp://1.2.3.4:65533", room=3)
    with pytest.raises(DecodeError):
        port_plus("tcp://1.2.3.4:65535", 1)


def _report(**identity: Any) -> dict[str, Any]:
    fields = {"queue": "q1", "exchange_id": "x1", "front": "tcp://127.0.0.1:6000",
              "back": "tcp://127.0.0.1:6001", "period_s": 0.2, "started": time.time(),
              "logged": True, "host": "h1", **identity}  # fmt: skip
    load = ReportedLoad(0.0, 0.0, 0, (), 0.0, 0, 0.0, 0, 0, 0, (), 0)
    return ExchangeReport(ExchangeIdentity(**fields), load).encode()


@pytest.mark.parametrize("field", ["front", "back"])
@pytest.mark.parametrize("value", ["fuzz-front", "tcp://127.0.0.1:65535", "not-an-endpoint"])
def test_a_report_whose_addresses_are_not_endpoints_is_refused_at_decode(
    field: str, value: str
) -> None:
    """Issue 16 item 3: the monitor accepted `Front: "fuzz-front"`, told its subscribers, and
    died two seconds later on int("fuzz-front")."""
    assert decode_exchange_message(_report()).identity.front == "tcp://127.0.0.1:6000"  # type: ignore[union-attr]
    with pytest.raises(DecodeError, match=field.capitalize()):
        decode_exchange_message(_report(**{field: value}))


class _Rep:
    """A REP socket's two calls, for `answer`."""

    def __init__(self, request: dict[str, Any]):
        self.frames = [bsonmsg.encode(request)]
        self.sent: list[bytes] = []

    def recv_multipart(self) -> list[bytes]:
        return self.frames

    def send(self, frame: bytes) -> None:
        self.sent.append(frame)


@pytest.mark.parametrize(
    "entries",
    [[{}], [{"Id": "r1"}], [{"Endpoint": "tcp://127.0.0.1:6003"}],
     [{"Id": "r1", "Endpoint": "fuzz"}], [{"Id": 5, "Endpoint": "tcp://127.0.0.1:6003"}]],
)  # fmt: skip
def test_a_replicas_request_whose_entries_lack_fields_is_a_bad_request(entries: Any) -> None:
    """Issue 16 item 5: the exchange answered `internal error: KeyError: 'Id'`."""
    rep = _Rep({"CMD": 1030, "Replicas": entries})
    answer(rep, lambda request: Replicas.decode(request).encode(), "test", _NoLog())
    reply = bsonmsg.decode_reply(rep.sent[0])
    assert reply["RESULT"] == 1101 and reply["ERROR"] == "bad_request", reply


@pytest.mark.parametrize("leaders", [[""], ["a/b"], ["x@y"], [5], "x1"])
def test_a_replicas_request_with_bad_leaders_is_refused(leaders: Any) -> None:
    with pytest.raises(DecodeError):
        Replicas.decode({"CMD": 1030, "Replicas": [], "Leaders": leaders})


def test_replicas_carry_the_leaders_to_copy_and_older_senders_omit_them() -> None:
    sent = Replicas((ReplicaAssignment("r1", "tcp://127.0.0.1:6003"),), ("l1", "l2"))
    assert Replicas.decode(sent.encode()) == sent
    assert Replicas.decode({"CMD": 1030, "Replicas": []}).leaders is None


class _NoLog:
    def warning(self, *args: Any) -> None:
        pass

    def exception(self, *args: Any) -> None:
        raise AssertionError("a malformed request reached the handler's internal path")


# --- item 5: ZooKeeper timeouts are CoordinationError ------------------------------------------
class _TimingOut:
    """A kazoo client whose every request times out (a stalled ZooKeeper)."""

    client_id = (1, b"")

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any, **kwargs: Any) -> Any:
            raise ZooKeeperTimeout(f"{name}: no answer")

        return call


def test_every_registry_call_turns_a_zookeeper_timeout_into_coordination_error() -> None:
    """Issue 16 item 5: the GCM answered `internal` with a traceback when ZooKeeper timed out
    (a kazoo exception escaped outside the translated reads: `exists` in the rules write)."""
    registry = Registry(_TimingOut(), Paths("/roq-test"))
    fence = Fence("/roq-test/epoch", 1)
    record = QueueRecord("q1", QueueState.RUNNING, "h1")
    calls = [
        registry.ensure_roots, registry.bump_epoch, registry.hosts, registry.queues,
        lambda: registry.host("h1"), lambda: registry.queue("q1"), registry.leader,
        lambda: registry.exchanges("q1"), lambda: registry.port_claims("h1"),
        lambda: registry.rules("q1"), lambda: registry.listeners("q1"),
        lambda: registry.claim_port("h1", 7000, {}), lambda: registry.release_port("h1", 7000),
        lambda: registry.register_host(HostRecord("h1", "127.0.0.1", "tcp://127.0.0.1:1", 1)),
        lambda: registry.create_queue(fence, record),
        lambda: registry.update_queue(fence, record, 0),
        lambda: registry.delete_queue(fence, "q1"),
        lambda: registry.put_rules(fence, "q1", {}),
        lambda: registry.put_listeners(fence, "q1", []),
        lambda: registry.delete_exchange(fence, "q1", "x1"),
        lambda: registry.put_xchange_transaction(fence, "t1", {}),
        lambda: registry.wipe(fence),
    ]  # fmt: skip
    for call in calls:
        with pytest.raises(CoordinationError):
            call()


# --- item 6: a replica copies only its assigned leaders ----------------------------------------
LEADER = b"127.0.0.1-6000-aaaaaa"


def test_a_replica_refuses_leaders_it_was_not_assigned_and_creates_nothing(
    tmp_path: Path,
) -> None:
    """Issue 16 item 6: 300 probes created 255 copy directories for exchanges that do not
    exist, which the monitor then announced to subscribers."""
    store = ReplicaStore(tmp_path, "q", "127.0.0.1-6004-bbbbbb", LogSettings(memory_bytes=0))
    server = LogServer(None, None, "exchange q/r", store)  # type: ignore[arg-type]
    for n in range(300):
        reply = server._replicate([PROBE, b"fz-%d" % n])
        assert reply[:3] == [WRITTEN, b"fz-%d" % n, FAILED] and b"not a leader" in reply[4]
    write = [WRITE, LEADER, struct.pack("<Q", 0), batch(0)]
    assert server._replicate(write)[2] == FAILED, "nothing was assigned yet"
    assert store.ends() == {} and not list(tmp_path.rglob("*@*"))
    store.accept((LEADER.decode(),))
    assert server._replicate(write)[2] == OK
    store.accept(("someone-else",))  # reassigned: the held copy stays readable, no more writes
    with pytest.raises(NotAssigned):
        store.handle([WRITE, LEADER, struct.pack("<Q", len(batch(0))), batch(3)])
    assert store.copy(LEADER.decode()).end_offset == len(batch(0))
    store.close()


def test_a_refused_leader_asks_again_and_catches_up_once_assigned(tmp_path: Path) -> None:
    """A restarted replica refuses its leader until the monitor re-sends the assignment; the
    leader then probes again and back-fills, with nothing lost."""
    leader = Log.open(tmp_path / "leader", LogSettings(memory_bytes=0))
    for n in range(3):
        leader.append(bytearray(batch(n * 3)))
    context = new_context()
    router = context.socket(Kind.ROUTER)
    router.bind("inproc://replica")
    store = ReplicaStore(tmp_path / "copies", "q", "r1", LogSettings(memory_bytes=0))
    server = LogServer(None, leader, "exchange q/r1", store)
    replicator = Replicator(context, "l1", leader, "leader l1")
    replicator.assign([("r1", "inproc://replica")])

    def serve_and_turn() -> None:
        while wait_readable(router, 50):
            peer, *body = router.recv_multipart()
            router.send_multipart([peer, *server._replicate(body)])
        for sock in replicator.sockets():
            if wait_readable(sock, 50):
                replicator.on_answer(sock)
        replicator.backfill()

    try:
        serve_and_turn()
        assert store.ends() == {} and replicator.links["r1"].refused
        store.accept(("l1",))
        deadline = time.monotonic() + 10 * limits.replication_refused_retry_s
        while store.ends().get("l1") != leader.end_offset and time.monotonic() < deadline:
            serve_and_turn()
        assert store.ends() == {"l1": leader.end_offset}
        assert not replicator.links["r1"].refused
    finally:
        replicator.close()
        router.close(0)
        store.close()
        leader.close()
        context.term()
