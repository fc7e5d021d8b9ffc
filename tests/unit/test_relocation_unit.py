"""RoQ's 6-step re-allocation (seed 000, "The re-allocation"; monitor/placement.py
`plan_relocation`), case by case: the one-publisher limit case, hysteresis, cool-down, the
candidate (step 4), step 4b's `optimise`, `producers.max`, and step 5's optimistic update.
Loads are payload bytes per second; `max_throughput` is 1000 here, so overload is above 1100
and a candidate must stay below 900 (relocate.target 0.90)."""

from __future__ import annotations

import dataclasses

from roq.config import Thresholds
from roq.monitor.placement import ExchangeView, plan_relocation

LIMITS = Thresholds(max_throughput=1000.0)


def _x(name: str, rate: float, top: list[tuple[str, float]] | None = None) -> ExchangeView:
    """An exchange seen long ago (past its warm-up), reporting `rate` and its producers."""
    top = top or []
    return ExchangeView(name, f"tcp://h:{name}", f"tcp://h:{name}b", first_seen=-100.0,
                        last_seen=0.0, period_s=1.0, bytes_rate=rate, producers=len(top),
                        top=list(top))  # fmt: skip


def _busy(rate: float = 1200.0) -> ExchangeView:
    return _x("busy", rate, [("p1", 500.0), ("p2", 400.0), ("p3", 300.0)])


def _twice(source: ExchangeView, others: list[ExchangeView], limits: Thresholds = LIMITS):
    """Two overloaded reports in a row (relocate.hysteresis = 2): the second may act."""
    everyone = [source, *others]
    assert plan_relocation(source, everyone, 0.0, limits) == []
    return plan_relocation(source, everyone, 1.0, limits)


def test_step_3_one_publisher_carrying_the_load_is_not_moved():
    alone = _x("busy", 5000.0, [("p1", 5000.0)])
    idle = _x("idle", 0.0)
    for now in range(5):  # past the hysteresis, overloaded every time
        assert plan_relocation(alone, [alone, idle], float(now), LIMITS) == []
    assert alone.bytes_rate == 5000.0 and idle.bytes_rate == 0.0  # nothing moved, even on paper


def test_nowhere_to_go_moves_nothing():
    source = _busy()
    assert _twice(source, []) == []
    assert _twice(_busy(), [dataclasses.replace(_x("new", 0.0), first_seen=0.5)]) == []  # warming


def test_hysteresis_acts_on_the_second_overloaded_report_in_a_row_only():
    source, idle = _busy(), _x("idle", 0.0)
    assert plan_relocation(source, [source, idle], 0.0, LIMITS) == []
    source.bytes_rate = 1000.0  # a report below the overload mark resets the count
    assert plan_relocation(source, [source, idle], 1.0, LIMITS) == []
    source.bytes_rate = 1200.0
    assert plan_relocation(source, [source, idle], 2.0, LIMITS) == []  # first of a new run
    assert plan_relocation(source, [source, idle], 3.0, LIMITS) != []
    once = dataclasses.replace(LIMITS, hysteresis=1)
    assert plan_relocation(_busy(), [_busy(), _x("idle", 0.0)], 0.0, once) != []


def test_no_second_decision_within_the_cooldown():
    source, idle = _busy(), _x("idle", 0.0)
    moves = _twice(source, [idle])
    assert [m.producer for m in moves] == ["p1"]
    source.bytes_rate, idle.bytes_rate = 1500.0, 0.0  # still overloaded at the next reports
    later = 1.0 + LIMITS.cooldown_s
    for now in (2.0, 3.0, later - 0.1):
        assert plan_relocation(source, [source, idle], now, LIMITS) == []
    assert plan_relocation(source, [source, idle], later, LIMITS) != []


def test_step_4_the_candidate_is_the_least_loaded_and_step_5_updates_both_at_once():
    source, light, lighter = _busy(), _x("light", 300.0), _x("lighter", 100.0)
    [move] = _twice(source, [light, lighter])
    assert (move.producer, move.target.exchange_id, move.bytes_rate) == ("p1", "lighter", 500.0)
    # step 5's optimism: the next decision sees the moved load where it went
    assert (source.bytes_rate, lighter.bytes_rate) == (700.0, 600.0)
    assert source.producers == 2 and len(lighter.placed_at) == 1


def test_optimise_moves_what_does_not_fit_only_if_it_narrows_a_wide_gap():
    # p1 (500) does not fit under 900 on a candidate at 600, but 1200 → 700 / 1100 narrows a
    # gap of 600 (50 % of 1200), wider than optimise (20 %): step 4b moves it
    source, candidate = _busy(), _x("other", 600.0)
    assert [m.producer for m in _twice(source, [candidate])] == ["p1"]
    # the same with optimise 0.6: a gap of 50 % is not wide enough, and nothing fits (4a)
    strict = dataclasses.replace(LIMITS, optimise=0.6)
    assert _twice(_busy(), [_x("other", 600.0)], strict) == []
    # a move that would make the candidate as busy as the source or busier is never made: at
    # 800, p1 (→ 1300) and p2 (→ 1200) are skipped, and p3 (→ 1100 < 1200) narrows the gap
    assert [m.producer for m in _twice(_busy(), [_x("other", 800.0)])] == ["p3"]
    assert _twice(_busy(), [_x("other", 950.0)]) == []  # at 950 every move would: none


def test_producers_max_bounds_the_moves_of_one_decision_and_one_stays():
    heavy = _x("busy", 4000.0, [(f"p{n}", 800.0) for n in range(5)])
    idle = [_x(f"idle{n}", 0.0) for n in range(5)]
    assert len(_twice(heavy, idle)) == LIMITS.producers_max == 3
    roq_s = dataclasses.replace(LIMITS, producers_max=1)  # RoQ moved one publisher a minute
    heavy = _x("busy", 4000.0, [(f"p{n}", 800.0) for n in range(5)])
    assert len(_twice(heavy, [_x(f"i{n}", 0.0) for n in range(5)], roq_s)) == 1
    # however many may move, the source keeps one publisher
    many = dataclasses.replace(LIMITS, producers_max=10)
    pair = _x("busy", 3000.0, [("p1", 1500.0), ("p2", 1500.0)])
    assert len(_twice(pair, [_x(f"i{n}", 0.0) for n in range(3)], many)) == 1


def test_moves_stop_once_the_source_is_below_the_target():
    source = _x("busy", 1150.0, [("p1", 300.0), ("p2", 200.0), ("p3", 100.0), ("p4", 550.0)])
    moves = _twice(source, [_x("a", 0.0), _x("b", 0.0)])
    assert [m.producer for m in moves] == ["p4"]  # 1150 - 550 = 600 < 900: done
