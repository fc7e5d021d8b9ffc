"""Elasticity of one logical queue, the monitor's side: the `Scaler` ties the pure policy
(policy.py) to the actuator thread (actuator.py) and to the monitor.

It runs in the monitor's main thread and hooks in at three points: every exchange report feeds
the exchange's load window (`observe`), a timer asks the policy for a decision and hands it to the
actuator (`tick`), and each exchange the actuator created is filled by moving publishers onto it
(re-allocation, `roq.monitor.placement.plan_rebalance`). It also keeps the queue's rules (read or
pushed by the GCM, the highest version wins) and the recent scaling events that `roq status`
shows and the KPI stream carries.
"""

from __future__ import annotations

import collections
import logging
import queue as queue_mod
import time
import uuid
from collections.abc import Callable
from typing import Any

from roq import limits
from roq.backoff import Backoff
from roq.config import MonitorSettings, Thresholds
from roq.coordination.session import SharedSession
from roq.errors import ProtocolError
from roq.monitor.actuator import Acted, Actuator, RulesRead
from roq.monitor.placement import ExchangeView, Move, plan_rebalance
from roq.monitor.policy import (
    Decision,
    ExchangeLoad,
    LoadWindow,
    Rules,
    Sample,
    copies_missing,
    implicit_rules,
    make_policy,
    supersedes,
)
from roq.protocol import bsonmsg
from roq.protocol.messages.control import RulesInForce, ScalingStatus
from roq.protocol.messages.kpi import ScalingEvent
from roq.protocol.messages.monitor import ReportedLoad, RulesUpdate
from roq.protocol.rules import RuleSet
from roq.transport import Kind, bind, drained, open_socket, security

log = logging.getLogger(__name__)


class Scaler:
    """The scaling side of one monitor. Everything but the actuator runs in the monitor's main
    thread, which owns `sock` (PULL, the rules pushed by the GCM)."""

    def __init__(
        self, context: Any, queue: str, settings: MonitorSettings, zk: SharedSession,
        address: str, listen_port: int, emit: Callable[[ScalingEvent], None],
    ):  # fmt: skip
        self.queue = queue
        self.name = f"monitor {queue}"
        self.config = settings.scaling
        self.replication_factor = settings.replication_factor
        self.followers_wanted = followers_wanted(settings)
        # scale-in keeps the exchanges that, with the followers, hold replicationFactor copies
        self.policy = make_policy(self.config, self.replication_factor - self.followers_wanted)
        # when the copies floor may ask again (`_copies_floor`), and how much later after that
        self._floor_retry_at = time.monotonic() + limits.copies_floor_start_s
        self._floor_backoff = Backoff(
            limits.copies_floor_retry_first_s, limits.copies_floor_retry_s
        )
        self.rules: Rules = implicit_rules(self.config)
        self.stored_rules = False
        self.rules_version = 0
        self.windows: dict[str, LoadWindow] = {}
        self.events: collections.deque[ScalingEvent] = collections.deque(
            maxlen=limits.scaling_events_kept
        )
        self.decisions: dict[str, int] = {}  # events by kind since the start
        self.in_flight: tuple[str, str, float] | None = None  # (action, argument, since)
        self.fresh: dict[str, float] = {}  # exchanges created here, awaiting rebalancing
        self.scaled_out = self.scaled_in = 0
        self._next_rebalance: dict[str, float] = {}
        # how long a new exchange waits for load to move onto it before it is left to placement
        self._rebalance_for_s = max(3.0, 2 * self.config.window_s)
        self._emit = emit
        self.sock = open_socket(context, Kind.PULL, rcvhwm=limits.rules_updates_hwm)
        bind(self.sock, address, listen_port, security.access_domain(cluster=True))  # the GCM
        self.actuator = Actuator(
            queue, settings.zk, zk, self.config.rules_refresh_s, f"tcp://{address}:{listen_port}",
            gcm=settings.gcm,
        )  # fmt: skip
        self.actuator.start()

    # --- inputs ------------------------------------------------------------------------------
    def observe(self, exchange_id: str, load: ReportedLoad, now: float) -> None:
        window = self.windows.setdefault(exchange_id, LoadWindow(self.config.window_s))
        window.add(
            Sample(
                at=now,
                bytes_rate=load.bytes_rate,
                msgs_rate=load.msgs_rate,
                producers=load.producers,
                load=load.load,
                ram_mb=load.rss / 2**20,
            )
        )

    def forget(self, exchange_id: str) -> None:
        self.windows.pop(exchange_id, None)

    def pump_rules(self) -> None:
        """Rule updates pushed by the GCM (2008)."""
        for frames in drained(self.sock, limits.rules_updates_hwm):
            try:
                update = RulesUpdate.decode(bsonmsg.decode(frames))
            except ProtocolError as error:
                log.warning("%s: ignored a bad rules update: %s", self.name, error)
                continue
            self._offer(update.rules)

    def _offer(self, stored: RuleSet | None) -> None:
        """Rules read (2007) or pushed (2008): the highest `Version` wins, whatever the order in
        which they arrive; None (nothing stored) only counts while nothing stored was seen."""
        version = supersedes(self.rules_version, None if stored is None else stored.version)
        if version is None:
            return
        rules = implicit_rules(self.config) if stored is None else Rules.of(stored)
        self.rules_version = version
        if rules != self.rules:
            self.rules, self.stored_rules = rules, stored is not None
            self._event("rules_updated", f"rules now {rules.describe()} (version {version})")

    # --- the decision loop --------------------------------------------------------------------
    def tick(
        self, views: list[ExchangeView], now: float, limits_: Thresholds, followers: int = 0
    ) -> list[Move]:
        """Collect the actuator's results, decide, and return publishers to move onto a new
        exchange (the monitor publishes them). `views`: the exchanges; `followers`: the log
        followers that can take a copy."""
        self._collect(now)
        moves = self._rebalance(views, now, limits_)
        loads = [
            ExchangeLoad(
                exchange_id=v.exchange_id,
                smoothed=self.windows[v.exchange_id].mean(now)
                if v.exchange_id in self.windows
                else None,
                placeable=v.is_placeable(now, limits_.warmup_s),
                leaving=v.leaving,
                age_s=now - v.first_seen,
                refusing=bool(v.refusing),
            )
            for v in views
        ]
        busy = self.in_flight is not None or bool(self.fresh)
        decision = self._copies_floor(loads, now, busy, followers) or self.policy.decide(
            loads, self.rules, now, busy
        )
        if decision is not None:
            self._start(decision, now)
        return moves

    def _copies_floor(
        self, loads: list[ExchangeLoad], now: float, busy: bool, followers: int
    ) -> Decision | None:
        """A queue keeps log.followers log followers and, with them, replicationFactor
        processes that can hold a copy (not leaving, not refusing appends), whatever its load
        and policy: each exchange logs and holds a copy of the others' logs, each follower of
        every log, so with fewer some log has fewer copies than acks=all waits for
        (min.insync.copies). A missing follower is asked for first. The GCM places the new one
        on a host without the queue's exchanges and followers first (it knows nothing of disks:
        with none such, it may land on the full disk's host). The request says `below`: the
        exchanges and followers this monitor knows, plus one. A monitor that has not heard
        every one yet (it just started or moved) so asks for none the GCM has recorded on a live
        host: it is refused, and asks again after a back-off (the cluster may also have no
        room, or be re-placing it), 0.5 s up to 2 s."""
        wanted = self.replication_factor
        standing = [x for x in loads if not x.leaving and not x.refusing]
        missing = copies_missing(len(standing), followers, wanted, self.followers_wanted)
        if missing is None:
            self._floor_backoff.reset()
            return None
        if busy or now < self._floor_retry_at:
            return None
        follower = missing == "follower"
        if not follower and self.config.max_exchanges and len(loads) >= self.config.max_exchanges:
            return None
        self._floor_retry_at = now + self._floor_backoff.next_s()
        below = len(loads) + followers + 1
        if follower:
            return Decision(
                "follower",
                f"{followers} log follower(s), log.followers {self.followers_wanted}: another "
                "holds a copy of each log",
                below=below,
            )
        return Decision(
            "copies",
            f"{len(standing)} exchange(s) and {followers} log follower(s), replicationFactor "
            f"{wanted}: another exchange keeps a copy of each log",
            below=below,
        )

    def _start(self, decision: Decision, now: float) -> None:
        argument = decision.exchange_id or f"scale-{self.queue}-{uuid.uuid4().hex[:12]}"
        try:
            self.actuator.actions.put_nowait((decision.action, argument, decision.below))
        except queue_mod.Full:
            return
        self.in_flight = (decision.action, argument, now)
        self.policy.acted(now)
        if decision.action in ("out", "copies", "follower"):
            self._event("scale_out", decision.reason, exchanges=len(self.windows))
        else:
            self._event("scale_in", decision.reason, exchange=argument)

    def _collect(self, now: float) -> None:
        while True:
            try:
                result = self.actuator.results.get_nowait()
            except queue_mod.Empty:
                break
            if isinstance(result, RulesRead):
                self._offer(result.rules)
            else:
                self._finished(result, now)
        for exchange_id, since in list(self.fresh.items()):
            if now - since > limits.scaling_fresh_wait_s:
                del self.fresh[exchange_id]
                self._event("scale_failed", f"exchange {exchange_id} never reported")

    def _finished(self, result: Acted, now: float) -> None:
        self.in_flight = None
        took = f"{result.seconds:.2f} s"
        if not result.ok:
            kind = "capacity_exhausted" if result.reason == "no_capacity" else "scale_failed"
            self._event(kind, f"{result.comment} ({took})", action=result.kind)
            return
        exchange_id = result.exchange_id
        if result.kind == "follower":  # takes no publishers: nothing to rebalance onto it
            self._event("follower_added", f"created in {took}", exchange=exchange_id)
        elif result.kind in ("out", "copies"):
            self.scaled_out += 1
            self.fresh[exchange_id] = now
            self._event("exchange_added", f"created in {took}", exchange=exchange_id)
        else:
            self.scaled_in += 1
            self._event("exchange_retired", f"drained and stopped in {took}", exchange=exchange_id)

    def _rebalance(self, views: list[ExchangeView], now: float, limits_: Thresholds) -> list[Move]:
        """Fill each new exchange once it takes publishers. A moment without load (the last
        reports showed nothing to move) is retried every `limits.scaling_rebalance_retry_s` for a
        while."""
        every: list[Move] = []
        for view in views:
            pending = self.fresh.get(view.exchange_id)
            if pending is None or not view.is_placeable(now, limits_.warmup_s):
                continue
            if now < self._next_rebalance.get(view.exchange_id, 0.0):
                continue
            moves = plan_rebalance(view, views, now, limits_)
            if moves or now - pending > self._rebalance_for_s:
                del self.fresh[view.exchange_id]
                self._next_rebalance.pop(view.exchange_id, None)
            if moves:
                self._moved(moves)
                every.extend(moves)
            elif view.exchange_id not in self.fresh:
                loads = {v.exchange_id: (round(v.bytes_rate), len(v.top)) for v in views}
                self._event(
                    "rebalance_idle",
                    f"no publisher worth moving to {view.exchange_id} "
                    f"(B/s and publishers reported per exchange: {loads})",
                )
            else:
                self._next_rebalance[view.exchange_id] = now + limits.scaling_rebalance_retry_s
        return every

    def _moved(self, moves: list[Move]) -> None:
        for move in moves:
            self._event(
                "publisher_moved",
                f"{move.bytes_rate:,.0f} B/s from {move.source.exchange_id} to the new "
                f"exchange {move.target.exchange_id}",
                producer=move.producer,
            )

    # --- outputs -------------------------------------------------------------------------------
    def _event(
        self, kind: str, reason: str, *, exchanges: int | None = None, exchange: str = "",
        action: str = "", producer: str = "",
    ) -> None:  # fmt: skip
        event = ScalingEvent(
            self.queue, kind, reason, self.policy.name, time.time(),
            exchanges=exchanges, exchange=exchange, action=action, producer=producer,
        )  # fmt: skip
        shown = ("Event", "Reason", "Policy", "Time")
        extra = {k: v for k, v in event.entry().items() if k not in shown}
        log.info("%s: scaling %s: %s %s", self.name, kind, reason, extra or "")
        self.events.append(event)
        # by kind, a fixed vocabulary (roq_monitor_scaling_decisions_total)
        self.decisions[kind] = self.decisions.get(kind, 0) + 1
        self._emit(event)

    def status(self, now: float) -> ScalingStatus:
        cooldown = getattr(self.policy, "cooldown_until", 0.0)
        low_since = getattr(self.policy, "low_since", None)
        r = self.rules
        return ScalingStatus(
            policy=self.policy.name,
            rules=RulesInForce(
                r.name,
                r.host_cpu,
                r.host_ram,
                r.exchange_throughput,
                r.queue_producers,
                r.queue_throughput,
                stored=self.stored_rules,
                version=self.rules_version,
            ),
            min_exchanges=self.config.min_exchanges,
            max_exchanges=self.config.max_exchanges,
            in_flight=self.in_flight[0] if self.in_flight else "",
            cooldown_left_s=max(0.0, cooldown - now),
            low_for_s=0.0 if low_since is None else now - low_since,
            scaled_out=self.scaled_out,
            scaled_in=self.scaled_in,
            events=tuple(self.events),
        )

    def close(self) -> None:
        self.actuator.stop.set()
        self.actuator.join(limits.scaling_actuator_join_s)
        self.sock.close(0)


def followers_wanted(settings: MonitorSettings) -> int:
    """The log followers a queue keeps: log.followers, at most replicationFactor - 1 (more
    would hold no copy), none without message logs."""
    if not settings.use_log:
        return 0
    return max(0, min(settings.log_followers, settings.replication_factor - 1))
