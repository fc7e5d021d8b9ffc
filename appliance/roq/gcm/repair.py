"""Host loss is repaired: the leading GCM re-places the work of a host that stays gone.

A host's registration is ephemeral: it vanishes `zk.session.timeout` after the host died (or
stalled, or was cut off). Once it has been gone for `host.loss.grace` more, each RUNNING queue
with work recorded on it is re-placed, a few queues per check (`limits.host_loss_queues_per_pass`,
the check every `limits.host_loss_check_s`, from the GCM's main loop):

1. Its monitor, if it was there, starts on the live host with the most free exchange slots that
   takes it (the same host request as a create, 1002, so that host may also start an exchange if
   the queue has none left); the queue record then names that host and the monitor's ports (a
   fenced write, as every leader write). Every live host that runs exchanges of the queue is told
   (1013), and tells them (1031): they report to the new monitor from then on.
2. Each exchange recorded on the lost host gets a successor, so the queue keeps its capacity: an
   exchange started by step 1 counts as one, the others are created as a 2004 with the
   transaction id `replace-<lost id>` (idempotent, on the least loaded host; none free: the
   provisioner is asked, as scale-out does). The lost exchange's record stays, marked `lost`:
   its log's copies on surviving exchanges stay readable through the monitor's list of dead
   logs, and a host that comes back never starts it again (host/adoption.py).

What cannot be done now (no host with a free slot, a host that does not answer) is kept as a
pending repair, shown by `roq status`, and tried again at the next check. The memory of when a
host went is this GCM's: a GCM that takes the lead starts the clock again (a host can wait up to
one grace more after a fail-over). Not done here: fencing a monitor whose host was only cut off,
and copying lost logs again (docs/guarantees.md §10).
"""

from __future__ import annotations

import logging
import time

from roq import limits
from roq.coordination.registry import ExchangeRecord, Fence, HostRecord, QueueState, Registry
from roq.gcm.management import HostBack, Management, Refused, _address_of
from roq.protocol.bsonmsg import Reply
from roq.protocol.commands import Reason
from roq.protocol.messages.admin import CreateExchange, GoneHost, PendingRepair
from roq.protocol.messages.host import MonitorMovedOnHost

log = logging.getLogger(__name__)


class HostLossRepair:
    """Called from the GCM's main thread only (`tick`), while it leads."""

    def __init__(self, management: Management, grace_s: float):
        self.management = management
        self.registry: Registry = management.registry
        self.grace_s = grace_s
        self.gone: dict[str, float] = {}  # host name → when its registration was seen gone
        self.pending: dict[str, str] = {}  # queue → what its repair waits for
        self._seen: set[str] | None = None  # hosts live at the last check; None: first check
        self._asked: set[str] = set()  # queues the provisioner was asked for
        self._done: set[str] = set()  # gone hosts whose work is all re-placed
        self._next_check = 0.0

    def tick(self, fence: Fence, now: float) -> None:
        if now < self._next_check:
            return
        self._next_check = now + limits.host_loss_check_s
        live = {h.name for h in self.registry.hosts()}
        self._note_gone(live, now)
        due = {n for n, since in self.gone.items() if now - since >= self.grace_s} - self._done
        if not due:
            return
        queues = self._queues_on(due)
        for name in list(self.pending):
            if name not in queues:
                del self.pending[name]
                self._asked.discard(name)
        for queue in sorted(queues)[: limits.host_loss_queues_per_pass]:
            try:
                self._repair(queue, due, fence)
                self.pending.pop(queue, None)
            except Refused as refused:
                self.pending[queue] = str(refused)
                log.warning("queue %s: re-placement after host loss waits: %s", queue, refused)
        if not self.pending and len(queues) <= limits.host_loss_queues_per_pass:
            self._done |= due  # nothing is assigned to them any more: no more scans for them

    def _note_gone(self, live: set[str], now: float) -> None:
        """Hosts seen live before and gone now; at the first check, the hosts that have work
        recorded but no registration."""
        missing = (self._seen or set()) - live
        if self._seen is None:
            missing = self._assigned_hosts() - live
        for name in missing:
            if len(self.gone) < limits.host_loss_gone_max:
                self.gone.setdefault(name, now)
        for name in [n for n in self.gone if n in live]:
            del self.gone[name]  # back: it adopts what is still assigned to it
            self._done.discard(name)
        self._seen = live

    def _assigned_hosts(self) -> set[str]:
        hosts = set()
        for queue in self.registry.queues():
            if queue.state == QueueState.RUNNING:
                hosts.add(queue.host)
                hosts.update(x.host for x in self.registry.exchanges(queue.name) if not x.lost)
        return hosts

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
    def _repair(self, queue: str, gone: set[str], fence: Fence) -> None:
        gone = gone - {h.name for h in self.registry.hosts()}  # one may be back since the check
        got = self.registry.queue(queue)
        if not gone or got is None or got[0].state != QueueState.RUNNING:
            return
        before = self.registry.exchanges(queue)
        lost = [x for x in before if x.host in gone and not x.lost]
        spare = 0
        if got[0].host in gone:
            log.warning("queue %s: its monitor's host %s is lost; re-placing it", queue,
                        got[0].host)  # fmt: skip
            known = {x.id for x in before}
            self._move_monitor(queue, fence, got[0].host)
            spare = sum(1 for x in self.registry.exchanges(queue) if x.id not in known)
        for exchange in lost:
            if spare > 0:
                spare -= 1  # the monitor's new host started an exchange: it takes this one's place
            else:
                self._replace_exchange(exchange, fence)
            exchange.lost = True
            self.registry.update_exchange(fence, exchange)
            log.warning("queue %s: exchange %s on lost host %s replaced", queue, exchange.id,
                        exchange.host)  # fmt: skip

    def _move_monitor(self, queue: str, fence: Fence, lost: str) -> None:
        refusals = []
        for host in self._hosts_with_free_slots():
            try:
                self.management._start_on_host(queue, host, fence, replacing=lost)
            except HostBack:
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
            said = ": " + self.management.provisioner.provision(
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
        """Every live host with exchanges of the queue: they report to the new monitor."""
        got = self.registry.queue(queue)
        if got is None:
            return
        record = got[0]
        request = MonitorMovedOnHost(
            queue, record.monitor_port, record.stat_port, _address_of(record.monitor), record.epoch
        )
        hosts = {x.host for x in self.registry.exchanges(queue) if not x.lost}
        for host in self.registry.hosts():
            if host.name not in hosts:
                continue
            try:
                self.management._call_host(host, request, Reply.decode)
            except Refused as error:  # its exchanges keep reporting to the old address
                log.error("queue %s: host %s not told of the new monitor: %s", queue,
                          host.name, error)  # fmt: skip

    def _replace_exchange(self, lost: ExchangeRecord, fence: Fence) -> None:
        txid = f"replace-{lost.id}"[: limits.transaction_id_chars_max]
        request = CreateExchange(lost.queue, txid).encode()
        reply = Reply.decode(self.management.handle(request, fence))
        if not reply.ok:
            reason = Reason(reply.error) if reply.error in set(Reason) else Reason.HOST_FAILED
            raise Refused(reason, f"no exchange in place of {lost.id}: {reply.comment}")

    # --- what `roq status` shows ---------------------------------------------------------
    def report(self) -> tuple[tuple[GoneHost, ...], tuple[PendingRepair, ...]]:
        """The gone hosts, and each queue still assigned to one with what its re-placement
        waits for."""
        now = time.monotonic()
        gone, pending = [], {}
        for name, since in sorted(self.gone.items()):
            queues = set() if name in self._done else self._queues_on({name})
            gone.append(GoneHost(name, round(now - since, 1), len(queues)))
            left = self.grace_s - (now - since)
            for queue in queues:
                pending[queue] = self.pending.get(queue) or (
                    f"host {name} is gone; re-placed in {left:.0f} s (host.loss.grace)"
                    if left > 0
                    else f"host {name} is lost; re-placing"
                )
        return tuple(gone), tuple(PendingRepair(q, c) for q, c in sorted(pending.items()))
