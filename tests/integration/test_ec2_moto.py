"""The ec2 provisioner against a real EC2 API, and the cluster's keys in a real SSM Parameter
Store: moto's server, out of process on 127.0.0.1.

The provisioner runs as the GCM runs it (GCM.properties values through the loader, then
`make_provisioner`), with its credentials from boto3's chain only: the environment, or a shared
credentials file. What it started is then read back through the same API (describe_instances,
the user data attribute), so the request is checked by what EC2 understood, not by its bytes.
`roq keys ssm-put|ssm-get` and the image's roq-configure run as processes, as an operator and
a booting host run them, with the same environment chain (AWS_ENDPOINT_URL points boto3 at
moto where no --endpoint is given, as on EC2 nothing is given).
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

from roq import config, errors
from roq.gcm.provisioning import Ec2Provisioner, make_provisioner, user_data
from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import PortBlocks, wait_for
from roq.transport import security

pytestmark = pytest.mark.integration

REGION = "eu-west-1"
KEY_ID = "AKIDROQTESTCHAIN"
SECRET = "roq-test-secret/K7MDENG+bPxRfiCYzz"  # moto takes any; only its echo is looked for
PARAMETER = "/roq/test/cluster"
ROOT = Path(__file__).resolve().parents[2]


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
                "cloud.cluster.parameter": PARAMETER,
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
    # issue 31: IMDSv2 only (no token, no credentials), one hop; the root volume encrypted
    options = instance["MetadataOptions"]
    assert (options["HttpTokens"], options["HttpEndpoint"]) == ("required", "enabled")
    assert options["HttpPutResponseHopLimit"] == 1
    [volume] = ec2.describe_volumes(
        Filters=[{"Name": "attachment.instance-id", "Values": [instance["InstanceId"]]}]
    )["Volumes"]
    assert volume["Encrypted"] is True and volume["Size"] == 8
    assert volume["Attachments"][0]["Device"] == "/dev/xvda"
    [root] = instance["BlockDeviceMappings"]
    assert (root["DeviceName"], root["Ebs"]["DeleteOnTermination"]) == ("/dev/xvda", True)
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


# --- the cluster's keys through SSM Parameter Store ----------------------------------------------
def _roq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        roq_command(*args),
        capture_output=True,
        text=True,
        timeout=60,
        env=env or child_environment(),
        check=False,
    )


def _ssm_args(moto_url: str, directory: Path, parameter: str = PARAMETER) -> list[str]:
    where = ["--security-dir", str(directory), "--region", REGION, "--endpoint", moto_url]
    return [parameter, *where]


def _secrets(directory: Path) -> tuple[bytes, security.ClusterSecrets]:
    secrets = security.generate(directory)
    return (directory / security.CLUSTER_FILE).read_bytes(), secrets


def test_ssm_put_then_get_gives_the_same_cluster_json_private(
    moto_url: str, ec2: Any, tmp_path: Path
) -> None:
    original, secrets = _secrets(tmp_path / "first")
    put = _roq("keys", "ssm-put", *_ssm_args(moto_url, tmp_path / "first"))
    assert put.returncode == 0, put.stderr
    for output in (put.stdout, put.stderr):
        assert secrets.keys.secret not in output and secrets.zk_auth not in output
    ssm = boto3.client("ssm", region_name=REGION, endpoint_url=moto_url)
    stored = ssm.get_parameter(Name=PARAMETER)["Parameter"]  # not decrypted: KMS's ciphertext
    decrypted = ssm.get_parameter(Name=PARAMETER, WithDecryption=True)["Parameter"]
    assert stored["Type"] == "SecureString" and stored["Value"] != decrypted["Value"]
    # a second upload is refused unless asked for: a typo must not re-key a running cluster
    again = _roq("keys", "ssm-put", *_ssm_args(moto_url, tmp_path / "first"))
    assert again.returncode == errors.EXIT_CONFIG and "--overwrite" in again.stderr

    fetched = tmp_path / "host" / "security"
    got = _roq("keys", "ssm-get", *_ssm_args(moto_url, fetched))
    assert got.returncode == 0, got.stderr
    assert (fetched / security.CLUSTER_FILE).read_bytes() == original
    assert (fetched / security.CLUSTER_FILE).stat().st_mode & 0o777 == 0o600
    assert fetched.stat().st_mode & 0o777 == 0o700
    assert security.load_cluster(fetched) == secrets
    # run again (roq-configure on a reboot): the same keys are there, nothing to do
    assert _roq("keys", "ssm-get", *_ssm_args(moto_url, fetched)).returncode == 0


@pytest.mark.parametrize(
    "value",
    ['{"public": "short"}', "not json at all", '["a list"]', '{"public": "' + "x" * 40 + '"}'],
)
def test_ssm_get_refuses_a_value_that_is_not_a_cluster_json(
    moto_url: str, ec2: Any, tmp_path: Path, value: str
) -> None:
    ssm = boto3.client("ssm", region_name=REGION, endpoint_url=moto_url)
    ssm.put_parameter(Name=PARAMETER, Value=value, Type="SecureString")
    target = tmp_path / "security"
    got = _roq("keys", "ssm-get", *_ssm_args(moto_url, target))
    assert got.returncode == errors.EXIT_CONFIG, got.stderr
    assert "not a cluster.json" in got.stderr and len(got.stderr.splitlines()) == 1
    assert value not in got.stderr  # what it holds is not repeated: it may be another secret
    assert not (target / security.CLUSTER_FILE).exists()


def test_ssm_get_never_replaces_another_clusters_keys(
    moto_url: str, ec2: Any, tmp_path: Path
) -> None:
    _secrets(tmp_path / "cluster-a")
    assert _roq("keys", "ssm-put", *_ssm_args(moto_url, tmp_path / "cluster-a")).returncode == 0
    mine, _ = _secrets(tmp_path / "cluster-b")
    got = _roq("keys", "ssm-get", *_ssm_args(moto_url, tmp_path / "cluster-b"))
    assert got.returncode == errors.EXIT_CONFIG, got.stderr
    assert "another cluster's keys" in got.stderr and len(got.stderr.splitlines()) == 1
    assert (tmp_path / "cluster-b" / security.CLUSTER_FILE).read_bytes() == mine
    # a file there that is no cluster.json at all is not replaced either
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / security.CLUSTER_FILE).write_text("{")
    broken = _roq("keys", "ssm-get", *_ssm_args(moto_url, tmp_path / "broken"))
    assert broken.returncode == errors.EXIT_CONFIG and "not replaced" in broken.stderr
    assert (tmp_path / "broken" / security.CLUSTER_FILE).read_text() == "{"
    # a directory that cannot be made (a file in its path, which stops root too): exit 73
    (tmp_path / "a-file").write_text("")
    unwritable = _roq("keys", "ssm-get", *_ssm_args(moto_url, tmp_path / "a-file" / "security"))
    assert unwritable.returncode == errors.EXIT_CANTCREAT, unwritable.stderr
    assert "cannot write" in unwritable.stderr and len(unwritable.stderr.splitlines()) == 1


def test_ssm_errors_are_one_line_with_their_exit_code(
    moto_url: str, ec2: Any, tmp_path: Path
) -> None:
    target = tmp_path / "security"
    missing = _roq("keys", "ssm-get", *_ssm_args(moto_url, target, "/roq/test/none"))
    assert missing.returncode == errors.EXIT_CONFIG
    assert "ParameterNotFound" in missing.stderr and len(missing.stderr.splitlines()) == 1
    env = {k: v for k, v in child_environment().items() if not k.startswith("AWS_ACCESS")}
    env.pop("AWS_SECRET_ACCESS_KEY")
    bare = _roq("keys", "ssm-get", *_ssm_args(moto_url, target), env=env)
    assert bare.returncode == errors.EXIT_NOPERM
    assert "no AWS credentials" in bare.stderr and len(bare.stderr.splitlines()) == 1
    dead = _roq("keys", "ssm-get", PARAMETER, "--security-dir", str(target), "--region", REGION,
                "--endpoint", "http://127.0.0.1:1")  # fmt: skip
    assert dead.returncode == errors.EXIT_UNAVAILABLE and len(dead.stderr.splitlines()) == 1
    no_region = {**child_environment(), "AWS_ENDPOINT_URL": moto_url}
    nowhere = _roq("keys", "ssm-get", PARAMETER, "--security-dir", str(target), env=no_region)
    assert nowhere.returncode == errors.EXIT_CONFIG and "region" in nowhere.stderr
    assert not target.exists()


def test_a_launched_host_is_given_the_parameters_name_and_no_key(
    moto_url: str, ec2: Any, tmp_path: Path
) -> None:
    keys = tmp_path / "security"
    _, secrets = _secrets(keys)
    provisioner = _provisioner(moto_url, **{"security.dir": str(keys)})
    assert "ec2 started instance" in provisioner.provision("q")
    [instance] = _instances(ec2)
    attribute = ec2.describe_instance_attribute(
        InstanceId=instance["InstanceId"], Attribute="userData"
    )
    script = base64.b64decode(attribute["UserData"]["Value"]).decode()
    assert f"      ROQ_CLUSTER_PARAMETER={PARAMETER}" in script.splitlines()
    for material in (secrets.keys.secret, secrets.zk_auth, secrets.zk_auth.split(":")[1]):
        assert material not in script


def test_the_images_roq_configure_fetches_the_keys_the_provisioner_named(
    moto_url: str, ec2: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What a launched host runs at first boot: the role.env of the user data the provisioner
    sent, then roq-configure, whose `roq keys ssm-get` finds SSM through the chain alone."""
    original, _ = _secrets(tmp_path / "operator")
    assert _roq("keys", "ssm-put", *_ssm_args(moto_url, tmp_path / "operator")).returncode == 0
    provisioner = _provisioner(moto_url)
    role_env = [
        line.strip()
        for line in user_data(provisioner.config).splitlines()
        if line.strip().startswith("ROQ_")
    ]
    etc, state = tmp_path / "etc", tmp_path / "state"
    etc.mkdir()
    (etc / "role.env").write_text("\n".join(role_env) + "\n")
    wrapper = tmp_path / "roq"
    wrapper.write_text(f'#!/bin/sh\nexec {" ".join(roq_command())} "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_url)  # on EC2: the region's endpoint
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)  # on EC2: the instance's region
    env = {
        **child_environment(),
        "ROQ_ETC": str(etc),
        "ROQ_SHIPPED": str(ROOT / "config"),
        "ROQ_STATE": str(state),
        "ROQ_BIN": str(wrapper),
    }
    configure = [str(ROOT / "ami" / "files" / "roq-configure"), "--no-start"]
    result = subprocess.run(
        ["sh", *configure], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stderr
    secdir = state / "roq-data" / "security"
    assert (secdir / security.CLUSTER_FILE).read_bytes() == original
    hcm = config.load_hcm(etc / "HCM.properties", {})
    assert hcm.values["security.dir"] == str(secdir)  # where the host unit will look
    # the parameter gone (or the role without rights): exit 78, no unit started
    others = [line for line in role_env if not line.startswith("ROQ_CLUSTER_PARAMETER=")]
    (etc / "role.env").write_text("\n".join([*others, "ROQ_CLUSTER_PARAMETER=/roq/x"]) + "\n")
    failed = subprocess.run(
        ["sh", *configure], env=env, capture_output=True, text=True, timeout=60, check=False
    )
    assert failed.returncode == errors.EXIT_CONFIG
    assert "cannot fetch the cluster's keys from SSM parameter /roq/x" in failed.stderr
    assert "ParameterNotFound" in failed.stderr and failed.stdout == ""
