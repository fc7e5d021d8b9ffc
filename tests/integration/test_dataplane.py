"""The data plane on a real cluster: keys, order, new exchanges, fail-over, relocation, bad input.

Publishers and subscribers run in this process (real sockets), exchanges and monitors are the
processes `roq host` starts.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import json
import os
import signal
import struct
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, ClassVar

import pytest

from roq import limits, replication
from roq.client.consumer import Consumer
from roq.client.live import monitor_status
from roq.client.locate import locate_monitor
from roq.client.publisher import BufferFull, Publisher, PublishTimeout
from roq.client.subscriber import Subscriber, records
from roq.log import format as batchfmt
from roq.protocol import bsonmsg, dataplane
from roq.protocol.commands import MonitorCommand
from roq.protocol.messages.control import MonitoredExchange
from roq.protocol.messages.monitor import ExchangeIdentity, ExchangeReport, ReportedLoad
from roq.protocol.ports import ExchangePort, MonitorPort, sibling
from roq.testing.cluster import LocalCluster, processes_with, wait_for
from roq.transport import Kind, connect, new_context, open_socket

pytestmark = pytest.mark.integration


class Collector(threading.Thread):
    """Runs a Subscriber in its own thread (which owns it) and keeps what it received. Every
    collector started is stopped when its test ends (`collectors_stopped`), passed or failed:
    one left running after a failure kept its subscriber asking a dead cluster, and the
    worker later hung for good in a zmq context's `term()` at garbage collection."""

    running: ClassVar[list[Collector]] = []

    def __init__(self, cluster: LocalCluster, queue: str, key: bytes = b""):
        super().__init__(daemon=True)
        self.sub = Subscriber(queue, key, gcm=cluster.gcm)
        self.stop = threading.Event()
        self.by_stream: dict[tuple[bytes, bytes], list[int]] = collections.defaultdict(list)
        self.payloads: list[bytes] = []
        self.batch_counts: dict[tuple[bytes, bytes], list[int]] = collections.defaultdict(list)
        self.count = 0

    def run(self) -> None:
        try:
            while not self.stop.is_set():
                for delivery in self.sub.poll(50):
                    stream = (delivery.header.producer_id, delivery.header.key)
                    self.batch_counts[stream].append(delivery.header.count - delivery.skip)
                    for record in records(delivery):
                        self.by_stream[(record.producer_id, record.key)].append(record.seq)
                        self.payloads.append(record.payload)
                        self.count += 1
        finally:
            self.sub.close()

    def start(self) -> None:
        Collector.running.append(self)
        super().start()

    def finish(self) -> None:
        self.stop.set()
        self.join(10)


@pytest.fixture(autouse=True)
def collectors_stopped() -> Iterator[None]:
    yield
    while Collector.running:
        Collector.running.pop().finish()


@pytest.fixture
def queue(cluster: LocalCluster) -> Iterator[str]:
    cluster.start_gcm()
    cluster.start_host("h1", **{"exchange.max.perhost": 4, "exchange.warmup": 300})
    cluster.wait_ready()
    with cluster.admin() as admin:
        admin.create_queue("q1")
    yield "q1"


def _exchanges(cluster: LocalCluster, queue: str) -> list[dict[str, Any]]:
    with cluster.admin() as admin:
        status = admin.status()
    return next(q.fields() for q in status.queues if q.info.name == queue)["Exchanges"]


def _add_exchange(cluster: LocalCluster, queue: str, txid: str) -> dict[str, Any]:
    with cluster.admin() as admin:
        reply = admin.create_exchange(queue, txid)
    return reply.exchange.fields()


def _monitored(cluster: LocalCluster, queue: str) -> list[MonitoredExchange]:
    """The queue's exchanges as its monitor knows them (none while it does not answer)."""
    with cluster.admin() as admin:
        monitor = next(q.info for q in admin.status().queues if q.info.name == queue).monitor_host
    live = monitor_status(monitor)
    return list(live.exchanges) if live else []


def _placeable(cluster: LocalCluster, queue: str, exchange_id: str) -> bool:
    """Whether the monitor places publishers on the exchange (joined, or past its warm-up)."""
    return any(x.exchange_id == exchange_id and x.placeable for x in _monitored(cluster, queue))


def _assert_exact(collector: Collector, expected: dict[tuple[bytes, bytes], int]) -> None:
    got = dict(collector.by_stream)
    assert set(got) == set(expected), (
        f"streams differ: extra {set(got) - set(expected)}, missing {set(expected) - set(got)}"
    )
    for stream, count in expected.items():
        assert got[stream] == list(range(count)), f"stream {stream} lost, reordered or doubled"


def test_keys_order_and_exactly_once(cluster: LocalCluster, queue: str):
    collectors = {key: Collector(cluster, queue, key) for key in (b"", b"a", b"a.x", b"b")}
    for collector in collectors.values():
        collector.start()
    wait_for(lambda: [x.subscriptions for x in _monitored(cluster, queue)] == [len(collectors)],
             10, "every collector joined the exchange")  # fmt: skip
    sent: dict[tuple[bytes, bytes], int] = {}
    publishers = [Publisher(queue, gcm=cluster.gcm, linger_ms=1) for _ in range(3)]
    for index, publisher in enumerate(publishers):
        for key in (b"a.x.1", b"a.y", b"b", b"c"):
            for n in range(300 + index):
                publisher.send(b"%d" % n, key)
            sent[(publisher.producer_id, key)] = 300 + index
    for publisher in publishers:
        publisher.close()
    total = sum(sent.values())
    wait_for(lambda: collectors[b""].count >= total, 15, "everything delivered")
    time.sleep(0.3)  # not arriving: anything extra (a duplicate) would arrive now
    for key, collector in collectors.items():
        collector.finish()
        _assert_exact(collector, {s: n for s, n in sent.items() if s[1].startswith(key)})


def test_an_exchange_added_later_delivers_to_connected_subscribers(
    cluster: LocalCluster, queue: str
):
    collector = Collector(cluster, queue)
    collector.start()
    first = Publisher(queue, gcm=cluster.gcm)
    added = _add_exchange(cluster, queue, "tx-added")
    wait_for(lambda: len(collector.sub.exchanges) == 2, 10, "subscriber joined the new exchange")
    # once the monitor heard of the subscription, the next publisher goes to the new exchange
    wait_for(lambda: _placeable(cluster, queue, added["Id"]), 10, "the new exchange placeable")
    second = Publisher(queue, gcm=cluster.gcm)
    assert second.exchange == added["Front"], "the new publisher should go to the idle exchange"
    _both_deliver_exactly(collector, first, second)


def _both_deliver_exactly(collector: Collector, first: Publisher, second: Publisher) -> None:
    """500 messages from each publisher, then every stream arrives whole and in order."""
    for n in range(500):
        first.send(b"%d" % n, b"k")
        second.send(b"%d" % n, b"k")
    first.close()
    second.close()
    wait_for(lambda: collector.count >= 1000, 10, "both publishers delivered")
    collector.finish()
    _assert_exact(collector, {(first.producer_id, b"k"): 500, (second.producer_id, b"k"): 500})


def test_a_new_exchange_takes_publishers_once_the_subscribers_joined_it(cluster: LocalCluster):
    cluster.start_gcm()
    cluster.start_host("h1", **{"exchange.max.perhost": 4, "exchange.warmup": 60_000})
    cluster.wait_ready()
    with cluster.admin() as admin:
        admin.create_queue("q1")
    [old] = _exchanges(cluster, "q1")
    context = new_context()
    stray = open_socket(context, Kind.SUB, subscribe=b"")  # joined the old exchange only
    connect(stray, old["Back"])
    collector = Collector(cluster, "q1")
    collector.start()
    first = Publisher("q1", gcm=cluster.gcm)
    added = _add_exchange(cluster, "q1", "tx-joined")

    with cluster.admin() as admin:
        monitor = next(q.info for q in admin.status().queues if q.info.name == "q1").monitor_host

    def new_one() -> dict[str, Any]:  # as the monitor sees it
        live = monitor_status(monitor)
        exchanges = live.exchanges if live else ()
        return next(x.fields() for x in exchanges if x.exchange_id == added["Id"])

    wait_for(lambda: new_one()["Subscriptions"] == 1, 10, "the collector joined the new exchange")
    time.sleep(1.0)  # not arriving: reports come every 0.5 s, time enough for a wrong "placeable"
    assert not new_one()["Placeable"], "one subscriber of the queue has not joined it"
    stray.close(0)  # the one that had not joined leaves: now every subscriber has joined
    context.term()
    wait_for(lambda: new_one()["Placeable"], 5, "placeable long before the 60 s warm-up")
    second = Publisher("q1", gcm=cluster.gcm)
    assert second.exchange == added["Front"], "the new publisher should go to the idle exchange"
    _both_deliver_exactly(collector, first, second)


def test_killed_exchange_publishers_fail_over_within_three_heartbeats(
    cluster: LocalCluster, queue: str
):
    _add_exchange(cluster, queue, "tx-2")
    collector = Collector(cluster, queue)
    collector.start()
    wait_for(lambda: len(collector.sub.exchanges) == 2, 10, "subscriber sees both exchanges")
    wait_for(lambda: [x.placeable for x in _monitored(cluster, queue)] == [True, True], 10,
             "both exchanges placeable")  # fmt: skip
    publishers = [Publisher(queue, gcm=cluster.gcm, linger_ms=1) for _ in range(4)]
    fronts = {p.exchange for p in publishers}
    assert len(fronts) == 2, "cold start spreads publishers over both exchanges"
    victim_front = publishers[0].exchange
    assert victim_front is not None
    victim = next(x for x in _exchanges(cluster, queue) if x["Front"] == victim_front)
    [pid] = processes_with(victim["Id"])
    os.kill(pid, signal.SIGKILL)
    killed_at = time.monotonic()
    moved = [p for p in publishers if p.exchange == victim_front]
    wait_for(lambda: all(p.moves >= 1 for p in moved), 5, "fail-over")
    took = time.monotonic() - killed_at
    print(f"fail-over took {took:.2f} s")  # shown with -s: compared before and after changes
    # 3 heartbeats of 0.2 s, plus the monitor's 0.1 s timer tick and the test's own polling
    assert took <= 1.5, f"fail-over took {took:.2f} s (heartbeat 0.2 s)"
    before = collector.count
    for publisher in publishers:
        for n in range(200):
            publisher.send(b"after %d" % n, b"k")
        publisher.close()
    wait_for(lambda: collector.count >= before + 800, 10, "messages after the fail-over")
    collector.finish()
    for publisher in publishers:  # everything sent after the fail-over arrived, in order
        seqs = collector.by_stream[(publisher.producer_id, b"k")]
        assert seqs[-200:] == list(range(seqs[-1] - 199, seqs[-1] + 1))


class _StalledExchange:
    """Plays an exchange towards the queue's real monitor over its real report socket: one
    report (it joins), then only pulses, as the pulse thread of an exchange whose main loop is
    stuck on a saturated disk sends them."""

    def __init__(self, cluster: LocalCluster, queue: str):
        self.monitor = locate_monitor(queue, gcm=cluster.gcm)
        self.context = new_context()
        self.reports = open_socket(self.context, Kind.PUB)
        connect(self.reports, self.monitor.base)
        self.placement = open_socket(self.context, Kind.REQ, rcvtimeo_ms=2000, sndtimeo_ms=2000)
        connect(self.placement, self.monitor.at(MonitorPort.PLACEMENT))
        port = 1 + max(int(x["Front"].rpartition(":")[2]) for x in _exchanges(cluster, queue))
        self.identity = {
            "Id": "fake-x", "Front": f"tcp://127.0.0.1:{port}", "Started": time.time()
        }  # fmt: skip
        self.loop_turned = time.monotonic()

    def report(self) -> None:
        identity = ExchangeIdentity(
            "q1", self.identity["Id"], self.identity["Front"], "tcp://127.0.0.1:1", 0.2,
            self.identity["Started"], False, "fake",
        )  # fmt: skip
        idle = ReportedLoad(0.0, 0.0, 0, (), 0.0, 0, 0.0, 0, 0, 0, (), 0)
        self.reports.send(bsonmsg.encode(ExchangeReport(identity, idle).encode()))
        self.loop_turned = time.monotonic()

    def pulse(self, loop_age: float | None = None, started: float | None = None) -> None:
        age = time.monotonic() - self.loop_turned if loop_age is None else loop_age
        doc = {"CMD": int(MonitorCommand.EXCHANGE_PULSE), **self.identity, "LoopAge": age}
        if started is not None:
            doc["Started"] = started
        self.reports.send(bsonmsg.encode(doc))

    def known(self) -> bool:
        """Whether the monitor still lists this exchange to subscribers."""
        self.placement.send(bsonmsg.encode({"CMD": int(MonitorCommand.SUBSCRIBER_INIT)}))
        reply = bsonmsg.decode_reply(self.placement.recv())
        return any(x["Id"] == "fake-x" for x in reply["Exchanges"])

    def close(self) -> None:
        self.reports.close(0)
        self.placement.close(0)
        self.context.term()


def test_an_exchange_whose_loop_stalls_but_pulses_is_not_declared_dead(
    cluster: LocalCluster, queue: str
):
    """Reports stop for 10 heartbeats (3 make an exchange dead) while pulses go on: the monitor
    keeps it. Pulses from another incarnation, or saying the loop is stuck past
    `limits.exchange_loop_stall_max_ms`, do not count, and it is declared dead."""
    with cluster.as_cluster():  # it plays an exchange: only the cluster's key may report
        fake = _StalledExchange(cluster, queue)
    try:
        # the PUB connection is asynchronous: report until it is heard
        wait_for(lambda: fake.report() or fake.known(), 5, "the fake exchange's report heard")
        stalled_until = time.monotonic() + 2.0
        while time.monotonic() < stalled_until:
            fake.pulse()
            time.sleep(0.2)  # not arriving: the exchange's death, while its pulse goes on
            assert fake.known(), "declared dead while its pulse went on"
        wrong_process = fake.identity["Started"] + 1
        stuck_for = limits.exchange_loop_stall_max_ms / 1000 + 1

        def dead_despite(pulse: Callable[[], None]) -> bool:
            pulse()
            return not fake.known()

        for pulse in (
            lambda: fake.pulse(started=wrong_process),
            lambda: fake.pulse(loop_age=stuck_for),
        ):
            fake.report()
            dead = functools.partial(dead_despite, pulse)
            wait_for(dead, 2.0, "the exchange dead despite pulses that should not count", 0.2)
    finally:
        fake.close()


def test_heavy_publisher_is_reallocated_without_loss_or_reordering(cluster: LocalCluster):
    """RoQ's Test117b, thresholds lowered: 1 heavy + 3 light publishers, a second exchange."""
    cluster.start_gcm()
    cluster.start_host(
        "h1",
        **{
            "exchange.max.perhost": 4,
            "exchange.warmup": 200,
            "exchange.max.throughput": 200_000,  # bytes/s
            "relocate.coldstart": 0.0,
            "relocate.hysteresis": 2,
            "relocate.cooldown": 2000,
        },
    )
    cluster.wait_ready()
    with cluster.admin() as admin:
        admin.create_queue("q1")
    collector = Collector(cluster, "q1")
    collector.start()
    heavy = Publisher("q1", gcm=cluster.gcm, linger_ms=1)
    light = [Publisher("q1", gcm=cluster.gcm, linger_ms=1) for _ in range(3)]
    start_front = heavy.exchange
    added = _add_exchange(cluster, "q1", "tx-relief")
    wait_for(lambda: len(collector.sub.exchanges) == 2, 10, "subscriber on both exchanges")
    sent = collections.Counter[Any]()

    def moved_under_load() -> bool:  # each 0.05 s: ~400 KB/s from the heavy one, ~4 KB/s light
        for _ in range(20):
            heavy.send(b"h" * 1000, b"k")
            sent[heavy.producer_id] += 1
        for publisher in light:
            publisher.send(b"l" * 200, b"k")
            sent[publisher.producer_id] += 1
        return heavy.exchange != start_front

    with contextlib.suppress(TimeoutError):  # the assertion below says what did not happen
        wait_for(moved_under_load, 15, "the heavy publisher moved", interval_s=0.05)
    assert heavy.exchange == added["Front"], f"heavy publisher not moved\n{cluster.logs()}"
    assert all(p.exchange == start_front for p in light), "only the heavy publisher moves"
    for _ in range(200):
        heavy.send(b"h" * 1000, b"k")
        sent[heavy.producer_id] += 1
    for publisher in [heavy, *light]:
        publisher.close()
    total = sum(sent.values())
    wait_for(lambda: collector.count >= total, 15, "all messages delivered")
    collector.finish()
    _assert_exact(collector, {(pid, b"k"): n for pid, n in sent.items()})


def test_bad_frames_are_counted_and_dropped_and_the_exchange_keeps_serving(
    cluster: LocalCluster, queue: str
):
    [exchange] = _exchanges(cluster, queue)
    context = new_context()
    raw = open_socket(context, Kind.DEALER)
    connect(raw, exchange["Front"])
    good = batchfmt.encode_batch(b"p" * 16, 0, b"k", [b"hello"], [time.time_ns() // 1000])
    wrong_version = bytearray(good)
    wrong_version[17] = 9
    oversized = bytearray(good) + bytes(5 * 1024 * 1024)
    oversized[0:4] = (len(oversized) - 4).to_bytes(4, "little")
    bad_frames = [
        [b"B", good[:-3]],  # truncated batch
        [b"B", good, b"extra"],  # wrong frame count
        [b"Z", good],  # unknown kind
        [b"B", bytes(wrong_version)],  # unknown version (and so a CRC mismatch)
        [b"B", oversized],  # a 5 MiB message
        [b"B"],
    ]
    for frames in bad_frames:
        raw.send_multipart(frames)
    collector = Collector(cluster, queue)
    collector.start()
    wait_for(lambda: [x.subscriptions for x in _monitored(cluster, queue)] == [1], 10,
             "the collector joined the exchange")  # fmt: skip
    with Publisher(queue, gcm=cluster.gcm) as publisher:
        for n in range(100):
            publisher.send(b"%d" % n)
    wait_for(lambda: collector.count >= 100, 10, "good messages after bad frames")
    collector.finish()
    raw.close(0)
    log_text = cluster.logs()
    assert log_text.count("dropped a bad frame") >= len(bad_frames), log_text
    assert "exceeds the" in log_text and "unknown format version 9" in log_text


def test_bad_requests_on_the_log_port_are_refused_and_the_exchange_keeps_serving(
    cluster: LocalCluster, queue: str
):
    [exchange] = _exchanges(cluster, queue)
    context = new_context()
    raw = open_socket(context, Kind.DEALER, rcvtimeo_ms=5000)
    connect(raw, sibling(exchange["Front"], ExchangePort.FRONT, ExchangePort.LOG))
    read_from_0 = dataplane.read_request(0, 4096)
    offset = struct.pack("<Q", 0)
    bad_requests = [
        [*read_from_0, b"a\0b"],  # a log read of a leader id with a NUL byte
        [*read_from_0, b"../../escape"],  # ... and one that would leave the log directory
        [replication.WRITE, b"../escape", offset, b"x"],
        [replication.RESTART, b"x@y", offset],
        [replication.RESTART, b"leader"],  # a frame short
        [replication.PROBE, b""],
    ]
    for frames in bad_requests:
        raw.send_multipart(frames)
        reply = raw.recv_multipart()
        assert reply[0] in (b"r", replication.WRITTEN), reply
        assert reply[1] == dataplane.READ_ERROR or reply[2] == replication.FAILED, reply
    raw.send_multipart(dataplane.read_request(0, 4096))  # still serving
    assert raw.recv_multipart()[0] == b"r"
    raw.close(0)
    context.term()
    assert not list(cluster.tmp.rglob("escape*")), "a directory outside the log tree"
    assert processes_with(exchange["Id"]), "the exchange keeps serving"


@pytest.mark.parametrize("on_full", ["raise", "block"])
def test_a_full_buffer_pushes_back_and_a_refused_send_is_not_queued(
    cluster: LocalCluster, on_full: str
):
    """The queue's only exchange is frozen (SIGSTOP): the publisher's buffer fills, send()
    raises, and after SIGCONT exactly the messages whose send() returned are delivered."""
    cluster.start_gcm()
    # The monitor must not declare the frozen exchange dead while the buffer fills.
    cluster.start_host("h1", **{"monitor.dead.heartbeats": 100})
    cluster.wait_ready()
    with cluster.admin() as admin:
        admin.create_queue("q1")
    collector = Collector(cluster, "q1")
    collector.start()
    wait_for(lambda: len(collector.sub.exchanges) == 1, 10, "subscriber joined")
    publisher = Publisher(
        "q1", gcm=cluster.gcm, linger_ms=0, buffer_bytes=1 << 20, on_full=on_full, block_ms=300
    )
    [pid] = processes_with(_exchanges(cluster, "q1")[0]["Id"])
    os.kill(pid, signal.SIGSTOP)
    try:
        taken = _send_until_refused(publisher, payload=b"x" * 8192, limit=20_000)
    finally:
        os.kill(pid, signal.SIGCONT)
    publisher.close()
    assert publisher.sent_messages == taken, "a refused message must not be sent"
    wait_for(lambda: collector.count >= taken, 15, "every accepted message delivered")
    time.sleep(0.3)  # not arriving: a refused message sent anyway would arrive now
    collector.finish()
    _assert_exact(collector, {(publisher.producer_id, b"k"): taken})


def _send_until_refused(publisher: Publisher, payload: bytes, limit: int) -> int:
    for taken in range(limit):
        try:
            publisher.send(payload, b"k")
        except (BufferFull, PublishTimeout) as error:
            expected = BufferFull if publisher.on_full == "raise" else PublishTimeout
            assert type(error) is expected
            return taken
    raise AssertionError(f"{limit} messages of {len(payload)} B taken by a frozen exchange")


def test_a_message_too_big_for_the_open_batch_starts_a_new_one(cluster: LocalCluster, queue: str):
    """A 4 MiB message after 1 MiB pending for its key: the pending batch leaves alone, the big
    message in the next one; each message arrives once, in order."""
    collector = Collector(cluster, queue)
    collector.start()
    wait_for(lambda: len(collector.sub.exchanges) == 1, 10, "subscriber joined")
    publisher = Publisher(queue, gcm=cluster.gcm, batch_bytes=8 << 20, linger_ms=5000)
    sizes = [1 << 20, 4 << 20, 10]
    for n, size in enumerate(sizes):
        publisher.send(bytes([n]) * size, b"k")
    publisher.close()
    wait_for(lambda: collector.count >= len(sizes), 15, "all three delivered")
    time.sleep(0.3)  # not arriving: a duplicate would arrive now
    collector.finish()
    _assert_exact(collector, {(publisher.producer_id, b"k"): len(sizes)})
    assert [len(p) for p in collector.payloads] == sizes


def test_linger_zero_sends_alone_when_idle_and_together_when_busy(
    cluster: LocalCluster, queue: str
):
    """linger_ms=0 never makes a message wait, yet does not cost a frame per message when the
    caller is faster than the socket; batch_bytes=1 does cost one."""
    collector = Collector(cluster, queue)
    collector.start()
    wait_for(lambda: len(collector.sub.exchanges) == 1, 10, "subscriber joined")
    publisher = Publisher(queue, gcm=cluster.gcm, linger_ms=0)
    for n in range(3):
        publisher.send(b"%d" % n, b"k")
        publisher.flush()
    assert publisher.sent_batches == 3, "an idle publisher sends each message on its own"
    publisher.send_many([b"%d" % n for n in range(3, 20_003)], b"k")  # faster than any socket
    publisher.close()
    assert publisher.sent_batches <= 3 + 10, f"{publisher.sent_batches} batches for 20,000"
    strict = Publisher(queue, gcm=cluster.gcm, linger_ms=0, batch_bytes=1)
    strict.send_many([b"s"] * 50, b"k")
    strict.close()
    assert strict.sent_batches == 50
    wait_for(lambda: collector.count >= 20_053, 15, "everything delivered")
    time.sleep(0.3)  # not arriving: a duplicate would arrive now
    collector.finish()
    _assert_exact(
        collector, {(publisher.producer_id, b"k"): 20_003, (strict.producer_id, b"k"): 50}
    )
    assert collector.batch_counts[(strict.producer_id, b"k")] == [1] * 50


def test_send_many_cuts_batches_where_send_does(cluster: LocalCluster, queue: str):
    """send_many's run-at-a-time path and send's message-at-a-time path seal at the same
    messages: a batch closes with the message that takes it to batch_bytes."""
    collector = Collector(cluster, queue)
    collector.start()
    wait_for(lambda: len(collector.sub.exchanges) == 1, 10, "subscriber joined")
    sizes = [(n * 37) % 300 for n in range(2_000)]  # 0..299 bytes, irregular
    one, many = (
        Publisher(queue, gcm=cluster.gcm, batch_bytes=1000, linger_ms=60_000) for _ in range(2)
    )
    for n, size in enumerate(sizes):
        one.send(bytes([n % 256]) * size, b"k")
    many.send_many([bytes([n % 256]) * size for n, size in enumerate(sizes[:700])], b"k")
    many.send_many([bytes([n % 256]) * size for n, size in enumerate(sizes)][700:], b"k")
    one.close()
    many.close()
    wait_for(lambda: collector.count >= 2 * len(sizes), 15, "everything delivered")
    time.sleep(0.3)  # not arriving: a duplicate would arrive now
    collector.finish()
    expected = {(one.producer_id, b"k"): len(sizes), (many.producer_id, b"k"): len(sizes)}
    _assert_exact(collector, expected)
    cuts = collector.batch_counts[(one.producer_id, b"k")]
    assert collector.batch_counts[(many.producer_id, b"k")] == cuts
    assert len(cuts) > 100 and sum(cuts) == len(sizes)


def test_a_subscriber_that_joins_an_added_exchange_late_misses_nothing(cluster: LocalCluster):
    """A subscriber (start "now") whose thread was busy while an exchange was added and took a
    publisher: when it joins that exchange it reads what it missed from the exchange's log."""
    cluster.start_gcm()
    cluster.start_host("h1", **{"exchange.max.perhost": 4, "exchange.warmup": 200})
    cluster.wait_ready()
    with cluster.admin() as admin:
        admin.create_queue("q1")
    collector = Collector(cluster, "q1")  # joined the first exchange; not polled until start()
    first = Publisher("q1", gcm=cluster.gcm)
    added = _add_exchange(cluster, "q1", "tx-late")
    # past the 200 ms warm-up: placeable although the subscriber never joined
    wait_for(lambda: _placeable(cluster, "q1", added["Id"]), 10, "the new exchange placeable")
    second = Publisher("q1", gcm=cluster.gcm)
    assert second.exchange == added["Front"], "the new publisher should go to the idle exchange"
    for n in range(500):
        first.send(b"%d" % n, b"k")
        second.send(b"%d" % n, b"k")
    first.close()
    second.close()
    collector.start()  # now it reads its notices and joins the new exchange
    wait_for(lambda: collector.count >= 1000, 15, "both publishers delivered")
    time.sleep(0.3)  # not arriving: a duplicate would arrive now
    collector.finish()
    _assert_exact(collector, {(first.producer_id, b"k"): 500, (second.producer_id, b"k"): 500})


def test_one_publisher_shared_by_eight_threads_loses_and_reorders_nothing(
    cluster: LocalCluster, queue: str
):
    """The HTTP gateway's use: 8 threads share one Publisher (acks) and one routing key, each
    mixing send, send_many and flush. Every flush returns (every batch confirmed), the stream
    holds every message once, and each thread's messages arrive in the order it sent them."""
    collector = Collector(cluster, queue)
    collector.start()
    wait_for(lambda: len(collector.sub.exchanges) == 1, 10, "subscriber joined")
    publisher = Publisher(queue, gcm=cluster.gcm, acks="leader", linger_ms=0)
    threads, rounds, errors = 8, 150, []
    start = threading.Barrier(threads)

    def hammer(thread: int) -> None:
        try:
            start.wait(10)
            n = 0
            for round_ in range(rounds):
                if round_ % 3 == 0:
                    publisher.send(b"%d:%d:" % (thread, n) + b"x" * 100, b"k")
                    n += 1
                else:
                    publisher.send_many(
                        [b"%d:%d:" % (thread, n + i) + b"x" * 100 for i in range(round_ % 7 + 1)],
                        b"k",
                    )
                    n += round_ % 7 + 1
                publisher.flush(10)
        except BaseException as error:  # the test thread reports it
            errors.append(error)

    workers = [threading.Thread(target=hammer, args=(t,)) for t in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join(60)
    assert not errors, f"{len(errors)} thread(s) failed: {errors[0]!r}"
    sent = publisher.sent_messages
    assert publisher.confirmed_batches == publisher.sent_batches
    publisher.close()
    wait_for(lambda: collector.count >= sent, 15, "everything delivered")
    time.sleep(0.3)  # not arriving: a duplicate would arrive now
    collector.finish()
    _assert_exact(collector, {(publisher.producer_id, b"k"): sent})
    per_thread: dict[int, list[int]] = collections.defaultdict(list)
    for payload in collector.payloads:
        thread, n, _ = payload.split(b":")
        per_thread[int(thread)].append(int(n))
    expected = sum(1 if r % 3 == 0 else r % 7 + 1 for r in range(rounds))
    for thread in range(threads):
        assert per_thread[thread] == list(range(expected)), f"thread {thread}: lost or reordered"


def test_v2_messages_carry_headers_ids_and_times_to_subscribers_the_log_and_roq_sub(
    cluster: LocalCluster, queue: str
):
    """Log format v2 end to end: a publisher with headers, ids and times (per message with
    send, shared with send_many) beside a v1 publisher on the same exchange; a live subscriber
    and one reading the log from the beginning see every field, v1 messages without any, and
    `roq sub --meta` prints them. A message expiring in an hour with a not-before time in the past
    is delivered at once (their enforcement: test_ttl.py)."""
    collector = Collector(cluster, queue)
    collector.start()
    wait_for(lambda: [x.subscriptions for x in _monitored(cluster, queue)] == [1], 10,
             "the collector joined the exchange")  # fmt: skip
    ids = [batchfmt.new_message_id() for _ in range(50)]
    past = time.time_ns() // 1000 - 10**6
    later = past + 3_600 * 10**6
    with (
        Publisher(queue, gcm=cluster.gcm, linger_ms=5) as v2,
        Publisher(queue, gcm=cluster.gcm, linger_ms=5) as v1,
    ):
        for n, message_id in enumerate(ids):
            headers = [("trace", b"t%031d" % n), ("n", str(n)), ("n", "again")]
            v2.send(b"v2-%d" % n, b"k", headers=headers, message_id=message_id,
                    expires_at_us=later, not_before_us=past + n)  # fmt: skip
            v1.send(b"v1-%d" % n, b"k")  # interleaved: the same exchange takes both formats
            if n % 10 == 9:
                v2.send(b"plain-%d" % n, b"k")  # no meta in a v2 publisher's batch
        v2.send_many([b"many-%d" % n for n in range(20)], b"m", headers={"type": "json"})
    wait_for(lambda: collector.count >= 50 + 50 + 5 + 20, 15, "every message delivered")
    collector.finish()

    replay = Subscriber(queue, gcm=cluster.gcm, start="beginning")
    try:
        logged = list(replay.messages(125, timeout_s=15))
    finally:
        replay.close()
    assert len(logged) == 125
    by_payload = {record.payload: record for record in logged}
    assert set(collector.payloads) == set(by_payload), "live and replay saw the same messages"
    for n, message_id in enumerate(ids):
        record = by_payload[b"v2-%d" % n]
        assert record.headers == (("trace", b"t%031d" % n), ("n", str(n).encode()),
                                  ("n", b"again"))  # fmt: skip
        assert record.message_id == message_id
        assert (record.expires_at_us, record.not_before_us) == (later, past + n)
        assert by_payload[b"v1-%d" % n].meta is None
    assert all(by_payload[b"plain-%d" % n].meta is None for n in range(9, 50, 10))
    assert {by_payload[b"many-%d" % n].header("type") for n in range(20)} == {b"json"}

    with Consumer(queue, "g", gcm=cluster.gcm) as consumer:  # a consumer group sees them too
        handed = {d.payload: d for d in consumer.deliveries(125, timeout_s=30)}
        for delivery in handed.values():
            delivery.ack()
    assert len(handed) == 125
    assert handed[b"v2-3"].headers == by_payload[b"v2-3"].headers
    assert handed[b"v2-3"].message_id == ids[3] and handed[b"v1-3"].meta is None

    shown = cluster.cli("sub", queue, "--gcm", cluster.gcm, "--from-beginning", "--count",
                        "125", "--timeout", "30", "--meta", timeout_s=60)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    lines = dict(line.split("\t", 1)[::-1] for line in shown.stdout.splitlines())
    doc = json.loads(lines["v2-7"])
    headers = {"trace": "t" + "7".zfill(31), "n": ["7", "again"]}
    assert doc == {"headers": headers, "id": ids[7].hex(), "expires_at_us": later,
                   "not_before_us": past + 7}  # fmt: skip
    assert json.loads(lines["v1-7"]) == {"headers": {}, "id": None, "expires_at_us": None,
                                         "not_before_us": None}  # fmt: skip
