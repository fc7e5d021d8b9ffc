"""Host loss (issue 18): the GCM's re-placement decisions, what a returning host stops, and what
`roq status` says, without processes (tests/integration/test_hostloss.py runs them for real)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from roq.cli.queues import _render_status
from roq.coordination.registry import ExchangeRecord, Fence, HostRecord, QueueRecord, QueueState
from roq.gcm.management import HostBack
from roq.gcm.repair import HostLossRepair
from roq.host import adoption
from roq.host.service import _with_option
from roq.host.supervision import Child
from roq.protocol import bsonmsg
from roq.protocol.commands import Reason
from roq.protocol.messages.admin import (
    ClusterStatus,
    CreateExchange,
    GoneHost,
    HostInfo,
    PendingRepair,
    QueueInfo,
    QueueStatus,
    RecordedExchange,
)
from roq.protocol.messages.host import MonitorMovedOnHost

FENCE = Fence("/roq/gcm/epoch", 1)


class FakeRegistry:
    def __init__(self, hosts: list[str], queue: QueueRecord, exchanges: list[ExchangeRecord]):
        self.live = {h: HostRecord(h, "127.0.0.1", f"tcp://127.0.0.1:{n}", 4, pid=1)
                     for n, h in enumerate(hosts, 5100)}  # fmt: skip
        self.records = {queue.name: queue}
        self.xs = {x.id: x for x in exchanges}

    def hosts(self) -> list[HostRecord]:
        return list(self.live.values())

    def queues(self) -> list[QueueRecord]:
        return list(self.records.values())

    def queue(self, name: str) -> tuple[QueueRecord, int] | None:
        return (self.records[name], 1) if name in self.records else None

    def exchanges(self, queue: str) -> list[ExchangeRecord]:
        return [x for x in self.xs.values() if x.queue == queue]

    def exchange(self, queue: str, exchange_id: str) -> tuple[ExchangeRecord, int] | None:
        found = self.xs.get(exchange_id)
        return None if found is None else (found, 1)

    def update_exchange(self, fence: Fence, record: ExchangeRecord) -> None:
        self.xs[record.id] = record


class FakeManagement:
    """Records what the repair asks of hosts; starting the monitor moves the queue record."""

    def __init__(self, registry: FakeRegistry):
        self.registry = registry
        self.calls: list[tuple[str, Any]] = []
        self.provisioner = SimpleNamespace(provision=lambda why: "asked")
        self.replacing: list[str] = []  # the lost host each placement was conditioned on
        self.host_back = False  # the registry's host-absent condition fails (the host is back)

    def _start_on_host(
        self, queue: str, host: HostRecord, fence: Fence, replacing: str = ""
    ) -> None:
        self.calls.append(("1002", host.name))
        self.replacing.append(replacing)
        if self.host_back:
            raise HostBack(Reason.BUSY, f"host {replacing} registered again")
        record = self.registry.records[queue]
        record.host, record.monitor = host.name, "tcp://127.0.0.1:17500"
        record.monitor_port, record.stat_port = 17500, 17800
        record.epoch += 1

    def _call_host(self, host: HostRecord, request: Any, decode: Any) -> Any:
        self.calls.append(("host", (host.name, request)))
        return None

    def handle(self, request: dict[str, Any], fence: Fence) -> dict[str, Any]:
        wanted = CreateExchange.decode(request)
        self.calls.append(("2004", wanted.txid))
        self.registry.xs["x3"] = ExchangeRecord("x3", wanted.queue, "h2", "tcp://a:1", "tcp://a:2")
        return bsonmsg.ok("created")


def _cluster() -> tuple[FakeRegistry, FakeManagement, HostLossRepair]:
    queue = QueueRecord("q1", QueueState.RUNNING, "h1", "tcp://127.0.0.1:17000", "", 17000, 17300)
    exchanges = [
        ExchangeRecord("x1", "q1", "h1", "tcp://127.0.0.1:18000", "tcp://127.0.0.1:18001"),
        ExchangeRecord("x2", "q1", "h2", "tcp://127.0.0.1:19000", "tcp://127.0.0.1:19001"),
    ]
    registry = FakeRegistry(["h1", "h2"], queue, exchanges)
    management = FakeManagement(registry)
    return registry, management, HostLossRepair(management, grace_s=5.0)  # type: ignore[arg-type]


def test_a_host_gone_past_the_grace_has_its_monitor_and_exchange_re_placed():
    registry, management, repair = _cluster()
    repair.tick(FENCE, 100.0)  # both live
    del registry.live["h1"]
    repair.tick(FENCE, 102.0)  # h1 gone: the clock starts
    assert repair.gone == {"h1": 102.0} and management.calls == []
    repair.tick(FENCE, 106.0)  # 4 s: within the grace
    assert management.calls == []
    repair.tick(FENCE, 107.5)  # past it
    assert management.calls[0] == ("1002", "h2")
    kind, (host, told) = management.calls[1]
    assert kind == "host" and host == "h2"
    assert told == MonitorMovedOnHost("q1", 17500, 17800, "127.0.0.1", epoch=1)
    assert management.replacing == ["h1"]  # written only while h1 stays unregistered
    assert management.calls[2] == ("2004", "replace-x1")
    assert registry.xs["x1"].lost and not registry.xs["x2"].lost
    assert registry.records["q1"].host == "h2"
    repair.tick(FENCE, 109.0)  # nothing left to do: nothing asked again
    assert len(management.calls) == 3
    gone, pending = repair.report()
    assert [(g.name, g.queues) for g in gone] == [("h1", 0)] and pending == ()


def test_with_no_free_slot_the_queue_waits_and_status_says_why():
    registry, management, repair = _cluster()
    repair.tick(FENCE, 100.0)
    del registry.live["h1"]
    registry.live["h2"].max_exchanges = 1  # h2 runs x2: full
    repair.tick(FENCE, 101.0)
    repair.tick(FENCE, 107.0)
    assert management.calls == []
    assert "no host for the monitor of q1" in repair.pending["q1"]
    assert "asked" in repair.pending["q1"]  # the provisioning hook was asked
    gone, pending = repair.report()
    assert [(g.name, g.queues) for g in gone] == [("h1", 1)]
    assert pending[0].queue == "q1" and "no host" in pending[0].comment


def test_a_host_back_within_the_grace_keeps_its_work():
    registry, management, repair = _cluster()
    repair.tick(FENCE, 100.0)
    h1 = registry.live.pop("h1")
    repair.tick(FENCE, 101.0)
    registry.live["h1"] = h1
    repair.tick(FENCE, 110.0)
    assert repair.gone == {} and management.calls == []


def test_a_returning_host_stops_only_what_moved():
    registry, _, _ = _cluster()
    registry.records["q1"].host = "h2"  # the monitor moved away from h1
    registry.xs["x1"].lost = True
    children = [
        Child("monitor q1", "monitor", "q1", 17000, "tcp://c:1", [], id="monitor-q1"),
        Child("exchange q1/x1", "exchange", "q1", 18000, "tcp://c:2", [], id="x1"),
        Child("exchange q1/x9", "exchange", "q1", 18004, "tcp://c:3", [], id="x9"),  # no record
    ]
    moved = adoption.moved_children(registry, "h1", children)  # type: ignore[arg-type]
    assert [c.id for c in moved] == ["monitor-q1", "x1"]
    registry.records["q1"].state = QueueState.STOPPED  # stopped while h1 was gone: all stop
    assert len(adoption.moved_children(registry, "h1", children)) == 3  # type: ignore[arg-type]
    del registry.records["q1"]  # deleted: all stop
    assert len(adoption.moved_children(registry, "h1", children)) == 3  # type: ignore[arg-type]
    assert adoption.recorded_exchanges(registry, "q1", "h1") == []  # type: ignore[arg-type]


def test_an_exchange_is_restarted_with_the_new_monitor_address():
    argv = ["roq", "exchange", "q1", "--monitor", "tcp://a:1", "--stat", "tcp://a:2", "--id", "x"]
    moved = _with_option(_with_option(argv, "--monitor", "tcp://b:1"), "--stat", "tcp://b:2")
    assert moved == ["roq", "exchange", "q1", "--monitor", "tcp://b:1", "--stat", "tcp://b:2",
                     "--id", "x"]  # fmt: skip


def test_roq_status_shows_gone_hosts_re_placements_and_lost_exchanges():
    queue = QueueInfo("q1", "h2", "RUNNING", "tcp://127.0.0.1:17000", "tcp://127.0.0.1:17101", True)
    lost = RecordedExchange("x1", "h1", "tcp://127.0.0.1:18000", "tcp://127.0.0.1:18001", True)
    status = ClusterStatus(
        (HostInfo("h2", "127.0.0.1", "tcp://127.0.0.1:5100", 4),),
        (QueueStatus(queue, (lost,)),),
        (GoneHost("h1", 12.0, 1),),
        (PendingRepair("q1", "host h1 is lost; re-placing"),),
    )
    text = _render_status(status, {"q1": None})
    assert "h1                   GONE for 12 s: 1 queue(s) still assigned" in text
    assert "re-placing q1: host h1 is lost; re-placing" in text
    assert "(lost with host h1; another exchange replaced it)" in text


def test_a_move_that_finds_the_lost_host_back_stops_and_tries_no_other_host():
    """The registry refused the monitor's record write because the lost host registered
    again (the re-registration race): its monitor stays the queue's, no other host is asked
    to start one, and the queue waits (pending) until the host is gone again or stays."""
    registry, management, repair = _cluster()
    registry.live["h3"] = HostRecord("h3", "127.0.0.3", "tcp://127.0.0.3:5100", 3)
    repair.tick(FENCE, 100.0)
    del registry.live["h1"]
    repair.tick(FENCE, 102.0)
    management.host_back = True
    repair.tick(FENCE, 107.5)
    assert [c for c in management.calls if c[0] == "1002"] == [("1002", "h2")]  # h3 not tried
    assert registry.records["q1"].host == "h1" and registry.records["q1"].epoch == 0
    assert not registry.xs["x1"].lost  # nothing of h1's was marked replaced
    assert "registered again" in repair.pending["q1"]
