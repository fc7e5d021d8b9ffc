"""Configuration: every key has a default, invalid values name the key, value and file."""

from __future__ import annotations

import logging
import subprocess
from pathlib import Path

import pytest

from roq import config
from roq.coordination.paths import Paths
from roq.errors import ConfigError, CoordinationError
from roq.monitor.actuator import Actuator
from roq.system.spawn import child_environment, roq_command

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("keys", "name", "title"),
    [
        (
            config.GCM_KEYS,
            "GCM.properties",
            "GCM.properties: the Global Configuration Manager (roq gcm)",
        ),
        (
            config.HCM_KEYS,
            "HCM.properties",
            "HCM.properties: the Host Configuration Manager (roq host) "
            "and the monitors and exchanges it starts",
        ),
    ],
)
def test_shipped_files_are_rendered_from_the_key_tables(keys, name, title):
    assert (ROOT / "config" / name).read_text() == config.render(keys, title), (
        f"config/{name} is stale: regenerate it with roq.config.render"
    )


def test_shipped_files_load_to_the_defaults():
    for keys, loader, name in (
        (config.GCM_KEYS, config.load_gcm, "GCM.properties"),
        (config.HCM_KEYS, config.load_hcm, "HCM.properties"),
    ):
        settings = loader(ROOT / "config" / name)
        assert dict(settings.values) == {k.name: k.default for k in keys}


def test_every_roq_key_is_present():
    roq_gcm = {
        "ports.base",
        "period",
        "formatDB",
        "zk.servers",
        "hcmTIMEOUT",
        "cloud.use",
        "hasCloudConfiguration",
        "cloud.user",
        # "cloud.password" is retired on purpose (keys.RETIRED): no secret in a file
        "cloud.gateway",
        "cloud.endpoint",
    }
    roq_hcm = {
        "gcm.address",
        "gcm.ports.base",
        "network.interface",
        "exchange.base.port",
        "monitor.base.port",
        "statmonitor.base.port",
        "exchange.max.perhost",
        "queue.hcm.vm",
        "exchange.hcm.vm",
        # "exchange.vm.heap" and "duration" are refused on purpose (keys.RETIRED, issue 34)
        "monitor.stat.period",
        "directory",
        "maxFileSize",
        "replicationFactor",
        "useLog",
    }
    assert roq_gcm <= {k.name for k in config.GCM_KEYS}
    assert roq_hcm <= {k.name for k in config.HCM_KEYS}


class _Reads(dict):
    """Settings values that note each key looked up by name (`dict.items()` does not)."""

    def __init__(self, values):
        super().__init__(values)
        self.read = set()

    def __getitem__(self, name):
        self.read.add(name)
        return super().__getitem__(name)


def _reading(keys, **values):
    loaded = config.load(keys, None, values)
    reads = _Reads(loaded.values)
    return config.Settings(loaded.source, reads), reads.read


def test_every_key_read_is_declared_and_every_declared_key_is_read():
    """Each component's dataclass reads its keys at start: a misspelled one raises here (KeyError
    naming it), and a declared key that nothing reads must be listed in NOT_READ."""
    gcm, gcm_read = _reading(config.GCM_KEYS)
    ec2_values = {"cloud.image": "ami-1", "cloud.cluster.parameter": "/roq/c"}
    ec2, ec2_read = _reading(config.GCM_KEYS, provisioner="ec2", **ec2_values)
    hcm, hcm_read = _reading(config.HCM_KEYS)
    config.GcmSettings.from_settings(gcm)
    assert config.GcmSettings.from_settings(ec2).provisioning.ec2 is not None  # its keys too
    for component in (
        config.HostSettings,
        config.MonitorSettings,
        config.ExchangeSettings,
        config.HttpSettings,
    ):
        component.from_settings(hcm)
    config.UpSettings.from_settings(gcm, hcm)
    config.LoggingSettings.from_settings(gcm)  # every daemon command, besides its own settings
    for keys, read in ((config.GCM_KEYS, gcm_read | ec2_read), (config.HCM_KEYS, hcm_read)):
        declared = {key.name for key in keys}
        assert read <= declared
        assert declared - read == declared & config.NOT_READ, "read by nothing, not in NOT_READ"
    assert config.NOT_READ.issubset(key.name for key in config.GCM_KEYS + config.HCM_KEYS)


def test_units_are_converted_once_and_children_get_the_hosts_changes():
    hcm = config.load_hcm(None, {"heartbeat.period": "250", "relocate.cooldown": "1500"})
    exchange = config.ExchangeSettings.from_settings(hcm)
    assert exchange.heartbeat_s == 0.25 and exchange.stat_period_s == 1.0
    assert config.MonitorSettings.from_settings(hcm).thresholds.cooldown_s == 1.5
    host = config.HostSettings.from_settings(hcm)
    assert dict(host.child_overrides) == {"heartbeat.period": "250", "relocate.cooldown": "1500"}


def test_missing_key_takes_its_default_and_others_are_read(tmp_path):
    path = tmp_path / "HCM.properties"
    path.write_text("# only one key\nexchange.base.port = 7000\n")
    settings = config.HostSettings.from_settings(config.load_hcm(path))
    assert settings.exchange_base_port == 7000
    assert settings.monitor_base_port == 5500


def test_java_properties_syntax(tmp_path):
    path = tmp_path / "GCM.properties"
    path.write_text("! comment\nperiod: 700\nzk.servers = a:1,\\\n   b:2\nformatDB true\n")
    settings = config.GcmSettings.from_settings(config.load_gcm(path))
    assert settings.broadcast_period_s == 0.7
    assert settings.zk.servers == "a:1,b:2"
    assert settings.format_db is True


@pytest.mark.parametrize(
    ("line", "fragment"),
    [
        ("ports.base=abc", "'ports.base' has value 'abc': expected an integer"),
        ("ports.base=80", "'ports.base' has value '80': must be between 1024 and 65529"),
        ("period=-5", "'period' has value '-5'"),
        ("formatDB=maybe", "'formatDB' has value 'maybe': expected true or false"),
        ("prots.base=5000", "unknown key 'prots.base' (did you mean 'ports.base'?)"),
    ],
)
def test_invalid_value_names_key_value_and_file(tmp_path, line, fragment):
    path = tmp_path / "GCM.properties"
    path.write_text(f"period=1000\n{line}\n")
    with pytest.raises(ConfigError) as raised:
        config.load_gcm(path)
    assert fragment in str(raised.value)
    assert f"{path}:2" in str(raised.value)


@pytest.mark.parametrize(
    ("mode", "key", "value"),
    [
        ("gcm", "ports.base", "five"),
        ("gcm", "zk.session.timeout", "10"),
        ("host", "exchange.max.perhost", "-1"),
        ("host", "heartbeat.period", "x"),
        ("host", "useLog", "perhaps"),
    ],
)
def test_daemon_exits_78_naming_the_key(tmp_path, mode, key, value):
    path = tmp_path / "bad.properties"
    path.write_text(f"{key}={value}\n")
    result = subprocess.run(
        roq_command(mode, "--config", str(path)),
        capture_output=True,
        text=True,
        timeout=60,
        env=child_environment(),
        check=False,
    )
    assert result.returncode == 78, result.stderr
    assert key in result.stderr and str(path) in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_config_file_exits_78(tmp_path):
    missing = tmp_path / "nope.properties"
    result = subprocess.run(
        roq_command("gcm", "--config", str(missing)),
        capture_output=True,
        text=True,
        timeout=60,
        env=child_environment(),
        check=False,
    )
    assert result.returncode == 78
    assert f"{missing}: configuration file not found" in result.stderr


SECRET = "wJalrXUtnFEMI/K7MDENG+bPxRfiCYzz-roq-test"  # not a real key: only its echo is looked for


def test_a_cloud_secret_in_the_file_stops_the_gcm_and_is_never_repeated(tmp_path):
    """An old GCM.properties with the ec2 provisioner's secret: `roq gcm` exits 78 naming the
    key and the instance role, before anything else starts; the secret is in no output."""
    path = tmp_path / "GCM.properties"
    path.write_text(
        f"provisioner=ec2\ncloud.image=ami-1\ncloud.user=AKIDEXAMPLE\ncloud.password={SECRET}\n"
    )
    result = subprocess.run(
        roq_command("gcm", "--config", str(path)),
        capture_output=True,
        text=True,
        timeout=60,
        env=child_environment(),
        check=False,
    )
    assert result.returncode == 78, result.stderr
    assert f"{path}:4: key 'cloud.password' is refused" in result.stderr
    assert "instance role" in result.stderr and "Traceback" not in result.stderr
    assert SECRET not in result.stdout + result.stderr


def test_a_cloud_secret_is_refused_in_process_too_and_an_empty_one_ignored(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    path = tmp_path / "GCM.properties"
    path.write_text(f"cloud.password = {SECRET}\n")
    with pytest.raises(ConfigError, match=r"key 'cloud.password' is refused") as raised:
        config.load_gcm(path)
    with pytest.raises(ConfigError, match=r"command line: key 'cloud.password'") as defined:
        config.load_gcm(None, {"cloud.password": SECRET})
    # the GCM.properties shipped before had an empty `cloud.password=`: an upgrade still starts
    path.write_text("cloud.password=\nperiod=1000\n")
    settings = config.load_gcm(path)
    assert "cloud.password" not in settings.values and settings.values["period"] == 1000
    assert f"{path}:1: key 'cloud.password' is empty and ignored" in caplog.text
    for text in (str(raised.value), str(defined.value), caplog.text):
        assert SECRET not in text


def test_an_ec2_gcm_with_security_needs_the_parameter_holding_the_clusters_keys(tmp_path):
    """A host the ec2 provisioner launches can join only with the cluster's cluster.json, which
    it fetches from cloud.cluster.parameter: `roq gcm` without it exits 78 saying why, before
    it starts anything; with security off nothing needs fetching."""
    ec2 = ["-D", "provisioner=ec2", "-D", "cloud.image=ami-1"]
    result = subprocess.run(
        roq_command("gcm", *ec2, "-D", f"security.dir={tmp_path / 'security'}"),
        capture_output=True,
        text=True,
        timeout=60,
        env=child_environment(),
        check=False,
    )
    assert result.returncode == 78, result.stderr
    assert "needs key 'cloud.cluster.parameter'" in result.stderr
    assert "could never join" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "security").exists()  # refused before any key was generated
    values = {"provisioner": "ec2", "cloud.image": "ami-1"}
    off = config.GcmSettings.from_settings(config.load_gcm(None, {**values, "security": "off"}))
    assert off.provisioning.ec2 is not None and off.provisioning.ec2.cluster_parameter == ""
    named = {**values, "cloud.cluster.parameter": "/roq/prod/cluster"}
    ec2_config = config.GcmSettings.from_settings(config.load_gcm(None, named)).provisioning.ec2
    assert ec2_config is not None and ec2_config.cluster_parameter == "/roq/prod/cluster"


@pytest.mark.parametrize(
    "name",
    ["roq/prod", "/roq/$(reboot)", "/roq/a b", "/roq/a:b", "/" + "a" * 1011, "/roq/é"],
)
def test_the_parameter_name_is_one_ssm_and_roq_configure_accept(name):
    values = {"provisioner": "ec2", "cloud.image": "ami-1", "cloud.cluster.parameter": name}
    with pytest.raises(ConfigError, match=r"cloud\.cluster\.parameter"):
        config.GcmSettings.from_settings(config.load_gcm(None, values))
    assert config.check_parameter_name("/" + "a" * 1010, "x") == "/" + "a" * 1010
    assert config.check_parameter_name("roq-cluster_1.json", "x") == "roq-cluster_1.json"


@pytest.mark.parametrize("device", ["xvda", "/dev/", "/dev/xvda; rm", ""])
def test_the_ec2_root_device_must_be_a_device_name(device):
    values = {"provisioner": "ec2", "cloud.image": "ami-1", "cloud.cluster.parameter": "/roq/c"}
    settings = config.load_gcm(None, {**values, "cloud.root.device": device})
    with pytest.raises(config.ConfigError, match=r"key 'cloud\.root\.device'"):
        config.GcmSettings.from_settings(settings)


@pytest.mark.parametrize(
    ("loader", "line", "why"),
    [
        (config.load_hcm, "queue.hcm.vm = true", "each monitor as its own process"),
        (config.load_hcm, "exchange.hcm.vm=true", "each exchange as its own process"),
        (config.load_gcm, "hasCloudConfiguration=true", "writes no cloud configuration"),
        (config.load_hcm, "exchange.vm.heap= 512", "run no JVM"),
        (config.load_hcm, "duration = 5", "without saying what it meant"),
    ],
)
def test_roq_keys_roq_cannot_honour_are_refused_at_start(tmp_path, loader, line, why):
    """Issue 34: a RoQ or thesis key is given its meaning or refused, never accepted and
    ignored. Each line as RoQ's or the thesis's file has it; the error names file, line, key."""
    path = tmp_path / "roq.properties"
    path.write_text(f"# from RoQ\n{line}\n")
    name = line.split("=")[0].strip()
    with pytest.raises(ConfigError, match=rf"{path}:2: (key '{name}'|{name}=true) is refused") as e:
        loader(path)
    assert why in str(e.value)
    value = line.split("=")[1].strip()
    with pytest.raises(ConfigError, match=rf"command line: .*{name}.* is refused"):
        loader(None, {name: value})


def test_the_values_roq_honours_of_roqs_keys_load():
    assert config.load_hcm(None, {"queue.hcm.vm": "false", "exchange.hcm.vm": "false"})
    assert config.load_gcm(None, {"hasCloudConfiguration": "false"})


def test_gcm_address_is_the_scaling_actuators_gcm_when_zookeeper_names_none():
    settings = config.MonitorSettings.from_settings(
        config.load_hcm(None, {"gcm.address": "10.0.1.10", "gcm.ports.base": "6000"})
    )
    assert (settings.gcm.address, settings.gcm.ports_base) == ("10.0.1.10", 6000)

    class NoLeader:
        def client(self):
            raise CoordinationError("no GCM leads the cluster /roq")

    actuator = Actuator("q1", settings.zk, NoLeader(), 1.0, "tcp://127.0.0.1:1", gcm=settings.gcm)
    assert actuator._leader(Paths("/roq")) == "tcp://10.0.1.10:6003"
    alone = Actuator("q1", settings.zk, NoLeader(), 1.0, "tcp://127.0.0.1:1")
    with pytest.raises(CoordinationError, match="no GCM leads"):
        alone._leader(Paths("/roq"))


def test_roq_home_config_is_where_daemons_find_their_files(tmp_path, monkeypatch):
    """Seed 000: RoQ's deployments are configured by "the two main configuration files in the
    ROQ_HOME/config". roq gcm, host and http read them when started without --config; a host's
    children do not (the host hands them its settings)."""
    from roq.cli.daemons import _hcm

    (tmp_path / "config").mkdir()
    (tmp_path / "config" / "HCM.properties").write_text("exchange.max.perhost=7\n")
    monkeypatch.setenv("ROQ_HOME", str(tmp_path))
    assert config.home_file("HCM.properties") == tmp_path / "config" / "HCM.properties"
    assert config.home_file("GCM.properties") is None  # absent: the built-in defaults
    assert _hcm(None, [], home=True).values["exchange.max.perhost"] == 7
    assert _hcm(None, [], home=False).values["exchange.max.perhost"] == 0
    given = tmp_path / "other.properties"
    given.write_text("exchange.max.perhost=9\n")
    assert _hcm(given, [], home=True).values["exchange.max.perhost"] == 9  # --config wins
    monkeypatch.delenv("ROQ_HOME")
    assert config.home_file("HCM.properties") is None
