"""Scaling policy, rebalancing and the provisioners, without processes (pure functions)."""

from __future__ import annotations

import ast
import itertools
import os
import time
from pathlib import Path

import pytest

from roq import config
from roq.config import Ec2Config, ScalingConfig, Thresholds
from roq.errors import ConfigError, DecodeError
from roq.gcm.provisioning import (
    Ec2Provisioner,
    NoProvisioner,
    make_provisioner,
    run_instances_args,
    user_data,
)
from roq.monitor import policy
from roq.monitor.placement import ExchangeView, plan_rebalance
from roq.monitor.policy import (
    DefaultPolicy,
    ExchangeLoad,
    LoadWindow,
    NullPolicy,
    Rules,
    Sample,
    implicit_rules,
    make_policy,
    supersedes,
)
from roq.protocol.rules import RuleSet

CONFIG = ScalingConfig(
    window_s=1.0,
    cooldown_s=5.0,
    highwater=0.5,
    lowwater=0.3,
    lowwater_s=3.0,
    min_exchanges=1,
    max_exchanges=0,
    max_throughput=200_000,
)
IMPLICIT = implicit_rules(CONFIG)  # every exchange above 100 KB/s


def _sample(bytes_rate: float, producers: int = 2, load: float = 0.0, ram: float = 0.0) -> Sample:
    return Sample(0.0, bytes_rate, bytes_rate / 100, producers, load, ram)


def _x(name: str, bytes_rate: float | None, **kw: object) -> ExchangeLoad:
    smoothed = None if bytes_rate is None else _sample(bytes_rate, **kw)  # type: ignore[arg-type]
    return ExchangeLoad(name, smoothed, placeable=True, leaving=False, age_s=10.0)


_IMPURE = ("threading", "socket", "zmq", "kazoo", "roq.transport", "roq.coordination", "roq.client")


def test_the_policy_is_pure():
    """policy.py only decides: no socket, no thread, no client (the actuator carries it out)."""
    tree = ast.parse(Path(policy.__file__).read_text(encoding="utf-8"))
    names = {alias.name for n in ast.walk(tree) if isinstance(n, ast.Import) for alias in n.names}
    names |= {n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)}
    assert not [name for name in names if name.startswith(_IMPURE)], names


# --- smoothing ----------------------------------------------------------------------------------
def test_window_averages_the_reports_of_its_span_and_needs_two():
    window = LoadWindow(1.0)
    window.add(Sample(0.0, 100.0, 1.0, 1, 0.5, 10.0))
    assert window.mean(0.0) is None, "one report is not a trend"
    window.add(Sample(0.5, 300.0, 3.0, 3, 1.5, 30.0))
    mean = window.mean(0.5)
    assert mean is not None and mean.bytes_rate == 200.0 and mean.producers == 2
    window.add(Sample(1.2, 500.0, 5.0, 5, 2.5, 50.0))  # the first report left the window
    mean = window.mean(1.2)
    assert mean is not None and mean.bytes_rate == 400.0
    assert window.mean(10.0) is None, "stale reports do not count"


# --- rules --------------------------------------------------------------------------------------
def test_rules_from_a_stored_2006_document():
    stored = RuleSet.decode(
        {
            "AUTOSCALING_NAME": "r1",
            "AUTOSCALING_HOST": {"AUTOSCALING_HOST_CPU": 30, "AUTOSCALING_HOST_RAM": 40},
            "AUTOSCALING_XCHANGE": {"AUTOSCALING_XCHANGE_THR": 20000},
            "AUTOSCALING_Q": {"AUTOSCALING_Q_PROD_EXCH": 10000, "AUTOSCALING_THR_PROD_EXCH": 1e5},
        }
    )
    rules = Rules.of(stored)
    assert rules == Rules("r1", 30.0, 40.0, 20000.0, 10000.0, 100000.0)
    assert rules.capacity(1.0) == 20000.0
    assert Rules(queue_throughput=7.0).capacity(1.0) == 7.0
    assert Rules().capacity(3.0) == 3.0


def test_a_stale_rules_read_never_undoes_a_newer_push():
    assert supersedes(0, None) == 0, "nothing stored: the implicit rule"
    assert supersedes(0, 1) == 1
    assert supersedes(2, 1) is None, "a read that crossed a newer push"
    assert supersedes(2, None) is None, "a read from before anything was stored"
    assert supersedes(2, 2) == 2
    for version in ("3", True, -1):  # refused when the rules are read, so never offered
        with pytest.raises(DecodeError, match="Version"):
            RuleSet.decode({"AUTOSCALING_NAME": "r", "AUTOSCALING_Q": {}, "Version": version})


def test_exchange_rule_fires_only_when_every_exchange_is_above_it():
    policy = DefaultPolicy(CONFIG)
    assert policy.decide([_x("a", 150_000)], IMPLICIT, 0.0, busy=False) is not None
    policy = DefaultPolicy(CONFIG)
    two = [_x("a", 150_000), _x("b", 50_000)]  # b has room: re-allocation, not a new exchange
    assert policy.decide(two, IMPLICIT, 0.0, busy=False) is None
    both = [_x("a", 150_000), _x("b", 120_000)]
    decision = policy.decide(both, IMPLICIT, 0.0, busy=False)
    assert decision is not None and decision.action == "out"
    assert "every exchange above 100,000 B/s" in decision.reason


def test_host_rule_uses_roqs_semantics_on_every_exchange():
    rules = Rules("h", host_cpu=2.0, host_ram=35.0)
    fire = [_x("a", 0, load=4.0, ram=32.0), _x("b", 0, load=1.5, ram=37.0)]
    assert DefaultPolicy(CONFIG).decide(fire, rules, 0.0, busy=False) is not None
    calm = [_x("a", 0, load=4.0, ram=32.0), _x("b", 0, load=1.5, ram=34.5)]
    assert DefaultPolicy(CONFIG).decide(calm, rules, 0.0, busy=False) is None


def test_queue_rule_per_exchange_limits():
    rules = Rules("q", queue_producers=3.0)
    crowded = [_x("a", 10, producers=4), _x("b", 10, producers=3)]  # 3.5 per exchange
    decision = DefaultPolicy(CONFIG).decide(crowded, rules, 0.0, busy=False)
    assert decision is not None and "queue rule q" in decision.reason
    fine = [_x("a", 10, producers=3), _x("b", 10, producers=3)]
    assert DefaultPolicy(CONFIG).decide(fine, rules, 0.0, busy=False) is None


def test_nothing_is_decided_while_a_change_is_under_way_or_unmeasured():
    policy = DefaultPolicy(CONFIG)
    hot = [_x("a", 150_000)]
    assert policy.decide(hot, IMPLICIT, 0.0, busy=True) is None
    leaving = [*hot, ExchangeLoad("b", _sample(0), placeable=False, leaving=True, age_s=1)]
    assert policy.decide(leaving, IMPLICIT, 0.0, busy=False) is None
    assert policy.decide([*hot, _x("new", None)], IMPLICIT, 0.0, busy=False) is None


def test_cooldown_and_max_exchanges_bound_scale_out():
    policy = DefaultPolicy(CONFIG)
    hot = [_x("a", 150_000)]
    assert policy.decide(hot, IMPLICIT, 0.0, busy=False) is not None
    policy.acted(0.0)
    assert policy.decide(hot, IMPLICIT, 4.9, busy=False) is None, "inside the cool-down"
    assert policy.decide(hot, IMPLICIT, 5.1, busy=False) is not None
    capped = DefaultPolicy(ScalingConfig(max_exchanges=2, max_throughput=200_000, highwater=0.5))
    two = [_x("a", 150_000), _x("b", 150_000)]
    assert capped.decide(two, IMPLICIT, 0.0, busy=False) is None


def test_scale_in_after_the_low_water_time_retires_the_least_loaded():
    policy = DefaultPolicy(CONFIG)
    # capacity 100 KB/s, low-water 30 KB/s per exchange: 25 KB/s fits in one exchange fewer
    quiet = [_x("a", 20_000), _x("b", 5_000)]
    assert policy.decide(quiet, IMPLICIT, 0.0, busy=False) is None
    assert policy.decide(quiet, IMPLICIT, 2.9, busy=False) is None
    decision = policy.decide(quiet, IMPLICIT, 3.1, busy=False)
    assert decision is not None and decision.action == "in" and decision.exchange_id == "b"
    assert "below the low-water mark" in decision.reason


def test_scale_in_never_below_the_minimum_and_a_busy_moment_restarts_the_clock():
    policy = DefaultPolicy(CONFIG)
    assert policy.decide([_x("a", 0)], IMPLICIT, 100.0, busy=False) is None, "never below 1"
    two_min = DefaultPolicy(
        ScalingConfig(min_exchanges=2, lowwater_s=0, max_throughput=200_000, highwater=0.5)
    )
    assert two_min.decide([_x("a", 0), _x("b", 0)], IMPLICIT, 100.0, busy=False) is None
    quiet, busy = [_x("a", 20_000), _x("b", 5_000)], [_x("a", 40_000), _x("b", 5_000)]
    policy.decide(quiet, IMPLICIT, 0.0, busy=False)
    policy.decide(busy, IMPLICIT, 2.0, busy=False)  # 45 KB/s does not fit: the clock restarts
    assert policy.decide(quiet, IMPLICIT, 4.0, busy=False) is None
    assert policy.decide(quiet, IMPLICIT, 7.1, busy=False) is not None


def test_scale_in_keeps_replication_factor_exchanges():
    """Each exchange holds the others' copies: replicationFactor 2 keeps two, however quiet
    (the test above retires one of these two with the floor at 1)."""
    policy = make_policy(CONFIG, floor=2)
    quiet = [_x("a", 20_000), _x("b", 5_000)]
    assert all(policy.decide(quiet, IMPLICIT, t, busy=False) is None for t in (0.0, 3.1, 100.0))
    three = [*quiet, _x("c", 0)]
    decision = policy.decide(three, IMPLICIT, 200.0, busy=False)
    decision = decision or policy.decide(three, IMPLICIT, 204.0, busy=False)
    assert decision is not None and decision.action == "in" and decision.exchange_id == "c"


def test_flapping_load_acts_at_most_once_per_cooldown():
    policy = DefaultPolicy(CONFIG)
    actions = []
    exchanges = 1
    for step in range(200):  # 20 s, the load swinging across both marks every 0.5 s
        now = step * 0.1
        rate = 150_000 if (step // 5) % 2 == 0 else 1_000
        loads = [_x(f"x{i}", rate) for i in range(exchanges)]
        decision = policy.decide(loads, IMPLICIT, now, busy=False)
        if decision is not None:
            policy.acted(now)
            actions.append(now)
            exchanges += 1 if decision.action == "out" else -1
    gaps = [b - a for a, b in itertools.pairwise(actions)]
    assert len(actions) >= 3, actions  # it does keep acting, just never faster
    assert all(gap >= CONFIG.cooldown_s for gap in gaps), actions


def test_null_policy_never_scales_and_policies_come_from_settings():
    assert NullPolicy().decide([_x("a", 1e12)], IMPLICIT, 0.0, busy=False) is None
    settings = config.load_hcm(None, {"scaling.policy": "null"})
    assert isinstance(make_policy(ScalingConfig.from_settings(settings)), NullPolicy)
    defaults = config.load_hcm(None)
    assert isinstance(make_policy(ScalingConfig.from_settings(defaults)), DefaultPolicy)
    with pytest.raises(ConfigError, match=r"scaling\.policy"):
        config.load_hcm(None, {"scaling.policy": "magic"})


# --- rebalancing onto a new exchange -------------------------------------------------------------
def _view(name: str, rate: float, top: list[tuple[str, float]]) -> ExchangeView:
    return ExchangeView(name, f"tcp://{name}", f"tcp://{name}b", 0.0, 0.0, 0.2,
                        bytes_rate=rate, producers=len(top), top=top)  # fmt: skip


def test_rebalance_moves_the_heaviest_publishers_to_the_new_exchange():
    limits = Thresholds(max_throughput=200_000)
    old = _view("old", 190_000, [("h1", 90_000), ("h2", 90_000), ("l1", 5_000), ("l2", 5_000)])
    new = _view("new", 0.0, [])
    moves = plan_rebalance(new, [old, new], 10.0, limits)
    assert [m.producer for m in moves][:1] == ["h1"]
    assert "h2" not in [m.producer for m in moves], "the second heavy one stays"
    assert new.bytes_rate <= old.bytes_rate + 10_000
    assert old.cooldown_until == 10.0 + limits.cooldown_s


def test_rebalance_keeps_a_publisher_on_every_source_and_needs_two_exchanges():
    limits = Thresholds(max_throughput=200_000)
    single = _view("old", 300_000, [("only", 300_000)])
    new = _view("new", 0.0, [])
    assert plan_rebalance(new, [single, new], 0.0, limits) == []
    assert plan_rebalance(new, [new], 0.0, limits) == []


# --- provisioners --------------------------------------------------------------------------------
# Launches against an EC2 API (moto's server) are tested in tests/integration/test_ec2_moto.py;
# here nothing leaves the machine: the endpoint is a loopback port where nothing listens.
def _ec2(**overrides: str) -> Ec2Config:
    values = {
        "provisioner": "ec2",
        "cloud.image": "ami-0123456789abcdef0",
        "cloud.region": "eu-west-1",
        "cloud.endpoint": f"http://127.0.0.1:{_DEAD_PORT}",
        "cloud.key.name": "ops",
        "cloud.security.groups": "sg-1, sg-2",
        "cloud.subnet": "subnet-9",
        "cloud.instance.profile": "roq-host",
        "cloud.request.timeout.ms": "1000",
        "cloud.cluster.parameter": "/roq/test/cluster",
        "zk.servers": "10.0.0.5:2181",
        "network.interface": "10.0.0.4",
        **overrides,
    }
    return Ec2Config.from_settings(config.load_gcm(None, values))


_DEAD_PORT = 1  # tcpmux: privileged and unused, connections are refused at once


@pytest.fixture
def aws_chain(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> pytest.MonkeyPatch:
    """boto3's credential chain with nothing in it: no AWS_* variables, no ~/.aws files, no
    instance metadata (so no 1 s wait for it either). A test adds what it needs."""
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return monkeypatch


def test_run_instances_args_are_complete():
    ec2 = _ec2()
    args = run_instances_args(ec2, "token-1")
    assert args["ImageId"] == "ami-0123456789abcdef0" and args["InstanceType"] == "t3.small"
    assert args["MinCount"] == args["MaxCount"] == 1
    assert args["ClientToken"] == "token-1"
    assert args["KeyName"] == "ops" and args["SubnetId"] == "subnet-9"
    assert args["SecurityGroupIds"] == ["sg-1", "sg-2"]
    assert args["IamInstanceProfile"] == {"Name": "roq-host"}
    assert args["TagSpecifications"][0]["Tags"][1] == {"Key": "roq:cluster", "Value": "/roq"}
    script = args["UserData"]
    assert script == user_data(ec2)
    assert script.startswith("#cloud-config\n")
    for line in ("      ROQ_ROLE=host", "      ROQ_GCM_ADDRESS=10.0.0.4",
                 "      ROQ_ZK_SERVERS=10.0.0.5:2181", "      ROQ_INTERFACE=ens5",
                 "  - [/opt/roq/bin/roq-configure]"):  # fmt: skip
        assert line in script.splitlines()
    arn = "arn:aws:iam::123456789012:instance-profile/roq-host"
    unset = {"cloud.key.name": "", "cloud.subnet": "", "cloud.security.groups": ""}
    bare = run_instances_args(_ec2(**{"cloud.instance.profile": arn, **unset}), "token-2")
    assert bare["IamInstanceProfile"] == {"Arn": arn}
    assert not {"KeyName", "SubnetId", "SecurityGroupIds"} & set(bare)
    assert "ROQ_SECURITY" not in script  # secured: the hosts are too, by default
    open_cluster = _ec2(**{"security": "off", "cloud.cluster.parameter": ""})
    assert "      ROQ_SECURITY=off" in user_data(open_cluster).splitlines()
    assert "IamInstanceProfile" not in run_instances_args(
        _ec2(**{"cloud.instance.profile": ""}), "t"
    )


def test_ec2_config_errors_name_the_key():
    with pytest.raises(ConfigError, match=r"cloud\.image"):
        _ec2(**{"cloud.image": ""})
    with pytest.raises(ConfigError, match=r"cloud\.join\.zk"):
        _ec2(**{"cloud.join.zk": "h:1; rm -rf /"})
    with pytest.raises(ConfigError, match=r"zk\.namespace"):
        _ec2(**{"zk.namespace": "/prod"})
    # plain http only to this machine (an emulator); anything else is https or nothing
    for endpoint in ("file:///etc/passwd", "http://ec2.eu-west-1.amazonaws.com/", "https://",
                     "http://[::1", "ec2.eu-west-1.amazonaws.com"):  # fmt: skip
        with pytest.raises(ConfigError, match=r"cloud\.endpoint"):
            _ec2(**{"cloud.endpoint": endpoint})
    for endpoint in ("", "https://vpce-1.ec2.eu-west-1.vpce.amazonaws.com", "http://localhost:5"):
        assert _ec2(**{"cloud.endpoint": endpoint}).endpoint == endpoint


def test_ec2_client_refuses_a_bad_region_at_start(aws_chain: pytest.MonkeyPatch):
    with pytest.raises(ConfigError, match=r"cloud\.region"):
        Ec2Provisioner(_ec2(**{"cloud.region": "eu west 1"}))


def test_no_credentials_is_one_line_and_read_again_next_time(aws_chain: pytest.MonkeyPatch):
    provisioner = Ec2Provisioner(_ec2(**{"cloud.provision.cooldown.ms": "0"}))
    said = provisioner.provision("q")
    assert "no AWS credentials" in said and "instance role" in said, said
    assert "\n" not in said and provisioner.launched == []
    # a credential that appears later (here in the environment; on EC2 a role attached to the
    # running GCM machine) is found at the next launch without a restart: it gets as far as
    # the (dead) endpoint
    aws_chain.setenv("AWS_ACCESS_KEY_ID", "AKIDEXAMPLE")
    aws_chain.setenv("AWS_SECRET_ACCESS_KEY", "later-secret")
    said = provisioner.provision("q")
    assert "ec2 RunInstances failed" in said and "credentials" not in said, said
    assert "later-secret" not in said


def test_provisioners_are_bounded_and_say_what_they_did(aws_chain: pytest.MonkeyPatch):
    none = config.ProvisioningSettings.from_settings(config.load_gcm(None))
    assert isinstance(make_provisioner(none), NoProvisioner)
    said = NoProvisioner().provision("queue q needs an exchange")
    assert "capacity exhausted" in said and "provisioner none" in said
    capped = Ec2Provisioner(_ec2(**{"cloud.instances.max": "0"}))
    assert "cloud.instances.max" in capped.provision("q")  # nothing sent
    cooling = Ec2Provisioner(_ec2())
    cooling._last_attempt = time.monotonic()  # a launch was just asked
    assert "waiting for that host to join" in cooling.provision("q")
    assert cooling.launched == []
