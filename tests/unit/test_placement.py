"""When a new exchange may take publishers: `placement.mark_joined` and `is_placeable`."""

from __future__ import annotations

from roq.config import Thresholds
from roq.monitor.placement import ExchangeView, choose_exchange, mark_joined, plan_relocation


def _view(name: str, first_seen: float, subscriptions: int, leaving: bool = False) -> ExchangeView:
    view = ExchangeView(name, f"f-{name}", f"b-{name}", first_seen, first_seen, 0.5)
    view.subscriptions, view.leaving = subscriptions, leaving
    return view


def test_the_first_exchange_is_joined_with_or_without_subscribers():
    only = _view("x1", 0.0, 0)
    mark_joined([only])
    assert only.joined and only.is_placeable(0.0, warmup_s=60.0)


def test_a_new_exchange_waits_until_it_has_every_subscription_an_older_one_has():
    old, new = _view("x1", 0.0, 3), _view("x2", 10.0, 2)
    mark_joined([old, new])
    assert not new.joined and not new.is_placeable(11.0, warmup_s=60.0)
    new.subscriptions = 3
    mark_joined([old, new])
    assert new.joined and new.is_placeable(11.0, warmup_s=60.0)


def test_joined_is_kept_when_more_subscribers_arrive_later():
    old, new = _view("x1", 0.0, 1), _view("x2", 10.0, 1)
    mark_joined([old, new])
    old.subscriptions = 5
    mark_joined([old, new])
    assert new.joined


def test_a_leaving_exchange_is_not_the_reference_and_the_warm_up_is_the_bound():
    leaving, new = _view("x1", 0.0, 4, leaving=True), _view("x2", 10.0, 0)
    mark_joined([leaving, new])
    assert new.joined
    stuck_old, stuck_new = _view("x1", 0.0, 4), _view("x2", 10.0, 3)
    mark_joined([stuck_old, stuck_new])
    assert not stuck_new.is_placeable(69.0, warmup_s=60.0)
    assert stuck_new.is_placeable(70.0, warmup_s=60.0)  # a subscriber that never joins


def test_an_exchange_that_refuses_appends_takes_no_publisher_while_another_can():
    limits = Thresholds(max_throughput=1_000_000)
    full, roomy = _view("x1", 0.0, 0), _view("x2", 0.0, 0)
    full.refusing = "no room for 1048576 bytes: No space left on device"
    full.joined = roomy.joined = True
    roomy.placed_at = [0.0] * 5  # busier by count: only the refusal keeps x1 out
    assert choose_exchange([full, roomy], 1.0, limits) is roomy
    assert choose_exchange([full, roomy], 1.0, limits, avoid=roomy.front) is roomy
    # the last one left: placed there, so its publishers hear why with each refused batch
    assert choose_exchange([full], 1.0, limits) is full


def test_relocation_never_targets_an_exchange_that_refuses_appends():
    limits = Thresholds(max_throughput=1_000, hysteresis=1)
    busy, full = _view("x1", 0.0, 0), _view("x2", 0.0, 0)
    busy.joined = full.joined = True
    busy.bytes_rate, busy.top = 5_000.0, [("p1", 2_500.0), ("p2", 2_500.0)]
    full.refusing = "read-only file system"
    assert plan_relocation(busy, [busy, full], 10.0, limits) == []
    full.refusing = ""
    assert [m.target for m in plan_relocation(busy, [busy, full], 20.0, limits)] == [full]
