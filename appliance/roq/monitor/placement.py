"""Where a publisher goes: placement and re-allocation (RoQ's "6 steps", reference §4.3–4.4).

Pure functions over the monitor's view of its exchanges; the monitor owns the state and the
sockets. Loads are payload bytes per second as the exchanges last reported them, corrected by the
monitor's own decisions since (RoQ's optimistic update, step 5).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from roq import limits
from roq.config import Thresholds


@dataclass
class ExchangeView:
    exchange_id: str
    front: str
    back: str
    first_seen: float
    last_seen: float
    period_s: float
    started: float = 0.0
    logged: bool = False  # the exchange keeps a message log subscribers can read (F+3)
    host: str = ""
    replicas: tuple[str, ...] = ()  # ids of the exchanges that copy this one's log
    copies: dict[str, int] = field(default_factory=dict)  # leader id → end of the copy held here
    bytes_rate: float = 0.0
    msgs_rate: float = 0.0
    producers: int = 0
    top: list[tuple[str, float]] = field(default_factory=list)  # (producer id hex, bytes/s)
    leaving: bool = False
    refusing: str = ""  # why its log refuses appends (a full disk), "" while it takes them
    in_sync: int = 0  # copies of its log in sync, the leader included (0: not reported)
    in_sync_min: int = 0  # min.insync.copies, as the exchange reported it
    subscriptions: int = 0  # (subscriber, key prefix) pairs the exchange last reported
    joined: bool = False  # the queue's subscribers have joined it (see `mark_joined`)
    overloaded_reports: int = 0
    cooldown_until: float = 0.0
    cpu: float = 0.0
    rss: int = 0
    placed_at: list[float] = field(default_factory=list)  # recent placements (monotonic s)
    keeper: bool = False  # a log keeper of a lost exchange (host/keepers.py), not an exchange
    follower: bool = False  # a log follower (log.followers): holds copies, takes no publishers

    def publishers(self, now: float) -> int:
        """Publishers as far as anyone knows: the exchange counts only those that sent in its
        last period, so recent placements of still-silent publishers count too."""
        recent = [t for t in self.placed_at if now - t < limits.placement_memory_s]
        self.placed_at = recent[-limits.placement_memory_max :]
        return max(self.producers, len(self.placed_at))

    def is_placeable(self, now: float, warmup_s: float) -> bool:
        """Takes publishers: once the subscribers have joined it, or after the warm-up at the
        latest (a subscriber that cannot reach it must not keep it idle for ever)."""
        return not self.leaving and (self.joined or now - self.first_seen >= warmup_s)


def mark_joined(exchanges: list[ExchangeView]) -> None:
    """An exchange has been joined by the queue's subscribers once it holds as many
    subscriptions as any exchange the monitor knew before it: a subscriber subscribes to the
    same key prefixes on every exchange of the queue. Once joined, always joined."""
    for view in exchanges:
        if view.joined or view.leaving:
            continue
        older = [
            x.subscriptions
            for x in exchanges
            if x is not view and not x.leaving and x.first_seen <= view.first_seen
        ]
        view.joined = view.subscriptions >= max(older, default=0)


@dataclass(frozen=True)
class Move:
    producer: str  # hex id
    source: ExchangeView
    target: ExchangeView
    bytes_rate: float


def choose_exchange(
    exchanges: list[ExchangeView], now: float, limits: Thresholds, avoid: str = ""
) -> ExchangeView | None:
    """The exchange a new (or failed-over) publisher should use, or None if there is none.

    Exchanges still warming up are used only when no other one is available, so that subscribers
    that are connected to the queue have joined a new exchange before messages flow through it.
    """
    running = [x for x in exchanges if not x.leaving]
    # One whose log refuses appends only when no other is left: the publisher then hears why
    # with each refused batch, rather than waiting for an exchange that never comes.
    writable = [x for x in running if not x.refusing] or running
    # `avoid` failed this publisher; if it is all there is, it came back (restarted): use it.
    live = [x for x in writable if x.front != avoid] or writable
    if not live:
        return None
    ready = [x for x in live if x.is_placeable(now, limits.warmup_s)] or live
    cold = all(x.bytes_rate < limits.coldstart * limits.max_throughput for x in ready)
    if cold:  # no statistics worth the name yet: spread by publisher count (RoQ's rule)
        chosen = min(ready, key=lambda x: (x.publishers(now), x.bytes_rate, x.first_seen))
    else:
        chosen = min(ready, key=lambda x: (x.bytes_rate, x.publishers(now), x.first_seen))
    chosen.placed_at.append(now)  # step 5's optimism: the next publisher sees this one counted
    return chosen


def plan_relocation(
    source: ExchangeView, exchanges: list[ExchangeView], now: float, limits: Thresholds
) -> list[Move]:
    """Steps 1–5 for one report of `source`; the caller publishes the moves (step 6)."""
    if source.bytes_rate <= limits.overload * limits.max_throughput:
        source.overloaded_reports = 0
        return []
    source.overloaded_reports += 1
    if source.overloaded_reports < limits.hysteresis or now < source.cooldown_until:
        return []
    others = [
        x
        for x in exchanges
        if x is not source and x.is_placeable(now, limits.warmup_s) and not x.refusing
    ]
    if not others or len(source.top) < 2:
        return []  # the limit case: nowhere to go, or one publisher carries it all
    moves = _pick_moves(source, others, limits, now)
    if moves:
        source.cooldown_until = now + limits.cooldown_s
        source.overloaded_reports = 0
    return moves


def _pick_moves(
    source: ExchangeView, others: list[ExchangeView], limits: Thresholds, now: float
) -> list[Move]:
    moves: list[Move] = []
    ceiling = limits.target * limits.max_throughput
    remaining = len(source.top)
    for producer, rate in sorted(source.top, key=lambda item: item[1], reverse=True):
        if len(moves) >= limits.producers_max or remaining <= 1 or source.bytes_rate <= ceiling:
            break
        target = min(others, key=lambda x: x.bytes_rate)
        fits = target.bytes_rate + rate < ceiling
        narrows = target.bytes_rate + rate < source.bytes_rate and (
            source.bytes_rate - target.bytes_rate > limits.optimise * source.bytes_rate
        )
        if not (fits or narrows):
            continue
        moves.append(_move(producer, source, target, rate, now))
        remaining -= 1
    return moves


def _move(
    producer: str, source: ExchangeView, target: ExchangeView, rate: float, now: float
) -> Move:
    """One planned move, with both exchanges' loads updated optimistically (step 5) so the
    next decision sees them."""
    target.bytes_rate += rate
    target.placed_at.append(now)
    source.bytes_rate -= rate
    source.producers -= 1
    return Move(producer, source, target, rate)


def plan_rebalance(
    target: ExchangeView, exchanges: list[ExchangeView], now: float, limits: Thresholds
) -> list[Move]:
    """Moves that fill a new (empty) exchange: the most active publishers of the busiest
    exchanges go to `target` until it carries its share of the queue's load.

    A move is made only if it narrows the gap between source and target (so nothing bounces
    back), and every source keeps at least one publisher. Loads are updated optimistically as
    in step 5, and each source is then left alone for the relocation cool-down."""
    live = [x for x in exchanges if not x.leaving]
    if target not in live or len(live) < 2:
        return []
    share = sum(x.bytes_rate for x in live) / len(live)
    moves: list[Move] = []
    for source in sorted(live, key=lambda x: x.bytes_rate, reverse=True):
        if source is target:
            continue
        remaining = len(source.top)
        for producer, rate in sorted(source.top, key=lambda item: item[1], reverse=True):
            if target.bytes_rate >= share or source.bytes_rate <= share or remaining <= 1:
                break
            if rate <= 0 or target.bytes_rate + rate >= source.bytes_rate:
                continue  # would only swap which exchange is the busier one
            moves.append(_move(producer, source, target, rate, now))
            remaining -= 1
        if any(move.source is source for move in moves):
            source.cooldown_until = now + limits.cooldown_s
    return moves


def assign_replicas(exchanges: list[ExchangeView], factor: int) -> dict[str, tuple[str, ...]]:
    """Replicas for each logged exchange (thesis §3.2.1): `factor - 1` others, chosen among
    those that can append (not refusing: a full disk takes no copy either), on other hosts
    when there are any, then log followers (which are there for it: they take no publishers),
    then those that already copy the fewest logs. A follower leads no log of its own."""
    logged = sorted(
        (x for x in exchanges if x.logged and not x.leaving), key=lambda x: x.exchange_id
    )
    load = {x.exchange_id: 0 for x in logged}
    plan: dict[str, tuple[str, ...]] = {}
    for leader in (x for x in logged if not x.follower):
        others = [x for x in logged if x is not leader]
        others.sort(
            key=lambda x: (
                bool(x.refusing),
                x.host == leader.host,
                not x.follower,
                load[x.exchange_id],
                x.exchange_id,
            )
        )
        chosen = tuple(x.exchange_id for x in others[: max(0, factor - 1)])
        for replica in chosen:
            load[replica] += 1
        plan[leader.exchange_id] = chosen
    return plan


@dataclass(frozen=True)
class CopyPlan:
    """A gone exchange's log with fewer than `factor` complete copies on live exchanges: the
    holder of a longest copy (`source`) sends it to each of `targets` until their copies end
    where it ends. A copy is never appended to by anything else (its leader is gone), so a copy
    that ends at `end` is complete."""

    leader_id: str
    end: int  # where the longest copy ends
    complete: tuple[str, ...]  # live exchanges whose copy ends at `end`
    source: str  # a live exchange or a log keeper whose copy ends at `end`
    targets: tuple[str, ...]  # exchanges that get a copy (may hold a shorter one already)


def plan_copies(
    exchanges: list[ExchangeView],
    factor: int,
    gone: set[str],
    current: dict[str, CopyPlan],
    keepers: list[ExchangeView] | None = None,
) -> dict[str, CopyPlan]:
    """A plan for each log in `gone` (ids of exchanges gone long enough) that a live exchange
    or a log keeper holds a copy of and that has fewer than `factor` complete copies on live
    exchanges (a keeper's copies are sources, never counted as kept: it goes once they are).
    Targets are live exchanges on a host without a complete copy first, then those holding part
    of it already, then those holding the fewest copies; a plan still under way keeps its
    source and targets while they are there, so a copy is not started again elsewhere every
    period."""
    live = sorted((x for x in exchanges if x.logged and not x.leaving), key=lambda x: x.exchange_id)
    kept = sorted((x for x in keepers or () if not x.leaving), key=lambda x: x.exchange_id)
    load = {x.exchange_id: len(x.copies) for x in live}
    plans: dict[str, CopyPlan] = {}
    for leader_id in sorted(gone):
        holders = {x.exchange_id: x.copies[leader_id] for x in live if leader_id in x.copies}
        in_keepers = {x.exchange_id: x.copies[leader_id] for x in kept if leader_id in x.copies}
        if not holders and not in_keepers:
            continue  # no copy left to copy from
        end = max([*holders.values(), *in_keepers.values()])
        complete = tuple(sorted(i for i, e in holders.items() if e == end))
        if len(complete) >= factor:
            continue
        able = complete + tuple(sorted(i for i, e in in_keepers.items() if e == end))
        before = current.get(leader_id)
        source = before.source if before and before.source in able else able[0]
        targets = _copy_targets(live, holders, complete, factor, before, load)
        for target in targets:
            load[target] += 1
        plans[leader_id] = CopyPlan(leader_id, end, complete, source, targets)
    return plans


def _copy_targets(
    live: list[ExchangeView],
    holders: dict[str, int],
    complete: tuple[str, ...],
    factor: int,
    before: CopyPlan | None,
    load: dict[str, int],
) -> tuple[str, ...]:
    needed = factor - len(complete)
    candidates = [x for x in live if x.exchange_id not in complete]
    kept = [x.exchange_id for x in candidates if before and x.exchange_id in before.targets]
    covered = {x.host for x in live if x.exchange_id in complete}
    candidates.sort(
        key=lambda x: (
            x.host in covered,  # another host than every complete copy's, when there is one
            -holders.get(x.exchange_id, -1),  # the longest partial copy: least left to send
            load[x.exchange_id],
            x.exchange_id,
        )
    )
    fresh = [x.exchange_id for x in candidates if x.exchange_id not in kept]
    return tuple((kept + fresh)[:needed])
