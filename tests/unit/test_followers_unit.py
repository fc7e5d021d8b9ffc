"""Log followers (log.followers) in the monitor's pure decisions: which replicas a log gets
(`placement.assign_replicas`), what the copies floor asks for (`policy.copies_missing`), how
many followers a queue keeps (`scaling.followers_wanted`), and the wire fields that carry them."""

from __future__ import annotations

import dataclasses

import pytest

from roq import config
from roq.monitor.placement import ExchangeView, assign_replicas, plan_copies
from roq.monitor.policy import DefaultPolicy, copies_missing, make_policy
from roq.monitor.scaling import followers_wanted
from roq.protocol.messages.admin import CreateExchange, RecordedExchange
from roq.protocol.messages.host import CreateExchangeOnHost, ExchangeInfo


def _view(name: str, host: str, follower: bool = False, **kw: object) -> ExchangeView:
    view = ExchangeView(name, f"tcp://{host}:{len(name)}", "b", 0.0, 0.0, 0.5, logged=True,
                        host=host, follower=follower)  # fmt: skip
    for key, value in kw.items():
        setattr(view, key, value)
    return view


def test_a_follower_is_every_logs_first_replica_and_leads_none():
    views = [_view("x1", "h1"), _view("x2", "h2"), _view("f1", "h3", follower=True)]
    plan = assign_replicas(views, 2)
    assert plan == {"x1": ("f1",), "x2": ("f1",)}  # not each other: the follower is there for it
    assert "f1" not in plan


def test_a_follower_on_the_leaders_own_host_or_refusing_comes_after_other_hosts():
    views = [_view("x1", "h1"), _view("x2", "h2"), _view("f1", "h1", follower=True)]
    assert assign_replicas(views, 2)["x1"] == ("x2",)  # another host first
    full = [_view("x1", "h1"), _view("x2", "h2"), _view("f1", "h3", True, refusing="ENOSPC")]
    assert assign_replicas(full, 2)["x1"] == ("x2",)  # a full disk takes no copy


def test_r3_with_one_follower_copies_to_it_and_to_another_exchange():
    views = [_view("x1", "h1"), _view("x2", "h2"), _view("f1", "h3", follower=True)]
    plan = assign_replicas(views, 3)
    assert plan["x1"] == ("f1", "x2") and plan["x2"] == ("f1", "x1")


def test_a_gone_log_is_copied_to_a_follower_and_from_one():
    follower = _view("f1", "h3", follower=True, copies={"gone": 700})
    fresh = _view("x2", "h2")
    plan = plan_copies([fresh, follower], 2, {"gone"}, {})["gone"]
    assert (plan.source, plan.targets, plan.complete) == ("f1", ("x2",), ("f1",))
    other = _view("f2", "h4", follower=True)
    holder = _view("x1", "h1", copies={"gone": 700})
    assert plan_copies([holder, other], 2, {"gone"}, {})["gone"].targets == ("f2",)


@pytest.mark.parametrize(
    ("exchanges", "followers", "factor", "wanted", "missing"),
    [
        (1, 0, 2, 1, "follower"),  # a follower first
        (0, 1, 2, 1, "exchange"),  # a queue needs an exchange to take publishers
        (1, 1, 2, 1, None),
        (1, 1, 3, 1, "exchange"),  # R=3, one follower: two exchanges
        (2, 1, 3, 1, None),
        (1, 0, 2, 0, "exchange"),  # no followers: replicationFactor exchanges
        (2, 0, 2, 0, None),
        (1, 0, 1, 0, None),  # R=1 keeps no copy
        (1, 0, 1, 1, None),
    ],
)
def test_the_copies_floor_asks_for_a_follower_then_exchanges(
    exchanges: int, followers: int, factor: int, wanted: int, missing: str | None
):
    assert copies_missing(exchanges, followers, factor, wanted) == missing


def _monitor_settings(**given: object) -> config.MonitorSettings:
    defined = {key: str(value) for key, value in given.items()}
    return config.MonitorSettings.from_settings(config.load_hcm(None, defined))


def test_a_queue_keeps_at_most_replication_factor_minus_one_followers_and_none_without_logs():
    assert followers_wanted(_monitor_settings(**{"replicationFactor": 2, "log.followers": 5})) == 1
    assert followers_wanted(_monitor_settings(**{"replicationFactor": 3, "log.followers": 1})) == 1
    assert followers_wanted(_monitor_settings(**{"replicationFactor": 1, "log.followers": 2})) == 0
    no_log = {"replicationFactor": 2, "log.followers": 1, "useLog": "false"}
    assert followers_wanted(_monitor_settings(**no_log)) == 0


def test_scale_in_stops_at_one_exchange_when_followers_hold_the_copies():
    settings = _monitor_settings(**{"replicationFactor": 2, "log.followers": 1})
    policy = make_policy(settings.scaling, settings.replication_factor - 1)
    assert isinstance(policy, DefaultPolicy) and policy.floor == 1
    never_none = make_policy(settings.scaling, 0)
    assert isinstance(never_none, DefaultPolicy) and never_none.floor == 1


def test_the_follower_flag_travels_on_every_message_that_places_or_records_one():
    request = CreateExchange("q1", "tx", below=3, follower=True)
    assert CreateExchange.decode(request.encode()) == request
    assert "Follower" not in CreateExchange("q1", "tx").encode()  # as older GCMs read it
    on_host = CreateExchangeOnHost("q1", "tx", 1, 2, "127.0.0.1", follower=True)
    assert CreateExchangeOnHost.decode(on_host.encode()) == on_host
    info = ExchangeInfo("x1", 5000, "tx", "tcp://127.0.0.1:5000", "tcp://127.0.0.1:5001", True)
    assert ExchangeInfo.decode(info.fields()) == info
    plain = dataclasses.replace(info, follower=False)
    assert "Follower" not in plain.fields() and ExchangeInfo.decode(plain.fields()) == plain
    recorded = RecordedExchange("x1", "h1", "tcp://a:1", "tcp://a:2", follower=True)
    assert RecordedExchange.decode(recorded.fields()) == recorded
