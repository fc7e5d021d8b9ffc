"""The ec2 provisioner against a real EC2 API: moto's server, out of process on 127.0.0.1.

The provisioner runs as the GCM runs it (GCM.properties values through the loader, then
`make_provisioner`), with its credentials from boto3's chain only: the environment, or a shared
credentials file. What it started is then read back through the same API (describe_instances,
the user data attribute), so the request is checked by what EC2 understood, not by its bytes.
"""

from __future__ import annotations

import base64
import logging
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from roq import config
from roq.gcm.provisioning import Ec2Provisioner, make_provisioner, user_data
from roq.testing.cluster import PortBlocks, wait_for

pytestmark = pytest.mark.integration

REGION = "eu-west-1"
KEY_ID = "AKIDROQTESTCHAIN"
SECRET = "roq-test-secret/K7MDENG+bPxRfiCYzz"  # moto takes any; only its echo is looked for


@pytest.fixture(scope="module")
def moto_url(port_blocks: PortBlocks, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """moto's EC2 (and IAM) API on a port of this worker, answered within 60 s."""
    port = port_blocks.take(1)
    log = tmp_path_factory.mktemp("moto") / "server.log"
    with log.open("wb") as out:
        server = subprocess.Popen(
            [sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_for(lambda: _answers(url, server), 60, f"moto's server on {url} ({log})")
        yield url
    finally:
        server.terminate()
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)


def _answers(url: str, server: subprocess.Popen[bytes]) -> bool:
    if server.poll() is not None:
        raise RuntimeError(f"moto's server exited with {server.returncode}")
    try:
        with urllib.request.urlopen(f"{url}/moto-api/", timeout=2) as answer:
            return bool(answer.status == 200)
    except OSError:
        return False


@pytest.fixture
def ec2(moto_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Any:
    """A clean EC2 state, and boto3's chain holding only the test's key in the environment (no
    ~/.aws, no instance metadata). Returns a client for the test's own checks."""
    request = urllib.request.Request(f"{moto_url}/moto-api/reset", method="POST")
    with urllib.request.urlopen(request, timeout=10):
        pass
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", KEY_ID)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", SECRET)
    return boto3.client("ec2", region_name=REGION, endpoint_url=moto_url)


def _provisioner(moto_url: str, **values: str) -> Ec2Provisioner:
    """The provisioner the GCM would make from a GCM.properties with these values."""
    settings = config.GcmSettings.from_settings(
        config.load_gcm(
            None,
            {
                "provisioner": "ec2",
                "cloud.region": REGION,
                "cloud.endpoint": moto_url,
                "cloud.image": "ami-0123456789abcdef0",
                "cloud.instance.type": "m5.large",
                "zk.servers": "10.0.1.10:2181",
                "network.interface": "10.0.1.10",
                "cloud.provision.cooldown.ms": "0",
                **values,
            },
        )
    )
    provisioner = make_provisioner(settings.provisioning)
    assert isinstance(provisioner, Ec2Provisioner)
    return provisioner


def _instances(ec2: Any) -> list[dict[str, Any]]:
    reservations = ec2.describe_instances()["Reservations"]
    return [instance for r in reservations for instance in r["Instances"]]


def test_a_launch_starts_the_host_instance_with_the_environments_credentials(
    moto_url: str, ec2: Any, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)  # boto3's own debug logs too: the secret is in none
    vpc = ec2.create_vpc(CidrBlock="10.0.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.0.1.0/24")["Subnet"]["SubnetId"]
    group = ec2.create_security_group(GroupName="roq", Description="roq", VpcId=vpc)["GroupId"]
    ec2.create_key_pair(KeyName="ops")
    iam = boto3.client("iam", region_name=REGION, endpoint_url=moto_url)
    iam.create_instance_profile(InstanceProfileName="roq-host")
    provisioner = _provisioner(
        moto_url,
        **{
            "cloud.subnet": subnet,
            "cloud.security.groups": group,
            "cloud.key.name": "ops",
            "cloud.instance.profile": "roq-host",
            "cloud.instances.max": "1",
        },
    )
    said = provisioner.provision("queue q needs an exchange")
    [instance] = _instances(ec2)
    assert said == (
        "capacity exhausted (queue q needs an exchange); ec2 started instance "
        f"{instance['InstanceId']} of ami-0123456789abcdef0: it joins as a host when it has booted"
    )
    assert provisioner.launched == [instance["InstanceId"]]
    assert (instance["ImageId"], instance["InstanceType"]) == ("ami-0123456789abcdef0", "m5.large")
    assert (instance["SubnetId"], instance["KeyName"]) == (subnet, "ops")
    assert [g["GroupId"] for g in instance["SecurityGroups"]] == [group]
    assert instance["IamInstanceProfile"]["Arn"].endswith(":instance-profile/roq-host")
    tags = {tag["Key"]: tag["Value"] for tag in instance["Tags"]}
    assert tags == {"Name": "roq-host", "roq:cluster": "/roq"}
    attribute = ec2.describe_instance_attribute(
        InstanceId=instance["InstanceId"], Attribute="userData"
    )
    script = base64.b64decode(attribute["UserData"]["Value"]).decode()
    assert script == user_data(provisioner.config)
    assert "ROQ_ZK_SERVERS=10.0.1.10:2181" in script
    # the bound: cloud.instances.max=1, so the next call asks EC2 for nothing
    assert "its limit cloud.instances.max" in provisioner.provision("queue q2")
    assert len(_instances(ec2)) == 1
    assert "AWS credentials from env" in caplog.text
    assert SECRET not in caplog.text


def test_a_shared_credentials_file_is_the_chain_too_and_the_cooldown_holds(
    moto_url: str, ec2: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:  # fmt: skip
    caplog.set_level(logging.INFO)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    credentials = tmp_path / "credentials"
    credentials.write_text(
        f"[default]\naws_access_key_id = {KEY_ID}\naws_secret_access_key = {SECRET}\n"
    )
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    provisioner = _provisioner(moto_url, **{"cloud.provision.cooldown.ms": "600000"})
    assert "ec2 started instance i-" in provisioner.provision("q")
    assert "waiting for that host to join" in provisioner.provision("q")
    assert len(_instances(ec2)) == 1 and len(provisioner.launched) == 1
    assert "AWS credentials from shared-credentials-file" in caplog.text
    assert SECRET not in caplog.text


def test_ec2s_refusal_is_one_line_and_nothing_is_counted(moto_url: str, ec2: Any) -> None:
    provisioner = _provisioner(moto_url, **{"cloud.subnet": "subnet-0doesnotexist"})
    said = provisioner.provision("q")
    assert said.startswith("capacity exhausted (q); ec2 RunInstances failed: ")
    assert "InvalidSubnetID.NotFound" in said and "\n" not in said, said
    assert provisioner.launched == [] and _instances(ec2) == []
