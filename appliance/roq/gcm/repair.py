"""Host loss is repaired: the leading GCM re-places the work of a host that stays gone.

A host's registration is ephemeral: it vanishes `zk.session.timeout` after the host died (or
stalled, or was cut off). Once it has been gone for `host.loss.grace` more, each RUNNING queue
with work recorded on it is re-placed, a few queues per check (`limits.host_loss_queues_per_pass`),
in the GCM's `gcm-repair` thread, so that admin requests are answered while a repair waits on a
silent host. The thread checks at once when a registration vanishes or appears (a ZooKeeper
watch), when this GCM takes the lead, and when a gone host's grace ends; and at least every
`limits.host_loss_check_s` in any case (the watch may miss a change while ZooKeeper is away):

1. Its monitor, if it was there, starts on the live host with the most free exchange slots that
   takes it (the same host request as a create, 1002, so that host may also start an exchange if
   the queue has none left); the queue record then names that host and the monitor's ports (a
   fenced write, as every leader write). Every live host that runs exchanges of the queue is told
   (1013), and tells them (1031): they report to the new monitor from then on. A host that does
   not answer is asked again, with back-off (`limits.monitor_moved_retry_*`), until it answers,
   is lost itself, or runs no exchange of the queue any more.
2. Each exchange recorded on the lost host gets a successor, so the queue keeps its capacity: an
   exchange started by step 1 counts as one, the others are created as a 2004 with the
   transaction id `replace-<lost id>` (idempotent, on the least loaded host; none free: the
   provisioner is asked, as scale-out does). The lost exchange's record stays, marked `lost`:
   its log's copies on surviving exchanges stay readable through the monitor's list of dead
   logs, and a host that comes back never starts it again (host/adoption.py). The mark is
   written only while the host is still unregistered: with the monitor's move in step 1 (one
   transaction), else on its own; a host that registered first keeps its exchange.

A move called off because the lost host registered first (docs/guarantees.md §8) stops the
monitor it started; a chosen host that does not answer that request (1014) is asked again, with
the same back-off, until it answers, is no longer registered (a host that registers again stops
every monitor its queue's record does not name), the record names that very monitor (a later
placement chose it), or `limits.monitor_withdraw_retries_max` requests went unanswered.

What cannot be done now (no host with a free slot, a host that does not answer) is kept as a
pending repair, shown by `roq status`, and tried again at the next check. When a host was first
seen gone is recorded in ZooKeeper (`<ns>/gone/<host>`, wall-clock time and the leader's epoch,
a fenced write), so a GCM that takes the lead goes on with the clock rather than starting it
again; the record goes when the host is back or its work is all re-placed. The clocks of the
GCMs' machines are assumed to agree (NTP): a skew of d makes the grace d shorter or longer after
a fail-over, never negative.

Threads. The repair thread claims a queue (`Management.claims`) before it changes it, so an admin
request that changes the same queue at the same time is answered `busy`; every host request it
makes ends within `limits.request_cancel_poll_ms` of the lead's loss, and it checks the lead
before each step, so a GCM that lost the lead stops repairing at once (its writes are fenced
anyway). `report` (from the main thread) reads its state under `_lock`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

from roq import limits
from roq.backoff import backoff_s
from roq.coordination.registry import (
    ExchangeRecord,
    Fence,
    GoneRecord,
    HostRecord,
    QueueState,
    Registry,
)
from roq.errors import AdminError, CoordinationError, HostRegistered, NotLeader
from roq.gcm.management import HostBack, Management, Refused, _address_of
from roq.protocol.bsonmsg import Reply
from roq.protocol.commands import Reason
from roq.protocol.messages.admin import CreateExchange, GoneHost, PendingRepair
from roq.protocol.messages.host import MonitorMovedOnHost, StopMonitorOnHost

log = logging.getLogger(__name__)


def _replacement(lost: ExchangeRecord) -> str:
    """The transaction id of the exchange that replaces `lost` (idempotent: made once)."""
    return f"replace-{lost.id}"[: limits.transaction_id_chars_max]


@dataclass(frozen=True, slots=True)
class _Due:
    """What a check re-places: the monitors on `moving` (gone hosts), and the exchanges on
    `lost` (gone for `host.loss.grace`, a subset)."""

    moving: set[str]
    lost: set[str]


@dataclass(slots=True)
class _Unwithdrawn:
    """A monitor started under `epoch` for a called-off move, its host asked to stop it again
    at `at` after `failures` requests it did not answer."""

    epoch: int
    at: float
    failures: int


@dataclass(slots=True)
class _Untold:
    """A host that missed "monitor moved" (1013) for a queue: asked again at `at`, after
    `failures` requests it did not answer (the back-off's count)."""

    at: float
    failures: int


class HostLossRepair:
    """`tick` runs in the repair thread (`RepairThread`) while the GCM leads; `report` in the
    main thread."""

    def __init__(self, management: Management, grace_s: float):
        self.management = management
        self.registry: Registry = management.registry
        self.grace_s = grace_s
        self.gone: dict[str, float] = {}  # host name → when its registration was seen gone
        self.pending: dict[str, str] = {}  # queue → what its repair waits for
        self.untold: dict[tuple[str, str], _Untold] = {}  # (queue, host) to tell again
        # (queue, host) to ask again to stop the monitor of a called-off move; kept across
        # terms: each request is checked against the queue's record first
        self.unwithdrawn: dict[tuple[str, str], _Unwithdrawn] = {}
        self.leading: Callable[[], bool] = lambda: True  # the thread sets it for each term
        self.wall: Callable[[], float] = time.time  # the clock recorded in ZooKeeper
        self._lock = threading.Lock()
        self._fence: Fence | None = None  # the term the state below belongs to
        self._seen: set[str] | None = None  # hosts live at the last check; None: first check
        self._asked: set[str] = set()  # queues the provisioner was asked for
        self._done: set[str] = set()  # gone hosts whose work is all re-placed
        self._next_check = 0.0
        self._now = 0.0

    def tick(self, fence: Fence, now: float, force: bool = False) -> None:
        """One check, if the periodic one is due or the caller knows better (`force`: the
        repair thread, woken by a change of the hosts or at `due_at`)."""
        if not force and now < self._next_check and fence == self._fence:
            return
        self._next_check = now + limits.host_loss_check_s
        self._now = now
        if fence != self._fence:
            self._new_term(fence)
        live = {h.name for h in self.registry.hosts()}
        self._note_gone(live, now, fence)
        self._tell_again(live, now)
        self._withdraw_again(live, now)
        # Monitors move as soon as their host's registration is gone (its session expired, or
        # it stopped): their publishers are acknowledged again within the session timeout +
        # a few seconds; exchanges, and so their logs, wait for the grace (a quick return).
        moving = set(self.gone) - self._done
        due = {n for n, since in self.gone.items() if now - since >= self.grace_s} - self._done
        if not moving:
            return
        queues = self._queues_on(due) | self._monitors_on(moving)
        with self._lock:
            for name in [n for n in self.pending if n not in queues]:
                del self.pending[name]
                self._asked.discard(name)
        for queue in sorted(queues)[: limits.host_loss_queues_per_pass]:
            self._repair_claimed(queue, _Due(moving, due), fence)
        if not due:
            return
        if not self.pending and len(queues) <= limits.host_loss_queues_per_pass:
            for name in due:  # nothing is assigned to them any more: no more scans for them
                self._check_lead()
                self.registry.forget_gone(fence, name)
                self._done.add(name)

    def due_at(self) -> float:
        """When the next check is needed (monotonic): the next periodic one, or sooner when a
        gone host's grace ends, or a host is to be told again, before it (what was due at the
        last check and is still waiting is left to the periodic one)."""
        with self._lock:
            ends = [s + self.grace_s for n, s in self.gone.items() if n not in self._done]
            ends += [u.at for u in self.untold.values()]
            ends += [u.at for u in self.unwithdrawn.values()]
        return min([self._next_check, *(at for at in ends if at > self._now)])

    def _new_term(self, fence: Fence) -> None:
        """A term starts (this GCM was elected, maybe again): what an earlier term knew may be
        stale; the gone hosts' clocks come from ZooKeeper at the first check."""
        with self._lock:
            self.gone.clear()
            self.pending.clear()
            self.untold.clear()
            self._asked.clear()
            self._done.clear()
            self._seen = None
            self._fence = fence

    def _repair_claimed(self, queue: str, due: _Due, fence: Fence) -> None:
        if not self.management.claims.claim(queue):
            with self._lock:
                self.pending[queue] = "an admin request on it is in progress; tried again soon"
            return
        try:
            self._check_lead()
            self._repair(queue, due, fence)
            with self._lock:
                self.pending.pop(queue, None)
        except (Refused, AdminError) as refused:  # AdminError: an admin changed it meanwhile
            with self._lock:
                self.pending[queue] = str(refused)
            log.warning("queue %s: re-placement after host loss waits: %s", queue, refused)
        finally:
            self.management.claims.release(queue)

    def _check_lead(self) -> None:
        if not self.leading():
            raise NotLeader("this GCM lost the lead: the repair stops")

    def _note_gone(self, live: set[str], now: float, fence: Fence) -> None:
        """Hosts seen live before and gone now; at a term's first check, the hosts that have
        work recorded but no registration. Each one's clock is the one recorded in ZooKeeper
        by the first leader that saw it gone."""
        missing = (self._seen or set()) - live
        if self._seen is None:
            assigned = self._assigned_hosts()
            missing = assigned - live
            self._drop_stale_records(live, assigned, fence)
        for name in sorted(missing - set(self.gone)):
            if len(self.gone) >= limits.host_loss_gone_max:
                break
            self._check_lead()
            stored = self.registry.note_gone(fence, name, GoneRecord(self.wall(), fence.version))
            # the record's age on the wall clock, never negative (a clock behind another's)
            since = now - max(0.0, self.wall() - stored.since)
            with self._lock:
                self.gone[name] = since
            log.warning("host %s: its registration is gone (for %.1f s, by the clock recorded "
                        "at epoch %d); its work is re-placed after host.loss.grace unless it "
                        "comes back", name, now - since, stored.epoch)  # fmt: skip
        for name in [n for n in self.gone if n in live]:
            self._check_lead()
            self.registry.forget_gone(fence, name)
            with self._lock:
                del self.gone[name]  # back: it adopts what is still assigned to it
                self._done.discard(name)
        self._seen = live

    def _drop_stale_records(self, live: set[str], assigned: set[str], fence: Fence) -> None:
        """Records of hosts that are live again or have no work left (an earlier leader was
        deposed before it removed them)."""
        for name in self.registry.gone_hosts():
            if name in live or name not in assigned:
                self._check_lead()
                self.registry.forget_gone(fence, name)

    def _assigned_hosts(self) -> set[str]:
        hosts = set()
        for queue in self.registry.queues():
            if queue.state == QueueState.RUNNING:
                hosts.add(queue.host)
                hosts.update(x.host for x in self.registry.exchanges(queue.name) if not x.lost)
        return hosts

    def _monitors_on(self, hosts: set[str]) -> set[str]:
        """RUNNING queues whose monitor is recorded on one of `hosts`."""
        return {
            q.name
            for q in self.registry.queues()
            if q.state == QueueState.RUNNING and q.host in hosts
        }

    def _queues_on(self, hosts: set[str]) -> set[str]:
        """RUNNING queues with a monitor or an exchange (not yet replaced) on one of `hosts`."""
        found = set()
        for queue in self.registry.queues():
            if queue.state != QueueState.RUNNING:
                continue
            exchanges = self.registry.exchanges(queue.name)
            if queue.host in hosts or any(x.host in hosts and not x.lost for x in exchanges):
                found.add(queue.name)
        return found

    # --- one queue -------------------------------------------------------------------------
    def _repair(self, queue: str, due: _Due, fence: Fence) -> None:
        live = {h.name for h in self.registry.hosts()}  # one may be back since the check
        moving, gone = due.moving - live, due.lost - live
        got = self.registry.queue(queue)
        if not moving or got is None or got[0].state != QueueState.RUNNING:
            return
        before = self.registry.exchanges(queue)
        lost = [x for x in before if x.host in gone and not x.lost]
        marked: set[str] = set()  # hosts whose exchanges the monitor's move marked lost
        if got[0].host in moving:
            host = got[0].host
            log.warning("queue %s: its monitor's host %s is gone; re-placing the monitor", queue,
                        host)  # fmt: skip
            self._move_monitor(queue, fence, host, mark_lost=host in gone)
            if host in gone:
                marked.add(host)
            self._name_spares(queue, {x.id for x in before}, host, fence)
        taken = {x.txid for x in self.registry.exchanges(queue)}
        for exchange in lost:
            # A log follower is not replaced here: its monitor asks for one as soon as it
            # hears it no more (log.followers), and a second one would never be retired.
            if not exchange.follower and _replacement(exchange) not in taken:
                self._replace_exchange(exchange, fence)
            if exchange.host not in marked and not self._mark_lost(exchange, fence):
                continue
            done = "marked lost" if exchange.follower else "replaced"
            kind = "log follower" if exchange.follower else "exchange"
            log.warning("queue %s: %s %s on lost host %s %s", queue, kind, exchange.id,
                        exchange.host, done)  # fmt: skip

    def _name_spares(self, queue: str, known: set[str], host: str, fence: Fence) -> None:
        """The exchanges the monitor's new host started with it (the queue had none left on a
        live host) stand in for the gone host's exchanges: each record is given the transaction
        id that replacing one of them would use, so that replacement is not made again once
        the grace ends (nor ever, if the host comes back: then it is spare capacity)."""
        records = self.registry.exchanges(queue)
        gone = [x for x in records if x.host == host and not x.lost]
        taken = {x.txid for x in records}
        stand_ins = [x for x in records if x.id not in known]
        unreplaced = [x for x in gone if _replacement(x) not in taken]
        for spare, lost in zip(stand_ins, unreplaced, strict=False):  # as many as both have
            spare.txid = _replacement(lost)
            self._check_lead()
            self.registry.update_exchange(fence, spare)

    def _mark_lost(self, exchange: ExchangeRecord, fence: Fence) -> bool:
        """Mark a gone host's exchange lost, only while that host is still unregistered: one
        that registered meanwhile keeps it running (its replacement stays as spare capacity)."""
        exchange.lost = True
        self._check_lead()
        try:
            self.registry.update_exchange(fence, exchange, absent_host=exchange.host)
        except HostRegistered:
            log.warning("queue %s: host %s registered again: its exchange %s stays",
                        exchange.queue, exchange.host, exchange.id)  # fmt: skip
            return False
        return True

    def _move_monitor(self, queue: str, fence: Fence, lost: str, mark_lost: bool) -> None:
        hosts = self._hosts_with_free_slots()
        if any(host.name == lost for host in hosts) or self.registry.host(lost) is not None:
            # It registered again since `_repair` read the live hosts (a `roq up` restart: the
            # GCM and the host start together). Asked to place the monitor, it would restart
            # the one it just re-adopted under the new epoch, and the record write, conditioned
            # on its absence, would fail and withdraw that one too: no monitor left.
            log.warning("queue %s: host %s registered again before its monitor was re-placed: "
                        "it keeps it", queue, lost)  # fmt: skip
            raise HostBack(Reason.BUSY, f"host {lost} registered again: its monitor of {queue} "
                           "stays")  # fmt: skip
        refusals = []
        for host in hosts:
            self._check_lead()
            try:
                self.management._start_on_host(
                    queue, host, fence, replacing=lost, mark_lost=mark_lost
                )
            except HostBack as back:
                if back.unwithdrawn is not None:  # its host did not stop it: asked again
                    self._unwithdrawn(queue, *back.unwithdrawn, _Unwithdrawn(0, 0.0, 0))
                raise  # the lost host is back with its monitor: no other host is tried
            except Refused as refused:
                refusals.append(str(refused))
                continue
            log.warning("queue %s: monitor re-placed on %s", queue, host.name)
            self._tell_exchanges(queue)
            return
        said = ""
        if queue not in self._asked:
            self._asked.add(queue)
            said = ": " + self.management.provision(
                f"queue {queue} lost its monitor's host and no live host has a free slot"
            )
        why = "; ".join(refusals) or "no live host has a free exchange slot"
        raise Refused(Reason.NO_CAPACITY, f"no host for the monitor of {queue} ({why}){said}")

    def _hosts_with_free_slots(self) -> list[HostRecord]:
        """Live hosts with a free exchange slot, the most free first."""
        hosts = self.registry.hosts()
        used = {h.name: 0 for h in hosts}
        for queue in self.registry.queues():
            for exchange in self.registry.exchanges(queue.name):
                if exchange.host in used and not exchange.lost:
                    used[exchange.host] += 1
        free = [h for h in hosts if used[h.name] < h.max_exchanges]
        return sorted(free, key=lambda h: (used[h.name] - h.max_exchanges, h.name))

    def _tell_exchanges(self, queue: str) -> None:
        """Every live host with exchanges of the queue, or lost ones (it may run their log
        keepers, host/keepers.py): they report to the new monitor. One that does not answer is
        asked again later (`_tell_again`)."""
        hosts = {x.host for x in self.registry.exchanges(queue)}
        for host in self.registry.hosts():
            if host.name in hosts:
                self._tell(queue, host, _Untold(self._now, 0))

    def _tell(self, queue: str, host: HostRecord, last: _Untold) -> None:
        got = self.registry.queue(queue)
        if got is None:
            return
        record = got[0]
        request = MonitorMovedOnHost(
            queue, record.monitor_port, record.stat_port, _address_of(record.monitor), record.epoch
        )
        self._check_lead()
        try:
            self.management._call_host(host, request, Reply.decode)
        except Refused as error:  # its exchanges keep reporting to the old address meanwhile
            failures = last.failures + 1
            wait_s = backoff_s(
                failures, limits.monitor_moved_retry_first_s, limits.monitor_moved_retry_max_s
            )
            log.error("queue %s: host %s not told of the new monitor (asked again in %.0f s): "
                      "%s", queue, host.name, wait_s, error)  # fmt: skip
            with self._lock:
                if (queue, host.name) in self.untold or (
                    len(self.untold) < limits.monitor_moved_untold_max
                ):
                    self.untold[(queue, host.name)] = _Untold(self._now + wait_s, failures)
            return
        with self._lock:
            if self.untold.pop((queue, host.name), None) is not None:
                log.warning("queue %s: host %s told of the new monitor at last", queue,
                            host.name)  # fmt: skip

    def _tell_again(self, live: set[str], now: float) -> None:
        """The hosts that missed 1013 and are due: asked again while they are registered and
        still have an exchange of a RUNNING queue recorded (a lost one's log keeper). A gone
        host whose exchanges of the queue are all lost is not: when it is back, it stops them
        and starts their keepers with the queue record's monitor (host/keepers.py)."""
        for (queue, name), last in sorted(self.untold.items()):
            got = self.registry.queue(queue)
            exchanges = [x for x in self.registry.exchanges(queue) if x.host == name] if got else []
            if (
                got is None
                or got[0].state != QueueState.RUNNING
                or not exchanges
                or (name not in live and all(x.lost for x in exchanges))
            ):
                with self._lock:
                    self.untold.pop((queue, name), None)
                continue
            host = self.registry.host(name) if name in live else None
            if host is not None and now >= last.at:
                self._tell(queue, host, last)

    def _unwithdrawn(self, queue: str, host: str, epoch: int, last: _Unwithdrawn) -> None:
        """`host` did not stop the monitor of `queue` started under `epoch`: asked again after
        the back-off, or given up after limits.monitor_withdraw_retries_max requests."""
        failures = last.failures + 1
        with self._lock:
            self.unwithdrawn.pop((queue, host), None)
            if failures > limits.monitor_withdraw_retries_max:
                log.error("queue %s: host %s never stopped the monitor of the called-off move "
                          "(epoch %d); it stays until that host restarts", queue, host,
                          epoch)  # fmt: skip
                return
            wait_s = backoff_s(
                failures, limits.monitor_moved_retry_first_s, limits.monitor_moved_retry_max_s
            )
            self.unwithdrawn[(queue, host)] = _Unwithdrawn(epoch, self._now + wait_s, failures)
        log.warning("queue %s: host %s did not stop the monitor of the called-off move (epoch "
                    "%d); asked again in %.0f s", queue, host, epoch, wait_s)  # fmt: skip

    def _withdraw_again(self, live: set[str], now: float) -> None:
        """The hosts due to be asked again to stop a called-off move's monitor (1014): not one
        no longer registered (registering again, it stops that monitor itself), nor one whose
        monitor the queue's record now names (a later placement chose it)."""
        for (queue, name), last in sorted(self.unwithdrawn.items()):
            got = self.registry.queue(queue)
            host = self.registry.host(name) if name in live else None
            if host is None or got is None or (got[0].host, got[0].epoch) == (name, last.epoch):
                with self._lock:
                    self.unwithdrawn.pop((queue, name), None)
                continue
            if now < last.at:
                continue
            self._check_lead()
            try:
                self.management._call_host(host, StopMonitorOnHost(queue, last.epoch), Reply.decode)
            except Refused:
                self._unwithdrawn(queue, name, last.epoch, last)
                continue
            with self._lock:
                self.unwithdrawn.pop((queue, name), None)
            log.warning("queue %s: the monitor started on %s for the called-off move stopped at "
                        "last", queue, name)  # fmt: skip

    def _replace_exchange(self, lost: ExchangeRecord, fence: Fence) -> None:
        """A 2004 as the admin API runs it (the queue is claimed by this thread already)."""
        txid = _replacement(lost)
        self._check_lead()
        try:
            self.management.create_exchange(CreateExchange(lost.queue, txid), fence)
        except Refused as refused:
            raise Refused(refused.reason, f"no exchange in place of {lost.id}: {refused}") from None

    # --- what `roq status` shows ---------------------------------------------------------
    def report(self) -> tuple[tuple[GoneHost, ...], tuple[PendingRepair, ...]]:
        """The gone hosts, and each queue still assigned to one with what its re-placement
        waits for (called from the main thread: the repair's state is copied under the lock)."""
        now = time.monotonic()
        with self._lock:
            gone_since, done = dict(self.gone), set(self._done)
            waiting, untold = dict(self.pending), sorted(self.untold)
            unwithdrawn = sorted(self.unwithdrawn)
        gone, pending = [], {}
        for name, since in sorted(gone_since.items()):
            queues = set() if name in done else self._queues_on({name})
            gone.append(GoneHost(name, round(now - since, 1), len(queues)))
            left = self.grace_s - (now - since)
            for queue in queues:
                pending[queue] = waiting.get(queue) or (
                    f"host {name} is gone; re-placed in {left:.0f} s (host.loss.grace)"
                    if left > 0
                    else f"host {name} is lost; re-placing"
                )
        said_of = [(q, f"host {h} not yet told that the monitor moved") for q, h in untold]
        said_of += [(q, f"host {h} has not stopped the called-off move's monitor")
                    for q, h in unwithdrawn]  # fmt: skip
        for queue, said in said_of:
            pending[queue] = f"{pending[queue]}; {said}" if queue in pending else said
        return tuple(gone), tuple(PendingRepair(q, c) for q, c in sorted(pending.items()))


class RepairThread(threading.Thread):
    """`gcm-repair`: checks for lost hosts while this GCM leads (see the module docstring for
    when). `fence_of` is the leadership's current fence (None while it does not lead): read
    every `limits.poll_interval_ms`, so a GCM that takes the lead checks within that, not a
    check period later."""

    def __init__(self, repair: HostLossRepair, fence_of: Callable[[], Fence | None]):
        super().__init__(name="gcm-repair", daemon=True)
        self.repair = repair
        self._fence_of = fence_of
        self._stopping = False  # set by the GCM's main thread (`stop`), read here: a bool
        self._wake = threading.Event()  # a host registered or vanished, or the GCM is stopping
        self._watching = False
        self._watch_failed = False  # logged once

    def run(self) -> None:
        while not self._stopping:
            self._wake.clear()
            fence = self._fence_of()
            wait_s = limits.poll_interval_ms / 1000
            if fence is not None:
                self._watch()
                self._term(fence)
                wait_s = max(0.0, self.repair.due_at() - time.monotonic())
            self._wake.wait(wait_s)

    def _watch(self) -> None:
        """The hosts' watch, set once (kazoo keeps it); until it is set the periodic check
        alone finds gone hosts."""
        if self._watching:
            return
        try:
            self.repair.registry.watch_hosts(self._wake.set)
            self._watching = True
        except CoordinationError as error:
            if not self._watch_failed:
                log.warning("hosts not watched yet (checked every %.0f s meanwhile): %s",
                            limits.host_loss_check_s, error)  # fmt: skip
            self._watch_failed = True

    def _term(self, fence: Fence) -> None:
        def leading() -> bool:
            return not self._stopping and self._fence_of() == fence

        self.repair.leading = leading
        self.repair.management.cancel_host_calls_when(lambda: not leading())
        try:
            # due: the thread wakes only when a check is (a change, the lead won, `due_at`)
            self.repair.tick(fence, time.monotonic(), force=True)
        except NotLeader:
            log.info("host loss repair stopped: this GCM no longer leads")
        except CoordinationError as error:  # ZooKeeper went away: the next check retries
            log.warning("host loss check failed: %s", error)
        except Exception:  # a bug must not end the repair for good: logged, retried
            log.exception("host loss check failed")

    def stop(self) -> None:
        self._stopping = True
        self._wake.set()
        if self.is_alive():
            self.join(timeout=limits.host_loss_stop_join_s)
