"""Host loss (issue 18): the GCM's re-placement decisions, what a returning host stops, and what
`roq status` says, without processes (tests/integration/test_hostloss.py runs them for real)."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from typing import Any

import pytest

from roq.cli.queues import _render_status
from roq.coordination.registry import (
    ExchangeRecord,
    Fence,
    GoneRecord,
    HostRecord,
    QueueRecord,
    QueueState,
)
from roq.errors import HostRegistered, NotLeader
from roq.gcm.management import HostBack, HostSilent, QueueClaims
from roq.gcm.repair import HostLossRepair
from roq.host import adoption
from roq.host.service import _with_option
from roq.host.supervision import Child
from roq.protocol.commands import Reason
from roq.protocol.dispatch import Done
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
from roq.protocol.messages.host import MonitorMovedOnHost, StopMonitorOnHost

FENCE = Fence("/roq/gcm/epoch", 1)
WALL = [1_000_000.0]  # the wall clock the repair records in ZooKeeper


class FakeRegistry:
    def __init__(self, hosts: list[str], queue: QueueRecord, exchanges: list[ExchangeRecord]):
        self.live = {h: HostRecord(h, "127.0.0.1", f"tcp://127.0.0.1:{n}", 4, pid=1)
                     for n, h in enumerate(hosts, 5100)}  # fmt: skip
        self.records = {queue.name: queue}
        self.xs = {x.id: x for x in exchanges}
        self.gone: dict[str, GoneRecord] = {}  # <ns>/gone

    def hosts(self) -> list[HostRecord]:
        return list(self.live.values())

    def queues(self) -> list[QueueRecord]:
        return list(self.records.values())

    def queue(self, name: str) -> tuple[QueueRecord, int] | None:
        return (self.records[name], 1) if name in self.records else None

    def exchanges(self, queue: str) -> list[ExchangeRecord]:  # copies, as read from ZooKeeper
        return [dataclasses.replace(x) for x in self.xs.values() if x.queue == queue]

    def exchange(self, queue: str, exchange_id: str) -> tuple[ExchangeRecord, int] | None:
        found = self.xs.get(exchange_id)
        return None if found is None else (found, 1)

    def update_exchange(
        self, fence: Fence, record: ExchangeRecord, *, absent_host: str = ""
    ) -> None:
        if absent_host in self.live:
            raise HostRegistered(f"host {absent_host} is registered (again): nothing written")
        self.xs[record.id] = dataclasses.replace(record)

    def host(self, name: str) -> HostRecord | None:
        return self.live.get(name)

    def gone_hosts(self) -> dict[str, GoneRecord]:
        return dict(self.gone)

    def note_gone(self, fence: Fence, host: str, record: GoneRecord) -> GoneRecord:
        return self.gone.setdefault(host, record)

    def forget_gone(self, fence: Fence, host: str) -> None:
        self.gone.pop(host, None)


class FakeManagement:
    """Records what the repair asks of hosts; starting the monitor moves the queue record."""

    def __init__(self, registry: FakeRegistry):
        self.registry = registry
        self.calls: list[tuple[str, Any]] = []
        self.provision = lambda why: "asked"
        self.claims = QueueClaims()
        self.silent: set[str] = set()  # hosts whose requests time out
        self.replacing: list[str] = []  # the lost host each placement was conditioned on
        self.host_back = False  # the registry's host-absent condition fails (the host is back)
        self.unwithdrawn = False  # ... and the chosen host did not stop the monitor it started
        self.on_create: Callable[[], object] = lambda: None  # what happens meanwhile

    def _start_on_host(
        self,
        queue: str,
        host: HostRecord,
        fence: Fence,
        replacing: str = "",
        mark_lost: bool = True,
    ) -> None:
        self.calls.append(("1002", host.name))
        self.replacing.append(replacing)
        if self.host_back:
            epoch = self.registry.records[queue].epoch + 1
            left = (host.name, epoch) if self.unwithdrawn else None
            raise HostBack(Reason.BUSY, f"host {replacing} registered again", left)
        record = self.registry.records[queue]
        record.host, record.monitor = host.name, "tcp://127.0.0.1:17500"
        record.monitor_port, record.stat_port = 17500, 17800
        record.epoch += 1
        for exchange in self.registry.xs.values():  # in the same transaction, as Registry's
            mark = mark_lost and (exchange.queue, exchange.host) == (queue, replacing)
            exchange.lost = exchange.lost or mark

    def _call_host(self, host: HostRecord, request: Any, decode: Any) -> Any:
        self.calls.append(("host", (host.name, request)))
        if host.name in self.silent:
            raise HostSilent(Reason.HOST_FAILED, f"host {host.name} did not answer")
        return None

    def create_exchange(self, wanted: CreateExchange, fence: Fence) -> Done:
        self.calls.append(("2004", wanted.txid))
        self.registry.xs["x3"] = ExchangeRecord("x3", wanted.queue, "h2", "tcp://a:1", "tcp://a:2")
        self.on_create()
        return Done("created")


def _cluster() -> tuple[FakeRegistry, FakeManagement, HostLossRepair]:
    queue = QueueRecord("q1", QueueState.RUNNING, "h1", "tcp://127.0.0.1:17000", "", 17000, 17300)
    exchanges = [
        ExchangeRecord("x1", "q1", "h1", "tcp://127.0.0.1:18000", "tcp://127.0.0.1:18001"),
        ExchangeRecord("x2", "q1", "h2", "tcp://127.0.0.1:19000", "tcp://127.0.0.1:19001"),
    ]
    registry = FakeRegistry(["h1", "h2"], queue, exchanges)
    management = FakeManagement(registry)
    repair = HostLossRepair(management, grace_s=5.0)  # type: ignore[arg-type]
    repair.wall = lambda: WALL[0]
    return registry, management, repair


def test_a_gone_hosts_monitor_moves_at_once_and_its_exchange_after_the_grace():
    """Issue 30 item 5: the monitor is re-placed as soon as its host's registration is gone
    (its publishers follow within the session timeout + a few seconds); the exchange, and so
    its log, waits for host.loss.grace, in case the host comes back."""
    registry, management, repair = _cluster()
    repair.tick(FENCE, 100.0)  # both live
    del registry.live["h1"]
    repair.tick(FENCE, 102.0)  # h1 gone: the clock starts, the monitor moves
    assert repair.gone == {"h1": 102.0}
    assert management.calls[0] == ("1002", "h2")
    kind, (host, told) = management.calls[1]
    assert kind == "host" and host == "h2"
    assert told == MonitorMovedOnHost("q1", 17500, 17800, "127.0.0.1", epoch=1)
    assert management.replacing == ["h1"]  # written only while h1 stays unregistered
    assert registry.records["q1"].host == "h2"
    assert not registry.xs["x1"].lost  # not before the grace
    repair.tick(FENCE, 106.0)  # 4 s: within the grace
    assert len(management.calls) == 2
    repair.tick(FENCE, 107.5)  # past it: the exchange is replaced and marked lost
    assert management.calls[2] == ("2004", "replace-x1")
    assert registry.xs["x1"].lost and not registry.xs["x2"].lost
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
    assert "asked" in repair.pending["q1"]  # the provisioning hook was asked, once
    repair.tick(FENCE, 107.0)
    assert management.calls == []
    assert "no host for the monitor of q1" in repair.pending["q1"]
    gone, pending = repair.report()
    assert [(g.name, g.queues) for g in gone] == [("h1", 1)]
    assert pending[0].queue == "q1" and "no host" in pending[0].comment


def test_a_host_back_within_the_grace_keeps_its_exchanges():
    """Its monitor moved at once; its exchange stays its own (the host re-adopts it, and it
    reports to the moved monitor): nothing is replaced or marked lost."""
    registry, management, repair = _cluster()
    repair.tick(FENCE, 100.0)
    h1 = registry.live.pop("h1")
    repair.tick(FENCE, 101.0)
    registry.live["h1"] = h1
    repair.tick(FENCE, 110.0)
    assert repair.gone == {} and [c[0] for c in management.calls] == ["1002", "host"]
    assert not registry.xs["x1"].lost and "x3" not in registry.xs


def test_the_gone_clock_is_kept_in_zookeeper_and_survives_a_new_term():
    registry, management, repair = _cluster()
    repair.tick(FENCE, 100.0)
    del registry.live["h1"]
    repair.tick(FENCE, 101.0)
    assert registry.gone == {"h1": GoneRecord(WALL[0], FENCE.version)}
    # another GCM takes the lead 4 s later (its monotonic clock is unrelated to this one's)
    WALL[0] += 4.0
    successor = HostLossRepair(management, grace_s=5.0)  # type: ignore[arg-type]
    successor.wall = lambda: WALL[0]
    successor.tick(Fence("/roq/gcm/epoch", 2), 500.0)
    assert successor.gone == {"h1": 496.0}  # the recorded clock, not a fresh one
    assert ("2004", "replace-x1") not in management.calls
    successor.tick(Fence("/roq/gcm/epoch", 2), 501.5)  # 5.5 s after h1 went: re-placed
    assert ("2004", "replace-x1") in management.calls
    assert registry.gone == {}  # its work is all re-placed: the record goes
    WALL[0] -= 4.0


def test_a_host_back_drops_its_gone_record():
    registry, _, repair = _cluster()
    repair.tick(FENCE, 100.0)
    h1 = registry.live.pop("h1")
    repair.tick(FENCE, 101.0)
    assert "h1" in registry.gone
    registry.live["h1"] = h1
    repair.tick(FENCE, 102.0)
    assert registry.gone == {} and repair.gone == {}


def test_an_exchange_whose_host_registers_before_it_is_marked_lost_stays_its_hosts():
    """The monitor was elsewhere: h1's exchange is replaced, and h1 registers again before
    the mark is written; the mark requires h1's absence, so x1 stays h1's (h1 checked its
    assignments when it registered: it keeps x1 running), the replacement stays too."""
    registry, management, repair = _cluster()
    registry.records["q1"].host = "h2"
    repair.tick(FENCE, 100.0)
    h1 = registry.live.pop("h1")
    repair.tick(FENCE, 101.0)
    management.on_create = lambda: registry.live.setdefault("h1", h1)
    repair.tick(FENCE, 106.5)
    assert ("2004", "replace-x1") in management.calls
    assert not registry.xs["x1"].lost and "x3" in registry.xs
    assert management.replacing == []  # the monitor did not move


def test_a_host_that_missed_monitor_moved_is_asked_again_with_back_off():
    registry, management, repair = _cluster()
    registry.live["h3"] = HostRecord("h3", "127.0.0.1", "tcp://127.0.0.1:5200", 4, pid=1)
    registry.xs["x4"] = ExchangeRecord("x4", "q1", "h3", "tcp://a:5", "tcp://a:6")
    repair.tick(FENCE, 100.0)
    del registry.live["h1"]
    management.silent.add("h3")
    repair.tick(FENCE, 101.0)  # the monitor re-placed; h3 does not answer 1013
    told = [c for c in management.calls if c[0] == "host" and c[1][0] == "h3"]
    assert len(told) == 1 and ("q1", "h3") in repair.untold
    assert any("not yet told" in p.comment for p in repair.report()[1])
    repair.tick(FENCE, 101.5)  # not due yet (1 s)
    repair.tick(FENCE, 102.5)  # asked again, still silent: next in 2 s
    repair.tick(FENCE, 103.5)
    assert len([c for c in management.calls if c[0] == "host" and c[1][0] == "h3"]) == 2
    management.silent.clear()
    repair.tick(FENCE, 105.0)  # answers: not asked again
    repair.tick(FENCE, 140.0)
    assert len([c for c in management.calls if c[0] == "host" and c[1][0] == "h3"]) == 3
    assert repair.untold == {}


def test_a_host_that_missed_monitor_moved_and_then_was_lost_is_not_asked_again():
    registry, management, repair = _cluster()
    repair.tick(FENCE, 100.0)
    del registry.live["h1"]
    management.silent.add("h2")
    repair.tick(FENCE, 101.0)
    repair.tick(FENCE, 106.5)
    assert ("q1", "h2") in repair.untold
    del registry.live["h2"]  # h2 lost in turn: its exchanges replaced
    for exchange in registry.xs.values():
        exchange.lost = exchange.lost or exchange.host == "h2"
    repair.tick(FENCE, 120.0)
    assert repair.untold == {}


def test_a_queue_an_admin_request_is_changing_waits_for_the_next_check():
    registry, management, repair = _cluster()
    repair.tick(FENCE, 100.0)
    del registry.live["h1"]
    assert management.claims.claim("q1")  # the admin loop holds q1
    repair.tick(FENCE, 101.0)
    assert management.calls == [] and "admin request" in repair.pending["q1"]
    management.claims.release("q1")
    repair.tick(FENCE, 102.5)
    assert management.calls[0] == ("1002", "h2")
    assert management.claims.claim("q1")  # the repair released it


def test_a_repair_stops_when_the_lead_is_lost():
    registry, management, repair = _cluster()
    repair.tick(FENCE, 100.0)
    del registry.live["h1"]
    repair.leading = lambda: False
    try:
        repair.tick(FENCE, 101.0)
    except NotLeader:
        pass
    else:
        raise AssertionError("the repair went on without the lead")
    assert management.calls == [] and management.claims.claim("q1")


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
    assert re.search(r"^  h1 +GONE for 12 s: 1 queue\(s\) still assigned$", text, re.MULTILINE), (
        text
    )
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
    management.host_back = True
    repair.tick(FENCE, 102.0)
    assert [c for c in management.calls if c[0] == "1002"] == [("1002", "h2")]  # h3 not tried
    assert registry.records["q1"].host == "h1" and registry.records["q1"].epoch == 0
    assert not registry.xs["x1"].lost  # nothing of h1's was marked replaced
    assert "registered again" in repair.pending["q1"]


def test_a_called_off_moves_monitor_its_host_did_not_stop_is_asked_again_until_it_is():
    """Issue 30: the chosen host did not answer the request to stop the monitor it started
    for the called-off move: it is asked again (1014, that epoch) with back-off while it stays
    registered, until it answers; roq status says so meanwhile."""
    registry, management, repair = _cluster()
    repair.tick(FENCE, 100.0)
    del registry.live["h1"]
    management.host_back = management.unwithdrawn = True
    repair.tick(FENCE, 102.0)
    registry.live["h1"] = HostRecord("h1", "127.0.0.1", "tcp://127.0.0.1:5100", 3)  # it is back
    management.silent.add("h2")
    repair.tick(FENCE, 102.5, force=True)  # not yet due (1 s)
    assert not [c for c in management.calls if c[0] == "host"]
    assert (
        "has not stopped the called-off move's monitor"
        in {p.queue: p.comment for p in repair.report()[1]}["q1"]
    )
    repair.tick(FENCE, 103.1, force=True)  # asked, silent again: next in 2 s
    asked = [c[1] for c in management.calls if c[0] == "host"]
    assert asked == [("h2", StopMonitorOnHost("q1", 1))]
    assert repair.unwithdrawn[("q1", "h2")].at == pytest.approx(105.1)
    management.silent.clear()
    repair.tick(FENCE, 105.2, force=True)  # answered: done
    assert len([c for c in management.calls if c[0] == "host"]) == 2
    assert repair.unwithdrawn == {}
    repair.tick(FENCE, 140.0, force=True)
    assert len([c for c in management.calls if c[0] == "host"]) == 2


def test_a_called_off_moves_monitor_later_recorded_or_whose_host_left_is_not_asked_again():
    """The request is not sent again once the queue's record names that very monitor (a
    later placement chose it) or its host is no longer registered (registering again, it
    stops every monitor its queue's record does not name)."""
    for case in ("recorded", "gone"):
        registry, management, repair = _cluster()
        repair.tick(FENCE, 100.0)
        del registry.live["h1"]
        management.host_back = management.unwithdrawn = True
        repair.tick(FENCE, 102.0)
        registry.live["h1"] = HostRecord("h1", "127.0.0.1", "tcp://127.0.0.1:5100", 3)
        if case == "recorded":
            registry.records["q1"].host, registry.records["q1"].epoch = "h2", 1
        else:
            del registry.live["h2"]
        repair.tick(FENCE, 110.0, force=True)
        assert not [c for c in management.calls if c[0] == "host"], case
        assert repair.unwithdrawn == {}, case


def test_the_repair_is_due_when_a_grace_ends_and_a_forced_check_runs_at_once():
    """The repair thread sleeps until `due_at` (a grace's end, not the next 1 s tick) and is
    woken by the hosts' watch: `force` runs a check before the periodic one is due."""
    registry, management, repair = _cluster()
    repair.tick(FENCE, 100.0)
    assert repair.due_at() == 101.0  # nothing gone: the periodic check
    del registry.live["h1"]
    repair.tick(FENCE, 100.2)  # not due yet, not forced: nothing seen
    assert repair.gone == {}
    repair.grace_s = 0.5
    repair.tick(FENCE, 100.2, force=True)  # the watch saw h1's registration go
    assert repair.gone == {"h1": 100.2}
    assert management.calls[0] == ("1002", "h2")  # its monitor, at once
    assert repair.due_at() == 100.7  # its grace ends before the next periodic check
    repair.tick(FENCE, 100.7, force=True)
    assert ("2004", "replace-x1") in management.calls
    assert repair.due_at() == 101.7  # all re-placed: only the periodic check is left


def test_an_exchange_the_monitors_new_host_started_stands_in_for_the_gone_one():
    """Every exchange of q1 was on h1: the host that takes the monitor at once starts one too
    (the queue had none left on a live host). It is named as x1's replacement, so the grace's
    end replaces nothing more, and x1 is only marked lost."""
    registry, management, repair = _cluster()
    del registry.xs["x2"]
    start = management._start_on_host

    def start_with_an_exchange(queue: str, host: HostRecord, fence: Fence, **kw: Any) -> None:
        start(queue, host, fence, **kw)
        registry.xs["x5"] = ExchangeRecord("x5", queue, host.name, "tcp://a:7", "tcp://a:8")

    management._start_on_host = start_with_an_exchange  # type: ignore[method-assign]
    repair.tick(FENCE, 100.0)
    del registry.live["h1"]
    repair.tick(FENCE, 101.0)
    assert registry.xs["x5"].txid == "replace-x1" and not registry.xs["x1"].lost
    repair.tick(FENCE, 106.5)
    assert not [c for c in management.calls if c[0] == "2004"]
    assert registry.xs["x1"].lost


class _Returning(FakeRegistry):
    """A registry whose `host` registers again at its `at`-th read of the live hosts."""

    def __init__(self, *args: Any, at: int, host: HostRecord):
        super().__init__(*args)
        self.reads, self.at, self.returning = 0, at, host

    def hosts(self) -> list[HostRecord]:
        self.reads += 1
        if self.reads == self.at:
            self.live[self.returning.name] = self.returning
        return super().hosts()


def test_a_gone_host_registered_again_before_the_move_is_not_asked_for_its_own_monitor():
    """The `roq up` restart race (docs/guarantees.md §8): the new leader's first check finds
    the one host's registration gone, and the host registers again between the repair's read
    of the live hosts and its choice of one. Before, it was chosen (the only host with a free
    slot): asked to place the monitor under the next epoch, it restarted the one it had just
    re-adopted, and the record write, conditioned on its absence, failed and withdrew that one
    too. Now the move is called off before any host is asked, and the record is untouched."""
    queue = QueueRecord("q1", QueueState.RUNNING, "h1", "tcp://127.0.0.1:17000", "", 17000, 17300)
    x1 = ExchangeRecord("x1", "q1", "h1", "tcp://127.0.0.1:18000", "tcp://127.0.0.1:18001")
    h1 = HostRecord("h1", "127.0.0.1", "tcp://127.0.0.1:5100", 4, pid=2)
    # reads: the check's, the repair's (h1 still gone), the choice of a host's (h1 is back)
    registry = _Returning([], queue, [x1], at=3, host=h1)
    management = FakeManagement(registry)
    repair = HostLossRepair(management, grace_s=5.0)  # type: ignore[arg-type]
    repair.wall = lambda: WALL[0]
    repair.tick(FENCE, 100.0)  # a new term's first check: h1 has work and no registration
    assert management.calls == [] and management.replacing == []
    assert (queue.host, queue.epoch) == ("h1", 0) and not x1.lost
    assert "h1 registered again" in repair.pending["q1"]
    repair.tick(FENCE, 100.5, force=True)  # the hosts' watch: h1 is back
    assert repair.gone == {} and management.calls == []
