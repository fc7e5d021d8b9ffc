"""The scaling policy of one logical queue: when it gets another exchange and when it gives one
back. Pure: decisions from load windows and rules, no sockets, no threads, no clients, no clocks
of its own (callers pass `now`, monotonic seconds).

The monitor's `Scaler` (scaling.py) feeds each exchange report into a `LoadWindow` (per-second
rates smoothed over `scaling.window.ms`), asks its `Policy` for a `Decision` on every tick (each
poll interval), and hands the decision to its actuator thread (actuator.py, which talks to the
GCM: 2004 to scale out, 2014 to scale in).

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
from dataclasses import dataclass, field
from typing import Protocol

from roq import limits
from roq.config import ScalingConfig
from roq.protocol.rules import RuleSet, exchange_rule_fires, host_rule_fires, queue_rule_fires

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
        self.samples: collections.deque[Sample] = collections.deque(
            maxlen=limits.monitor_load_samples_max
        )

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
    def of(cls, stored: RuleSet) -> Rules:
        """From the stored rules (a group not given has its checks off)."""
        return cls(
            name=stored.name,
            host_cpu=stored.limit("AUTOSCALING_HOST", "AUTOSCALING_HOST_CPU"),
            host_ram=stored.limit("AUTOSCALING_HOST", "AUTOSCALING_HOST_RAM"),
            exchange_throughput=stored.limit("AUTOSCALING_XCHANGE", "AUTOSCALING_XCHANGE_THR"),
            queue_producers=stored.limit("AUTOSCALING_Q", "AUTOSCALING_Q_PROD_EXCH"),
            queue_throughput=stored.limit("AUTOSCALING_Q", "AUTOSCALING_THR_PROD_EXCH"),
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
    refusing: bool = False  # its log refuses appends (a full disk): it holds no new copy


@dataclass(frozen=True)
class Decision:
    # "out" or "in"; "copies": out, below replicationFactor; "follower": a log follower
    action: str
    reason: str
    exchange_id: str = ""  # the exchange to retire (scale-in)
    below: int = 0  # "copies": only while the GCM records fewer exchanges than this


def implicit_rules(config: ScalingConfig) -> Rules:
    """The rule in force while none is stored for the queue."""
    return Rules(exchange_throughput=config.highwater * config.max_throughput)


class Policy(Protocol):
    """Decides, from the queue's exchanges, whether to add or retire one. Called by the monitor's
    main thread on every scaling tick (each poll interval); `busy` is true while an action is in
    flight."""

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
    floor: int = 1  # exchanges scale-in keeps (replicationFactor: each holds copies)
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
        fits = n > max(1, self.floor, self.config.min_exchanges) and total < mark * (n - 1)
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


def supersedes(current: int, version: int | None) -> int | None:
    """`version` (of rules read or pushed; None: no rules stored) if those rules should replace
    rules of version `current`, else None: the highest version wins in whatever order they
    arrive, and no rules stored only counts while no stored rules were seen."""
    if version is None:
        return None if current else 0
    return None if version < current else version


def make_policy(config: ScalingConfig, floor: int = 1) -> Policy:
    """The policy named by `scaling.policy`; scale-in never goes below `floor` exchanges
    (replicationFactor less the log followers: scaling.py keeps that many whatever the
    policy)."""
    if config.policy == "null":
        return NullPolicy()
    return DefaultPolicy(config, floor=max(1, floor))


def copies_missing(
    exchanges: int, followers: int, factor: int, followers_wanted: int
) -> str | None:
    """What a queue lacks to hold `factor` copies of each log (scaling.py's copies floor), with
    `exchanges` and `followers` standing (not leaving, not refusing appends): "follower" while
    it has fewer log followers than `followers_wanted`, then "exchange" while both together are
    fewer than `factor`; None when nothing is missing (or `factor` is 1: no copy is kept)."""
    if factor < 2:
        return None
    if followers < followers_wanted:
        return "follower"
    if exchanges + followers < factor:
        return "exchange"
    return None
