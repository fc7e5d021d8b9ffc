"""Assignment epochs (protocol/epoch.py): the comparison every client and exchange makes, and
real clients refusing a monitor's messages of an older epoch than one they heard, against a
scripted monitor on real sockets (tests/integration/test_hostloss.py checks the epochs of a
real re-placement)."""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from roq import limits
from roq.client.publisher import Publisher, PublishTimeout
from roq.client.subscriber import Subscriber
from roq.protocol import bsonmsg
from roq.protocol.epoch import EpochWatch, Verdict
from roq.protocol.messages.monitor import (
    EVERY_PUBLISHER,
    ExchangeEntry,
    ExchangeList,
    ExchangeLost,
    NewExchange,
    Placed,
)
from roq.protocol.ports import MonitorPort, port_at
from roq.testing.cluster import PortBlocks, wait_for
from roq.transport import Kind, bind, new_context, open_socket, recv_nowait, send_nowait
from roq.transport.sockets import wait_readable

LOOPBACK = "127.0.0.1"


def test_older_epochs_are_refused_newer_ones_raise_the_floor():
    watch = EpochWatch("exchange q1/x1", epoch=3)
    assert watch.judge(3, "tcp://a:1") is Verdict.CURRENT
    assert watch.judge(2, "tcp://a:1") is Verdict.STALE
    assert watch.judge(0, "tcp://b:1") is Verdict.STALE  # a peer without the field: epoch 0
    assert (watch.highest, watch.refused) == (3, 2)
    assert watch.judge(5, "tcp://c:1") is Verdict.NEWER
    assert watch.judge(4, "tcp://a:1") is Verdict.STALE  # 4 was current a moment ago, not now
    assert watch.admits(5, "tcp://c:1") and not watch.admits(3, "tcp://a:1")
    assert (watch.highest, watch.refused) == (5, 4)
    watch.note(4)  # the GCM's record never lowers what was seen
    assert watch.highest == 5
    watch.note(7)
    assert watch.judge(6, "tcp://c:1") is Verdict.STALE


def test_a_fresh_watch_takes_any_epoch():
    """A client that named its monitor itself starts at 0: record epochs start at 1, and a
    queue placed before epochs existed stays at 0."""
    watch = EpochWatch("subscriber")
    assert watch.judge(0, "m") is Verdict.CURRENT and watch.judge(1, "m") is Verdict.NEWER


def test_each_stale_source_is_logged_once_and_the_sources_logged_are_bounded(
    caplog: pytest.LogCaptureFixture,
):
    watch = EpochWatch("publisher p", epoch=9)
    with caplog.at_level(logging.DEBUG, logger="roq.protocol.epoch"):
        for _ in range(3):
            watch.judge(1, "tcp://old:1")
        for n in range(limits.epoch_stale_sources_logged_max + 10):
            watch.judge(2, f"tcp://old-{n}:1")
    lines = [r.getMessage() for r in caplog.records]
    assert sum("tcp://old:1" in line for line in lines) == 1
    assert len(lines) == limits.epoch_stale_sources_logged_max
    assert watch.refused == 3 + limits.epoch_stale_sources_logged_max + 10


# --- real clients against a scripted monitor ----------------------------------------------------
class ScriptedMonitor:
    """A monitor's placement (B+1, REP) and notice sockets (B+2, B+3, PUB) on real ports,
    answering each request with the next of `replies`, from a thread of its own."""

    def __init__(self, base: int, replies: list[dict[str, Any]]):
        self.context = new_context()
        self.base = base
        self.requests: list[dict[str, Any]] = []
        self.rep = open_socket(self.context, Kind.REP)
        bind(self.rep, LOOPBACK, port_at(base, MonitorPort.PLACEMENT))
        self.to_publishers = open_socket(self.context, Kind.PUB)
        bind(self.to_publishers, LOOPBACK, port_at(base, MonitorPort.TO_PUBLISHERS))
        self.to_subscribers = open_socket(self.context, Kind.PUB)
        bind(self.to_subscribers, LOOPBACK, port_at(base, MonitorPort.TO_SUBSCRIBERS))
        self._replies = replies
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    @property
    def address(self) -> str:
        return f"tcp://{LOOPBACK}:{self.base}"

    def _serve(self) -> None:
        while not self._stop.is_set() and self._replies:
            if wait_readable(self.rep, 50):
                frames = recv_nowait(self.rep)
                assert frames is not None
                self.requests.append(bsonmsg.decode(frames))
                send_nowait(self.rep, [bsonmsg.encode(self._replies.pop(0))])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        for sock in (self.rep, self.to_publishers, self.to_subscribers):
            sock.close(0)
        self.context.term()


@pytest.fixture
def monitor_base(port_blocks: PortBlocks) -> int:
    return port_blocks.take(6)


@pytest.fixture
def scripted(monitor_base: int) -> Iterator[Callable[[list[dict[str, Any]]], ScriptedMonitor]]:
    made: list[ScriptedMonitor] = []

    def make(replies: list[dict[str, Any]]) -> ScriptedMonitor:
        made.append(ScriptedMonitor(monitor_base, replies))
        return made[-1]

    yield make
    for each in made:
        each.close()


def _entry(port: int, exchange_id: str) -> ExchangeEntry:
    return ExchangeEntry(exchange_id, f"tcp://{LOOPBACK}:{port}", logged=False)


def test_a_subscriber_refuses_notices_of_an_older_epoch(scripted: Any, port_blocks: PortBlocks):
    backs = port_blocks.take(4)
    monitor = scripted([ExchangeList((_entry(backs, "x1"),), (), epoch=2).encode()])
    sub = Subscriber("q1", monitor=monitor.address, join_timeout_s=10)
    try:
        assert sub.epochs.highest == 2 and set(sub.exchanges.values()) == {"x1"}

        def told(notice: NewExchange, until: Callable[[], bool], what: str) -> None:
            def sent_and_seen() -> bool:  # PUB/SUB: sent again until the subscription is up
                send_nowait(monitor.to_subscribers, [bsonmsg.encode(notice.encode())])
                sub.poll(20)
                return until()

            wait_for(sent_and_seen, 10, what)

        told(NewExchange(_entry(backs + 1, "x-stale"), 1), lambda: sub.epochs.refused > 0,
             "the epoch-1 notice refused")  # fmt: skip
        told(NewExchange(_entry(backs + 2, "x2"), 2), lambda: "x2" in sub.exchanges.values(),
             "the epoch-2 notice taken")  # fmt: skip
        told(NewExchange(_entry(backs + 3, "x3"), 3), lambda: "x3" in sub.exchanges.values(),
             "a newer epoch taken")  # fmt: skip
        refused = sub.epochs.refused
        told(NewExchange(_entry(backs + 1, "x-stale"), 2), lambda: sub.epochs.refused > refused,
             "epoch 2 is stale now")  # fmt: skip
        assert "x-stale" not in sub.exchanges.values()
        assert sub.epochs.highest == 3
    finally:
        sub.close()


def test_a_publisher_ignores_an_exchange_lost_notice_of_an_older_epoch(
    scripted: Any, port_blocks: PortBlocks
):
    front = f"tcp://{LOOPBACK}:{port_blocks.take(4)}"
    monitor = scripted([Placed("x1", front, 5).encode()])
    pub = Publisher("q1", monitor=monitor.address)
    try:
        assert pub.exchange == front and pub.epochs.highest == 5
        stale = ExchangeLost(front, dead=True, epoch=4).encode()

        def sent_and_refused() -> bool:
            send_nowait(monitor.to_publishers, [EVERY_PUBLISHER, bsonmsg.encode(stale)])
            return pub.epochs.refused > 0

        wait_for(sent_and_refused, 10, "the stale EXCHANGE_LOST refused")
        time.sleep(0.2)  # not arriving: a notice it acted on would send it to the monitor again
        assert pub.exchange == front and pub.moves == 0 and len(monitor.requests) == 1
    finally:
        with contextlib.suppress(PublishTimeout):  # no exchange at `front` confirms its drain
            pub.close(timeout_s=0.5)
