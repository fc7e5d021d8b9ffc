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
from roq.config import MonitorSettings, Thresholds
from roq.errors import ProtocolError
from roq.monitor.actuator import Actuator
from roq.monitor.placement import ExchangeView, Move, plan_rebalance
from roq.monitor.policy import (
    Decision,
    ExchangeLoad,
    LoadWindow,
    Rules,
    Sample,
    implicit_rules,
    make_policy,
    supersedes,
)
from roq.protocol import bsonmsg
from roq.protocol.commands import StatCommand
from roq.protocol.rules import validate_rules
from roq.transport import Kind, bind, drained, open_socket

log = logging.getLogger(__name__)


class Scaler:
    """The scaling side of one monitor. Everything but the actuator runs in the monitor's main
    thread, which owns `sock` (PULL, the rules pushed by the GCM)."""

    def __init__(
        self, context: Any, queue: str, settings: MonitorSettings, address: str, listen_port: int,
        emit: Callable[[dict[str, Any]], None],
    ):  # fmt: skip
        self.queue = queue
        self.name = f"monitor {queue}"
        self.config = settings.scaling
        self.policy = make_policy(self.config)
        self.rules: Rules = implicit_rules(self.config)
        self.stored_rules = False
        self.rules_version = 0
        self.windows: dict[str, LoadWindow] = {}
        self.events: collections.deque[dict[str, Any]] = collections.deque(
            maxlen=limits.scaling_events_kept
        )
        self.in_flight: tuple[str, str, float] | None = None  # (action, argument, since)
        self.fresh: dict[str, float] = {}  # exchanges created here, awaiting rebalancing
        self.scaled_out = self.scaled_in = 0
        self._next_rebalance: dict[str, float] = {}
        # how long a new exchange waits for load to move onto it before it is left to placement
        self._rebalance_for_s = max(3.0, 2 * self.config.window_s)
        self._emit = emit
        self.sock = open_socket(context, Kind.PULL, rcvhwm=16)
        bind(self.sock, address, listen_port)
        self.actuator = Actuator(
            queue, settings.zk, self.config.rules_refresh_s, f"tcp://{address}:{listen_port}"
        )
        self.actuator.start()

    # --- inputs ------------------------------------------------------------------------------
    def observe(self, exchange_id: str, doc: dict[str, Any], now: float) -> None:
        window = self.windows.setdefault(exchange_id, LoadWindow(self.config.window_s))
        window.add(
            Sample(
                at=now,
                bytes_rate=float(doc.get("Bytes", 0.0)),
                msgs_rate=float(doc.get("Msgs", 0.0)),
                producers=int(doc.get("Producers", 0)),
                load=float(doc.get("Load", 0.0)),
                ram_mb=float(doc.get("RSS", 0)) / 2**20,
            )
        )

    def forget(self, exchange_id: str) -> None:
        self.windows.pop(exchange_id, None)

    def pump_rules(self) -> None:
        """Rule updates pushed by the GCM (2008)."""
        for frames in drained(self.sock, 16):
            try:
                self._offer(bsonmsg.decode(frames))
            except ProtocolError as error:
                log.warning("%s: ignored a bad rules update: %s", self.name, error)

    def _offer(self, doc: dict[str, Any] | None) -> None:
        """Rules read (2007) or pushed (2008): the highest `Version` wins, whatever the order in
        which they arrive; None (nothing stored) only counts while nothing stored was seen."""
        version = supersedes(self.rules_version, doc)
        if version is None:
            return
        try:
            rules = (
                implicit_rules(self.config) if doc is None else Rules.from_doc(validate_rules(doc))
            )
        except ValueError as error:
            log.warning("%s: unusable rules, keeping the current ones: %s", self.name, error)
            return
        self.rules_version = version
        if rules != self.rules:
            self.rules, self.stored_rules = rules, doc is not None
            self._event("rules_updated", f"rules now {rules.describe()} (version {version})")

    # --- the decision loop --------------------------------------------------------------------
    def tick(self, views: list[ExchangeView], now: float, limits_: Thresholds) -> list[Move]:
        """Collect the actuator's results, decide, and return publishers to move onto a new
        exchange (the monitor publishes them)."""
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
            )
            for v in views
        ]
        busy = self.in_flight is not None or bool(self.fresh)
        decision = self.policy.decide(loads, self.rules, now, busy)
        if decision is not None:
            self._start(decision, now)
        return moves

    def _start(self, decision: Decision, now: float) -> None:
        argument = decision.exchange_id or f"scale-{self.queue}-{uuid.uuid4().hex[:12]}"
        try:
            self.actuator.actions.put_nowait((decision.action, argument))
        except queue_mod.Full:
            return
        self.in_flight = (decision.action, argument, now)
        self.policy.acted(now)
        if decision.action == "out":
            self._event("scale_out", decision.reason, Exchanges=len(self.windows))
        else:
            self._event("scale_in", decision.reason, Exchange=argument)

    def _collect(self, now: float) -> None:
        while True:
            try:
                result = self.actuator.results.get_nowait()
            except queue_mod.Empty:
                break
            if result["Kind"] == "rules":
                self._offer(result["Rules"])
            else:
                self._finished(result, now)
        for exchange_id, since in list(self.fresh.items()):
            if now - since > limits.scaling_fresh_wait_s:
                del self.fresh[exchange_id]
                self._event("scale_failed", f"exchange {exchange_id} never reported")

    def _finished(self, result: dict[str, Any], now: float) -> None:
        self.in_flight = None
        took = f"{result['Seconds']:.2f} s"
        if not result["Ok"]:
            kind = "capacity_exhausted" if result["Reason"] == "no_capacity" else "scale_failed"
            self._event(kind, f"{result['Comment']} ({took})", Action=result["Kind"])
            return
        exchange_id = str(result["Exchange"]["Id"])
        if result["Kind"] == "out":
            self.scaled_out += 1
            self.fresh[exchange_id] = now
            self._event("exchange_added", f"created in {took}", Exchange=exchange_id)
        else:
            self.scaled_in += 1
            self._event("exchange_retired", f"drained and stopped in {took}", Exchange=exchange_id)

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
                Producer=move.producer,
            )

    # --- outputs -------------------------------------------------------------------------------
    def _event(self, kind: str, reason: str, **fields: Any) -> None:
        log.info("%s: scaling %s: %s %s", self.name, kind, reason, fields or "")
        doc = {
            "CMD": int(StatCommand.SCALING_EVENT),
            "QName": self.queue,
            "Event": kind,
            "Reason": reason,
            "Policy": self.policy.name,
            "Time": time.time(),
            **fields,
        }
        self.events.append(doc)
        self._emit(doc)

    def status(self, now: float) -> dict[str, Any]:
        cooldown = getattr(self.policy, "cooldown_until", 0.0)
        low_since = getattr(self.policy, "low_since", None)
        return {
            "Policy": self.policy.name,
            "Rules": {
                **self.rules.describe(),
                "Stored": self.stored_rules,
                "Version": self.rules_version,
            },
            "Min": self.config.min_exchanges,
            "Max": self.config.max_exchanges,
            "InFlight": self.in_flight[0] if self.in_flight else "",
            "CooldownLeft": max(0.0, cooldown - now),
            "LowFor": 0.0 if low_since is None else now - low_since,
            "ScaledOut": self.scaled_out,
            "ScaledIn": self.scaled_in,
            "Events": [
                {k: v for k, v in e.items() if k not in ("CMD", "QName")} for e in self.events
            ],
        }

    def close(self) -> None:
        self.actuator.stop.set()
        self.actuator.join(limits.scaling_actuator_join_s)
        self.sock.close(0)
