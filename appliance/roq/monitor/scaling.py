"""Elasticity of one logical queue: when it gets another exchange and when it gives one back.

The monitor feeds each exchange report into a `LoadWindow` (per-second rates smoothed over
`scaling.window.ms`), asks its `Policy` for a `Decision` on every report, and hands the decision
to its actuator thread (which talks to the GCM: 2004 to scale out, 2014 to scale in). Everything
here is pure: no sockets, no clocks of its own (callers pass `now`, monotonic seconds).

Rules are RoQ's three kinds (`roq.protocol.rules`), evaluated on smoothed values:

* exchange rule (`AUTOSCALING_XCHANGE_THR`, payload bytes/s) and host rule (`AUTOSCALING_HOST_CPU`
  = load average, `AUTOSCALING_HOST_RAM` = exchange RSS in MB) fire for the queue when they fire on
  *every* exchange that takes publishers: while one exchange has room, re-allocation (the 6 steps)
  is the cheaper cure;
* queue rule (`AUTOSCALING_Q_PROD_EXCH`, `AUTOSCALING_THR_PROD_EXCH`): producers or bytes/s per
  exchange above the limit.

With no rule stored for the queue, the implicit rule is an exchange rule at
`scaling.highwater` × `exchange.max.throughput`.

Scale-in: the queue's whole load would fit in one exchange fewer at `scaling.lowwater` of the
per-exchange capacity, continuously for `scaling.lowwater.ms`. Any action starts a cool-down
(`scaling.cooldown.ms`) during which no other action is taken, so load flapping around a
threshold cannot make exchanges come and go faster than that.
"""

from __future__ import annotations

import collections
import logging
import queue as queue_mod
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from roq import limits
from roq.config import Settings
from roq.errors import ProtocolError, RoqError
from roq.monitor.placement import ExchangeView, Move, Thresholds, plan_rebalance
from roq.protocol import bsonmsg
from roq.protocol.commands import AdminCommand, StatCommand
from roq.protocol.rules import (
    exchange_rule_fires,
    host_rule_fires,
    queue_rule_fires,
    validate_rules,
)
from roq.transport import Kind, bind, drained, open_socket

log = logging.getLogger(__name__)

SAMPLES_MAX = 10_000  # samples kept per exchange, whatever the window and heartbeat
MIN_SAMPLES = 2  # an exchange needs this many reports before its load counts for a rule


@dataclass
class Sample:
    at: float
    bytes_rate: float
    msgs_rate: float
    producers: int
    load: float  # host load average (RoQ's "CPU")
    ram_mb: float  # exchange resident memory (RoQ's "RAM")


class LoadWindow:
    """The reports of one exchange within the last `window_s` seconds."""

    def __init__(self, window_s: float):
        self.window_s = window_s
        self.samples: collections.deque[Sample] = collections.deque(maxlen=SAMPLES_MAX)

    def add(self, sample: Sample) -> None:
        self.samples.append(sample)
        self._trim(sample.at)

    def _trim(self, now: float) -> None:
        while self.samples and now - self.samples[0].at > self.window_s:
            self.samples.popleft()

    def mean(self, now: float) -> Sample | None:
        """The smoothed load, or None while fewer than MIN_SAMPLES reports are in the window."""
        self._trim(now)
        n = len(self.samples)
        if n < MIN_SAMPLES:
            return None
        return Sample(
            at=now,
            bytes_rate=sum(s.bytes_rate for s in self.samples) / n,
            msgs_rate=sum(s.msgs_rate for s in self.samples) / n,
            producers=round(sum(s.producers for s in self.samples) / n),
            load=sum(s.load for s in self.samples) / n,
            ram_mb=sum(s.ram_mb for s in self.samples) / n,
        )


@dataclass(frozen=True)
class Rules:
    """One queue's rule set; a zero limit disables its check (RoQ)."""

    name: str = "implicit"
    host_cpu: float = 0.0
    host_ram: float = 0.0
    exchange_throughput: float = 0.0
    queue_producers: float = 0.0
    queue_throughput: float = 0.0

    @classmethod
    def from_doc(cls, doc: dict[str, Any]) -> Rules:
        """From the stored form of a 2006 request (`roq.protocol.rules.validate_rules`)."""
        host = doc.get("AUTOSCALING_HOST") or {}
        xchange = doc.get("AUTOSCALING_XCHANGE") or {}
        queue = doc.get("AUTOSCALING_Q") or {}
        return cls(
            name=str(doc.get("AUTOSCALING_NAME", "")),
            host_cpu=float(host.get("AUTOSCALING_HOST_CPU", 0)),
            host_ram=float(host.get("AUTOSCALING_HOST_RAM", 0)),
            exchange_throughput=float(xchange.get("AUTOSCALING_XCHANGE_THR", 0)),
            queue_producers=float(queue.get("AUTOSCALING_Q_PROD_EXCH", 0)),
            queue_throughput=float(queue.get("AUTOSCALING_THR_PROD_EXCH", 0)),
        )

    def capacity(self, fallback: float) -> float:
        """Bytes/s one exchange is meant to carry under these rules (for scale-in)."""
        return self.exchange_throughput or self.queue_throughput or fallback

    def describe(self) -> dict[str, float | str]:
        return {
            "Name": self.name,
            "HostCPU": self.host_cpu,
            "HostRAM": self.host_ram,
            "ExchangeThroughput": self.exchange_throughput,
            "QueueProducers": self.queue_producers,
            "QueueThroughput": self.queue_throughput,
        }


@dataclass(frozen=True)
class ExchangeLoad:
    """What a policy sees of one exchange."""

    exchange_id: str
    smoothed: Sample | None  # None: too few reports yet
    placeable: bool  # takes publishers (not leaving, past its warm-up)
    leaving: bool
    age_s: float


@dataclass(frozen=True)
class Decision:
    action: str  # "out" or "in"
    reason: str
    exchange_id: str = ""  # the exchange to retire (scale-in)


@dataclass(frozen=True)
class ScalingConfig:
    window_s: float = 2.0
    cooldown_s: float = 10.0
    highwater: float = 0.9
    lowwater: float = 0.3
    lowwater_s: float = 30.0
    min_exchanges: int = 1
    max_exchanges: int = 0  # 0: as many as the hosts have slots for
    max_throughput: float = 100_000_000.0

    @classmethod
    def from_settings(cls, settings: Settings) -> ScalingConfig:
        return cls(
            window_s=settings.get_int("scaling.window.ms") / 1000,
            cooldown_s=settings.get_int("scaling.cooldown.ms") / 1000,
            highwater=settings.get_float("scaling.highwater"),
            lowwater=settings.get_float("scaling.lowwater"),
            lowwater_s=settings.get_int("scaling.lowwater.ms") / 1000,
            min_exchanges=settings.get_int("scaling.min.exchanges"),
            max_exchanges=settings.get_int("scaling.max.exchanges"),
            max_throughput=float(settings.get_int("exchange.max.throughput")),
        )

    def implicit_rules(self) -> Rules:
        return Rules(exchange_throughput=self.highwater * self.max_throughput)


class Policy(Protocol):
    """Decides, from the queue's exchanges, whether to add or retire one. Called by the monitor's
    main thread on every exchange report; `busy` is true while an action is in flight."""

    name: str

    def decide(
        self, exchanges: list[ExchangeLoad], rules: Rules, now: float, busy: bool
    ) -> Decision | None: ...

    def acted(self, now: float) -> None:
        """An action was started: the cool-down begins."""


class NullPolicy:
    """Scaling turned off (RoQ's NullScalingPolicy, issue #148): never decides anything."""

    name = "null"

    def decide(
        self, exchanges: list[ExchangeLoad], rules: Rules, now: float, busy: bool
    ) -> Decision | None:
        return None

    def acted(self, now: float) -> None:
        return None


@dataclass
class DefaultPolicy:
    """Scale out when a rule fires, in when the load stays under the low-water mark."""

    config: ScalingConfig
    name: str = "default"
    cooldown_until: float = 0.0
    low_since: float | None = None
    last_reason: str = field(default="", repr=False)

    def acted(self, now: float) -> None:
        self.cooldown_until = now + self.config.cooldown_s
        self.low_since = None

    def decide(
        self, exchanges: list[ExchangeLoad], rules: Rules, now: float, busy: bool
    ) -> Decision | None:
        if busy or any(x.leaving for x in exchanges):
            self.low_since = None
            return None  # a change is under way: judge the queue once it has settled
        active = [x for x in exchanges if x.placeable]
        measured = [x for x in active if x.smoothed is not None]
        if not active or len(measured) < len(active):
            return None  # a new exchange has no statistics yet
        fired = self.fired_rule(measured, rules)
        if fired:
            self.low_since = None
            if now < self.cooldown_until:
                return None
            if self.config.max_exchanges and len(exchanges) >= self.config.max_exchanges:
                return None
            return Decision("out", fired)
        return self._scale_in(measured, rules, now)

    def fired_rule(self, measured: list[ExchangeLoad], rules: Rules) -> str:
        """The reason a rule fires for the queue, or "" (see the module docstring)."""
        loads = [x.smoothed for x in measured if x.smoothed is not None]
        n = len(loads)
        total = sum(s.bytes_rate for s in loads)
        producers = sum(s.producers for s in loads)
        if rules.exchange_throughput and all(
            exchange_rule_fires(rules.exchange_throughput, s.bytes_rate) for s in loads
        ):
            low = min(s.bytes_rate for s in loads)
            return (
                f"exchange rule {rules.name}: every exchange above "
                f"{rules.exchange_throughput:,.0f} B/s (least loaded {low:,.0f} B/s)"
            )
        if (rules.host_cpu or rules.host_ram) and all(
            host_rule_fires(rules.host_cpu, rules.host_ram, s.load, s.ram_mb) for s in loads
        ):
            return (
                f"host rule {rules.name}: every exchange's host above CPU {rules.host_cpu} "
                f"or RAM {rules.host_ram} MB"
            )
        if queue_rule_fires(rules.queue_producers, rules.queue_throughput, producers, total, n):
            return (
                f"queue rule {rules.name}: {producers / n:.1f} producers and "
                f"{total / n:,.0f} B/s per exchange (limits {rules.queue_producers:g}, "
                f"{rules.queue_throughput:,.0f})"
            )
        return ""

    def _scale_in(self, measured: list[ExchangeLoad], rules: Rules, now: float) -> Decision | None:
        n = len(measured)
        loads = [x.smoothed for x in measured if x.smoothed is not None]
        total = sum(s.bytes_rate for s in loads)
        producers = sum(s.producers for s in loads)
        fallback = self.config.highwater * self.config.max_throughput
        mark = self.config.lowwater * rules.capacity(fallback)
        fits = n > max(1, self.config.min_exchanges) and total < mark * (n - 1)
        if fits and rules.queue_producers:
            fits = producers / (n - 1) <= self.config.lowwater * rules.queue_producers
        if not fits:
            self.low_since = None
            return None
        if self.low_since is None:
            self.low_since = now
        if now - self.low_since < self.config.lowwater_s or now < self.cooldown_until:
            return None
        victim = min(measured, key=_retire_order)
        return Decision(
            "in",
            f"{total:,.0f} B/s fits in {n - 1} exchange(s) below the low-water mark "
            f"({mark:,.0f} B/s each) for {now - self.low_since:.1f} s",
            victim.exchange_id,
        )


def _retire_order(x: ExchangeLoad) -> tuple[float, float]:
    """The least-loaded exchange goes first; among equals the youngest."""
    return (x.smoothed.bytes_rate if x.smoothed else 0.0, x.age_s)


def supersedes(current: int, doc: dict[str, Any] | None) -> int | None:
    """The version of `doc` (rules read or pushed) if it should replace rules of version
    `current`, else None: the highest version wins in whatever order they arrive, and None (no
    rules stored) only counts while no stored rules were seen."""
    if doc is None:
        return None if current else 0
    version = doc.get("Version", 0)
    if isinstance(version, bool) or not isinstance(version, int) or version < current:
        return None
    return version


def make_policy(settings: Settings) -> Policy:
    """The policy named by `scaling.policy`."""
    if settings.get_str("scaling.policy") == "null":
        return NullPolicy()
    return DefaultPolicy(ScalingConfig.from_settings(settings))


# --- the monitor's side: actuator thread and the glue ----------------------------------------
_ACTIONS_MAX = 4  # actions queued for the actuator (one is in flight at a time anyway)
_RESULTS_MAX = 64  # actuator results waiting for the monitor's main thread
_EVENTS_KEPT = 20  # recent scaling events shown by `roq status`
_FRESH_WAIT_S = 30.0  # a created exchange that never reports is given up on after this
_REBALANCE_RETRY_S = 0.5  # filling a new exchange found nothing to move: look again this soon
_RULES_RETRY_S = 1.0  # a failed rules refresh is retried this soon (doubling each time)
_ADMIN_RETRIES = 3  # attempts per admin request (each bounded by the AdminClient's timeout)
_JOIN_TIMEOUT_S = 0.5  # closing the monitor waits this long for the actuator (a daemon thread)


class Actuator(threading.Thread):
    """Talks to the GCM for the monitor: rules (2007/2008) and exchanges (2004/2014).

    Owns its AdminClient (not thread-safe); these requests block for seconds (2004 starts a
    process), which the monitor's main loop must never do. Requests come in on `actions`, results
    go out on `results`; both queues are bounded."""

    def __init__(self, queue: str, settings: Settings, listen: str):
        super().__init__(name=f"scaling {queue}", daemon=True)
        self.queue = queue
        self.listen = listen  # tcp://ip:B+4, the monitor's rules PULL socket
        self.zk = settings.get_str("zk.servers")
        self.namespace = settings.get_str("zk.namespace")
        self.refresh_s = settings.get_int("scaling.rules.refresh.ms") / 1000
        self.actions: queue_mod.Queue[tuple[str, str]] = queue_mod.Queue(_ACTIONS_MAX)
        self.results: queue_mod.Queue[dict[str, Any]] = queue_mod.Queue(_RESULTS_MAX)
        self.stop = threading.Event()

    def run(self) -> None:
        from roq.client.admin import AdminClient

        with AdminClient(zk=self.zk, namespace=self.namespace, retries=_ADMIN_RETRIES) as admin:
            next_refresh, retry_s = 0.0, _RULES_RETRY_S
            while not self.stop.is_set():
                if time.monotonic() >= next_refresh:
                    if self._refresh_rules(admin):
                        wait_s, retry_s = self.refresh_s, _RULES_RETRY_S
                    else:  # the GCM is away: ask again, less and less often
                        wait_s, retry_s = retry_s, min(2 * retry_s, self.refresh_s)
                    next_refresh = time.monotonic() + wait_s
                try:
                    action, argument = self.actions.get(timeout=limits.poll_interval_ms / 1000)
                except queue_mod.Empty:
                    continue
                self._put(self._act(admin, action, argument))

    def _refresh_rules(self, admin: Any) -> bool:
        """Register for pushes first, then read: no update can fall between the two."""
        from roq.client.admin import AdminRefused

        try:
            admin.request(
                {
                    "CMD": int(AdminCommand.REGISTER_FOR_AUTOSCALING_RULE_UPDATE),
                    "QName": self.queue,
                    "Address": self.listen,
                }
            )
            try:
                rules: dict[str, Any] | None = admin.get_rules(self.queue)
            except AdminRefused:
                rules = None  # none stored: the implicit rule applies
        except (RoqError, ValueError) as error:
            log.info("queue %s: rules not read yet (%s); retrying", self.queue, error)
            return False
        self._put({"Kind": "rules", "Rules": rules})
        return True

    def _act(self, admin: Any, action: str, argument: str) -> dict[str, Any]:
        from roq.client.admin import AdminRefused

        started = time.monotonic()
        try:
            if action == "out":
                reply = admin.create_exchange(self.queue, argument)
                result = {"Ok": True, "Exchange": reply["Exchange"]}
            else:
                admin.remove_exchange(self.queue, argument)
                result = {"Ok": True, "Exchange": {"Id": argument}}
        except AdminRefused as refused:
            result = {"Ok": False, "Reason": refused.reason, "Comment": str(refused)}
        except (RoqError, ValueError, KeyError) as error:
            result = {"Ok": False, "Reason": "unreachable", "Comment": str(error)}
        return {"Kind": action, "Seconds": time.monotonic() - started, **result}

    def _put(self, result: dict[str, Any]) -> None:
        try:
            self.results.put(result, timeout=1.0)
        except queue_mod.Full:
            log.warning("queue %s: scaling result dropped (monitor not reading)", self.queue)


class Scaler:
    """The scaling side of one monitor. Everything but the actuator runs in the monitor's main
    thread, which owns `sock` (PULL, the rules pushed by the GCM)."""

    def __init__(
        self, context: Any, queue: str, settings: Settings, address: str, listen_port: int,
        emit: Callable[[dict[str, Any]], None],
    ):  # fmt: skip
        self.queue = queue
        self.name = f"monitor {queue}"
        self.config = ScalingConfig.from_settings(settings)
        self.policy = make_policy(settings)
        self.rules: Rules = self.config.implicit_rules()
        self.stored_rules = False
        self.rules_version = 0
        self.windows: dict[str, LoadWindow] = {}
        self.events: collections.deque[dict[str, Any]] = collections.deque(maxlen=_EVENTS_KEPT)
        self.in_flight: tuple[str, str, float] | None = None  # (action, argument, since)
        self.fresh: dict[str, float] = {}  # exchanges created here, awaiting rebalancing
        self.scaled_out = self.scaled_in = 0
        self._next_rebalance: dict[str, float] = {}
        # how long a new exchange waits for load to move onto it before it is left to placement
        self._rebalance_for_s = max(3.0, 2 * self.config.window_s)
        self._emit = emit
        self.sock = open_socket(context, Kind.PULL, rcvhwm=16)
        bind(self.sock, address, listen_port)
        self.actuator = Actuator(queue, settings, f"tcp://{address}:{listen_port}")
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
                self.config.implicit_rules() if doc is None else Rules.from_doc(validate_rules(doc))
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
            if now - since > _FRESH_WAIT_S:
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
        reports showed nothing to move) is retried every `_REBALANCE_RETRY_S` for a while."""
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
                self._next_rebalance[view.exchange_id] = now + _REBALANCE_RETRY_S
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
        self.actuator.join(_JOIN_TIMEOUT_S)
        self.sock.close(0)
