"""The machine image: the Packer template validates, and roq-configure turns user data into the
properties files the units read (and refuses bad user data with exit 78)."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
from pathlib import Path

import pytest
from appliance_support import ROOT

from roq import config
from roq.system.spawn import roq_command

pytestmark = pytest.mark.e2e

TEMPLATE = "ami/roq.pkr.hcl"
CONFIGURE = ROOT / "ami" / "files" / "roq-configure"


def packer(*args: str) -> subprocess.CompletedProcess[str]:
    # No AWS credentials are needed: Packer 1.6.6 validates offline.
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    return subprocess.run(
        ["packer", *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_template_syntax() -> None:
    result = packer("validate", "-syntax-only", TEMPLATE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_template_validates_with_the_built_executable(frozen_roq: Path) -> None:
    # Full validation also checks that every file the provisioners upload exists.
    result = packer("validate", "-var", f"dist_dir={frozen_roq.parent}", TEMPLATE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_template_encrypts_the_images_volumes() -> None:
    # issue 31: the image's snapshot (so every instance's root volume) and the build's volume
    text = (ROOT / TEMPLATE).read_text()
    assert re.search(r"^\s*encrypt_boot\s*=\s*true$", text, re.M)
    block = re.search(r"launch_block_device_mappings \{([^}]*)\}", text)
    assert block and re.search(r"^\s*encrypted\s*=\s*true$", block.group(1), re.M)


def test_template_has_no_plugin_block() -> None:
    # Packer 1.6.6 rejects `required_plugins`; the amazon-ebs builder is built in.
    assert not re.search(r"^\s*(packer|required_plugins)\s*\{", (ROOT / TEMPLATE).read_text(), re.M)


def configure(
    etc: Path, role_env: str, **more_env: str
) -> subprocess.CompletedProcess[str]:  # fmt: skip
    (etc / "role.env").write_text(role_env)
    env = {**os.environ, "ROQ_ETC": str(etc), "ROQ_SHIPPED": str(ROOT / "config")}
    env["ROQ_SHIPPED_ZOO_CFG"] = str(ROOT / "ami" / "files" / "zoo.cfg")
    env |= {"ROQ_STATE": str(etc / "state"), **more_env}
    return subprocess.run(
        ["sh", str(CONFIGURE), "--no-start"],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_configure_writes_a_host(tmp_path: Path) -> None:
    result = configure(
        tmp_path,
        "ROQ_ROLE=host\nROQ_GCM_ADDRESS=10.0.1.10\nROQ_ZK_SERVERS=10.0.1.10:2181\n"
        "ROQ_INTERFACE=127.0.0.1\nROQ_HOST_NAME=h2\n",
    )
    assert result.returncode == 0, result.stderr
    assert "roq-host.service" in result.stdout
    hcm = config.load_hcm(tmp_path / "HCM.properties", {})
    assert hcm.values["gcm.address"] == "10.0.1.10"
    assert hcm.values["zk.servers"] == "10.0.1.10:2181"
    assert hcm.values["host.name"] == "h2"
    gcm = config.load_gcm(tmp_path / "GCM.properties", {})
    assert gcm.values["network.interface"] == "127.0.0.1"
    assert gcm.values["zk.close.root"] is False  # no ZooKeeper of its own here


def _real_roq(tmp_path: Path) -> str:
    wrapper = tmp_path / "roq"
    wrapper.write_text(f'#!/bin/sh\nexec {" ".join(roq_command())} "$@"\n')
    wrapper.chmod(0o755)
    return str(wrapper)


def test_configure_gcm_role_starts_zookeeper_and_gcm(tmp_path: Path) -> None:
    result = configure(
        tmp_path, "ROQ_ROLE=gcm\nROQ_GCM_ADDRESS=10.0.1.10\nROQ_ZK_SERVERS=10.0.1.10:2181\n",
        ROQ_BIN=_real_roq(tmp_path),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "roq-zookeeper.service roq-gcm.service" in result.stdout
    # its ZooKeeper serves this cluster alone: the GCM closes its root (issue 31)
    assert config.load_gcm(tmp_path / "GCM.properties", {}).values["zk.close.root"] is True


def test_configure_serves_zookeeper_over_tls_only_on_one_address(tmp_path: Path) -> None:
    """Issue 31: the image's ZooKeeper listened in clear on every interface. Now its one port
    is TLS (the cluster's certificates, written for it from cluster.json), bound to the address
    the hosts connect to, or to ROQ_ZK_ADDRESS; plain only with ROQ_ZK_TLS=off."""
    role = "ROQ_ROLE=all\nROQ_GCM_ADDRESS=10.0.1.10\nROQ_ZK_SERVERS=10.0.1.10:2182\n"
    result = configure(tmp_path, role, ROQ_BIN=_real_roq(tmp_path))
    assert result.returncode == 0, result.stderr
    cfg = (tmp_path / "zoo.cfg").read_text()
    secdir = tmp_path / "state" / "roq-data" / "security"
    assert "secureClientPort=2182\nsecureClientPortAddress=10.0.1.10\n" in cfg
    assert "\nclientPort" not in cfg and "ssl.clientAuth=need" in cfg
    assert f"ssl.keyStore.location={secdir / 'zookeeper' / 'keystore.pem'}" in cfg
    for name in ("keystore.pem", "truststore.pem"):
        assert stat.S_IMODE((secdir / "zookeeper" / name).stat().st_mode) == 0o600
    assert (secdir / "cluster.json").exists()  # made here: the GCM finds them
    assert config.load_gcm(tmp_path / "GCM.properties", {}).values["zk.tls"] is True

    bound = configure(tmp_path, role + "ROQ_ZK_ADDRESS=10.0.2.7\n", ROQ_BIN=_real_roq(tmp_path))
    assert bound.returncode == 0, bound.stderr
    assert "secureClientPortAddress=10.0.2.7\n" in (tmp_path / "zoo.cfg").read_text()

    plain = configure(tmp_path, role + "ROQ_ZK_TLS=off\n", ROQ_BIN="/bin/false")
    assert plain.returncode == 0, plain.stderr
    cfg = (tmp_path / "zoo.cfg").read_text()
    settings = [line for line in cfg.splitlines() if not line.startswith("#")]
    assert settings[-2:] == ["clientPort=2182", "clientPortAddress=10.0.1.10"]
    assert not any("secure" in line or "ssl." in line for line in settings)
    for load, name in ((config.load_hcm, "HCM"), (config.load_gcm, "GCM")):
        assert load(tmp_path / f"{name}.properties", {}).values["zk.tls"] is False


@pytest.mark.parametrize(
    ("role_env", "reason"),
    [
        ("ROQ_ROLE=broker\nROQ_GCM_ADDRESS=a\nROQ_ZK_SERVERS=a:1\n", "ROQ_ROLE must be"),
        ("ROQ_ROLE=$(reboot)\n", "unexpected character"),
        ("ROQ_ROLE=host\nROQ_GCM_ADDRESS=a\n", "ROQ_ZK_SERVERS is not set"),
        ("ROQ_ROLE=host\nPATH=/tmp\n", "unknown key 'PATH'"),
        ("ROQ_ROLE=host\nROQ_CLUSTER_PARAMETER=/roq/$(reboot)\n", "unexpected character"),
        ("ROQ_ROLE=host\nROQ_CLUSTER_PARAMETER=/roq/a:b\n", "unexpected character"),
        ("ROQ_ROLE=host\nROQ_GCM_ADDRESS=/roq/a\n", "unexpected character"),  # '/' here only
        ("ROQ_ROLE=host\nROQ_SECURITY=no\n", "must be on or off"),
    ],
)
def test_configure_refuses_bad_user_data(tmp_path: Path, role_env: str, reason: str) -> None:
    result = configure(tmp_path, role_env)
    assert result.returncode == 78
    assert reason in result.stderr and len(result.stderr.splitlines()) == 1
    assert not (tmp_path / "HCM.properties").exists()


def test_no_aws_key_in_the_image_sources() -> None:
    # The image gets a role, never keys: nothing Packer uploads or the template names holds an
    # access key id, a secret key setting or the retired cloud.password.
    key_id = re.compile(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b")
    files = [p for d in ("ami", "config", "systemd") for p in (ROOT / d).rglob("*") if p.is_file()]
    assert any(p.name == "GCM.properties" for p in files)
    for path in files:
        text = path.read_text(errors="replace")
        assert not key_id.search(text), path
        for setting in ("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY", "cloud.password"):
            assert setting not in text, (path, setting)


def test_the_gcm_role_allows_what_the_provisioner_asks_and_no_more() -> None:
    # docs/deploy.md creates the GCM machine's role from these two files.
    trust = json.loads((ROOT / "ami" / "iam" / "gcm-trust.json").read_text())
    [assume] = trust["Statement"]
    assert assume["Principal"] == {"Service": "ec2.amazonaws.com"}
    assert assume["Action"] == "sts:AssumeRole"
    policy = json.loads((ROOT / "ami" / "iam" / "gcm-policy.json").read_text())
    actions: dict[str, dict[str, object]] = {}
    for statement in policy["Statement"]:
        assert statement["Effect"] == "Allow"
        listed = statement["Action"]
        for action in [listed] if isinstance(listed, str) else listed:
            actions[action] = statement
    # RunInstances; CreateTags for its TagSpecifications; PassRole for cloud.instance.profile
    # ... and, for its own keys when its user data names their SSM parameter, the host role's
    # GetParameter and Decrypt (test_the_host_role_reads_the_clusters_keys_and_nothing_else)
    ssm = {"ssm:GetParameter", "kms:Decrypt"}
    assert set(actions) == {"ec2:RunInstances", "ec2:CreateTags", "iam:PassRole"} | ssm
    passing = actions["iam:PassRole"]
    # only its own cluster's host role: a GCM cannot launch a host that reads another's keys
    assert passing["Resource"] == "arn:aws:iam::*:role/roq-host-${aws:PrincipalTag/roq-cluster}"
    assert passing["Condition"] == {"StringEquals": {"iam:PassedToService": "ec2.amazonaws.com"}}


def test_configure_fetches_the_named_keys_before_any_unit_and_passes_the_name_on(
    tmp_path: Path,
) -> None:
    # The fetch itself (roq keys ssm-get against SSM) runs in tests/integration/test_ec2_moto.py;
    # here a stand-in roq records its arguments, then one that fails stops roq-configure.
    calls = tmp_path / "calls"
    fake = tmp_path / "fake-roq"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {calls}\n')
    fake.chmod(0o755)
    role = (
        "ROQ_ROLE=all\nROQ_GCM_ADDRESS=10.0.1.10\nROQ_ZK_SERVERS=10.0.1.10:2181\n"
        "ROQ_CLUSTER_PARAMETER=/roq/prod/cluster\n"
    )
    result = configure(tmp_path, role, ROQ_BIN=str(fake))
    assert result.returncode == 0, result.stderr
    secdir = tmp_path / "state" / "roq-data" / "security"
    assert calls.read_text() == (
        f"keys ssm-get /roq/prod/cluster --security-dir {secdir}\n"
        f"keys zookeeper-tls --security-dir {secdir} --port 2181 --address 10.0.1.10\n"
    )  # the keys fetched, not made: no --generate
    gcm = config.load_gcm(tmp_path / "GCM.properties", {})
    assert gcm.values["cloud.cluster.parameter"] == "/roq/prod/cluster"  # for its provisioner
    assert gcm.values["security.dir"] == str(secdir)
    assert config.load_hcm(tmp_path / "HCM.properties", {}).values["security.dir"] == str(secdir)

    failed = configure(tmp_path, role, ROQ_BIN="/bin/false")
    assert failed.returncode == 78
    assert "cannot fetch the cluster's keys from SSM parameter /roq/prod/cluster" in failed.stderr
    assert failed.stdout == ""  # no unit named, none started


def test_a_cluster_without_security_configures_its_hosts_without_it(tmp_path: Path) -> None:
    """What a GCM run with security=off writes into its hosts' user data (provisioning.py)."""
    role = "ROQ_ROLE=host\nROQ_GCM_ADDRESS=10.0.1.10\nROQ_ZK_SERVERS=10.0.1.10:2181\n"
    assert configure(tmp_path, role).returncode == 0
    assert config.load_hcm(tmp_path / "HCM.properties", {}).values["security"] is True
    result = configure(tmp_path, role + "ROQ_SECURITY=off\n")
    assert result.returncode == 0, result.stderr
    for load, name in ((config.load_hcm, "HCM"), (config.load_gcm, "GCM")):
        assert load(tmp_path / f"{name}.properties", {}).values["security"] is False


def test_configure_without_a_parameter_fetches_nothing(tmp_path: Path) -> None:
    role = "ROQ_ROLE=host\nROQ_GCM_ADDRESS=10.0.1.10\nROQ_ZK_SERVERS=10.0.1.10:2181\n"
    result = configure(tmp_path, role, ROQ_BIN="/bin/false")  # would fail if it were called
    assert result.returncode == 0, result.stderr
    assert config.load_gcm(tmp_path / "GCM.properties", {}).values["cloud.cluster.parameter"] == ""


def test_the_user_data_examples_pass_roq_configure(tmp_path: Path) -> None:
    # ami/user-data/*.yaml are what docs/deploy.md launches: their role.env must be accepted
    for name in ("gcm", "host"):
        text = (ROOT / "ami" / "user-data" / f"{name}.yaml").read_text()
        role = "".join(line.strip() + "\n" for line in text.splitlines() if "ROQ_" in line
                       and not line.lstrip().startswith("#"))  # fmt: skip
        assert "ROQ_CLUSTER_PARAMETER=/roq/" in role
        etc = tmp_path / name
        etc.mkdir()
        result = configure(etc, role, ROQ_BIN="/bin/true")
        assert result.returncode == 0, (name, result.stderr)


def test_the_host_role_reads_the_clusters_keys_and_nothing_else() -> None:
    # docs/deploy.md creates the hosts' role (roq-host) from these two files; the GCM's role
    # reads the same parameter when its user data names it.
    trust = json.loads((ROOT / "ami" / "iam" / "host-trust.json").read_text())
    [assume] = trust["Statement"]
    assert assume["Principal"] == {"Service": "ec2.amazonaws.com"}
    assert assume["Action"] == "sts:AssumeRole"
    for role in ("host", "gcm"):
        policy = json.loads((ROOT / "ami" / "iam" / f"{role}-policy.json").read_text())
        actions = {}
        for statement in policy["Statement"]:
            assert statement["Effect"] == "Allow"
            listed = statement["Action"]
            for action in [listed] if isinstance(listed, str) else listed:
                actions[action] = statement
        if role == "host":
            assert set(actions) == {"ssm:GetParameter", "kms:Decrypt"}
        # issue 31: its own cluster's parameter only, named by the role's tag roq-cluster
        # (docs/deploy.md tags each cluster's roles); an untagged role reads none
        assert actions["ssm:GetParameter"]["Resource"] == (
            "arn:aws:ssm:*:*:parameter/roq/${aws:PrincipalTag/roq-cluster}/cluster"
        )
        decrypt = actions["kms:Decrypt"]
        assert decrypt["Condition"] == {"StringLike": {"kms:ViaService": "ssm.*.amazonaws.com"}}
