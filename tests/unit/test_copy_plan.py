"""Which exchange sends a gone log's copy again, and which ones receive it:
`placement.plan_copies` (docs/architecture.md §7, "Copying a gone log again")."""

from __future__ import annotations

from roq.monitor.placement import CopyPlan, ExchangeView, plan_copies


def _view(
    name: str, host: str, copies: dict[str, int] | None = None, leaving: bool = False
) -> ExchangeView:
    view = ExchangeView(name, f"f-{name}", f"b-{name}", 0.0, 0.0, 0.5, logged=True, host=host)
    view.copies, view.leaving = dict(copies or {}), leaving
    return view


def test_the_longest_copy_is_sent_to_an_exchange_on_another_host():
    views = [
        _view("a", "h2", {"lost": 900}),
        _view("b", "h2"),  # same host as the only copy
        _view("c", "h3"),
    ]
    plans = plan_copies(views, 2, {"lost"}, {})
    assert plans == {"lost": CopyPlan("lost", 900, ("a",), "a", ("c",))}


def test_a_shorter_copy_is_topped_up_before_a_new_copy_is_made():
    views = [
        _view("a", "h2", {"lost": 900}),
        _view("b", "h3", {"lost": 400}),  # was out of sync when its leader went
        _view("c", "h4"),
    ]
    plan = plan_copies(views, 2, {"lost"}, {})["lost"]
    assert (plan.source, plan.targets, plan.complete) == ("a", ("b",), ("a",))


def test_targets_holding_fewest_copies_are_chosen_and_spread_over_logs():
    views = [
        _view("a", "h1", {"g1": 10, "g2": 20}),
        _view("b", "h2", {"other": 5}),
        _view("c", "h3"),
        _view("d", "h4"),
    ]
    plans = plan_copies(views, 2, {"g1", "g2"}, {})
    assert plans["g1"].targets == ("c",)  # c and d hold none; c first by id
    assert plans["g2"].targets == ("d",)  # c took one copy already: d holds fewer now


def test_a_log_with_enough_complete_copies_or_none_or_not_gone_gets_no_plan():
    views = [
        _view("a", "h1", {"done": 50, "live": 5}),
        _view("b", "h2", {"done": 50}),
        _view("c", "h3"),
    ]
    assert plan_copies(views, 2, {"done", "absent"}, {}) == {}
    assert plan_copies(views, 3, {"done"}, {})["done"].targets == ("c",)
    assert plan_copies(views, 1, {"done"}, {}) == {}  # replicationFactor=1: no copy is kept


def test_a_plan_under_way_keeps_its_source_and_targets_while_they_are_live():
    views = [
        _view("a", "h1", {"g": 100}),
        _view("b", "h2", {"g": 100}),
        _view("c", "h3", {"g": 30}),  # receiving
        _view("d", "h4"),
    ]
    before = CopyPlan("g", 100, ("a", "b"), "b", ("c",))
    plan = plan_copies(views, 3, {"g"}, {"g": before})["g"]
    assert (plan.source, plan.targets) == ("b", ("c",))
    # its source gone: another complete copy sends; the target stays
    plan = plan_copies([v for v in views if v.exchange_id != "b"], 3, {"g"}, {"g": before})["g"]
    assert plan.source == "a" and plan.targets[0] == "c"


def test_leaving_and_unlogged_exchanges_neither_send_nor_receive():
    views = [
        _view("a", "h1", {"g": 100}, leaving=True),
        _view("b", "h2", {"g": 60}),
        _view("c", "h3"),
    ]
    views[2].logged = False
    plan = plan_copies(views, 2, {"g"}, {})["g"]
    # a's copy is not counted: b's is the longest one a live exchange holds, and nobody can take
    # another (c keeps no log)
    assert (plan.end, plan.source, plan.targets) == (60, "b", ())


def test_the_only_other_exchange_on_the_same_host_is_taken_when_there_is_no_other():
    views = [_view("a", "h1", {"g": 10}), _view("b", "h1")]
    assert plan_copies(views, 2, {"g"}, {})["g"].targets == ("b",)


def _keeper(name: str, host: str, copies: dict[str, int]) -> ExchangeView:
    view = _view(name, host, copies)
    view.keeper = True
    return view


def test_a_keeper_is_a_source_and_never_counts_as_a_copy_kept():
    """A returning host's keeper of lost exchange `k` (host/keepers.py) holds `k`'s log, the
    longest copy of `g`'s, and a short copy of `h`'s: it sends `k` and `g` to live exchanges
    until two of them hold each in full; `h` is sent from the live exchange with all of it."""
    views = [_view("a", "h1", {"h": 80}), _view("b", "h2", {"g": 100})]
    keeper = _keeper("k", "h3", {"k": 700, "g": 300, "h": 50})
    plans = plan_copies(views, 2, {"k", "g", "h"}, {}, [keeper])
    assert plans["k"] == CopyPlan("k", 700, (), "k", ("a", "b"))
    assert plans["g"] == CopyPlan("g", 300, (), "k", ("b", "a"))  # b's shorter copy topped up
    assert plans["h"] == CopyPlan("h", 80, ("a",), "a", ("b",))


def test_a_log_kept_by_a_keeper_and_copied_in_full_on_live_exchanges_needs_no_plan():
    views = [_view("a", "h1", {"k": 700}), _view("b", "h2", {"k": 700})]
    assert plan_copies(views, 2, {"k"}, {}, [_keeper("k", "h3", {"k": 700})]) == {}
    # a keeper that leaves (its queue stops) is no source
    leaving = _keeper("k", "h3", {"k": 700})
    leaving.leaving = True
    assert plan_copies(views[:1], 2, {"k"}, {}, [leaving])["k"].source == "a"
