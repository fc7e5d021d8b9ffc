"""The provisioning hook: what the GCM does when a queue needs an exchange and no host has room.

Two provisioners, chosen by GCM.properties `provisioner`:

* `none` logs that capacity is exhausted and starts nothing; the GCM refuses the exchange with
  `no_capacity`, and the queue's monitor raises the KPI alarm (SCALING_EVENT capacity_exhausted).
* `ec2` starts one instance of the roq machine image (`cloud.image`) with boto3's RunInstances,
  requiring IMDSv2 and with its root volume encrypted, with cloud-init user data in the image's
  own format (ami/user-data/host.yaml: /etc/roq/role.env, then roq-configure), so the machine
  joins this cluster's ZooKeeper as a host. It is bounded: at
  most `cloud.instances.max` launches per GCM, `cloud.provision.cooldown.ms` apart (a booting VM
  is not asked for twice), each attempt limited to `cloud.request.timeout.ms`, at most
  `limits.ec2_request_attempts` attempts with one client token (EC2 starts one instance for it).

Credentials come only from boto3's default chain: on the GCM machine its instance role (through
the instance metadata service), elsewhere the AWS_* environment or ~/.aws. None is read from
GCM.properties: the loader refuses `cloud.password` (roq.config.keys.RETIRED), and nothing here
logs a credential, only where it came from. Called from the GCM's main thread only. The ec2
settings (`roq.config.Ec2Config`) are read and checked when the GCM starts, and the EC2 client is
built then (roq.cloud.aws), so a region or endpoint boto3 rejects stops the GCM with exit 78.
With security on, a launched host gets the cluster's keys from the SSM parameter
`cloud.cluster.parameter` (roq.cloud.parameters); the user data carries only its name.
"""

from __future__ import annotations

import logging
import time
import uuid
from typing import TYPE_CHECKING, Protocol, cast

from roq import limits
from roq.cloud import aws
from roq.config import Ec2Config, ProvisioningSettings
from roq.errors import ConfigError, RoqError, SecurityError

if TYPE_CHECKING:
    from mypy_boto3_ec2.client import EC2Client
    from mypy_boto3_ec2.literals import InstanceTypeType
    from mypy_boto3_ec2.type_defs import ReservationResponseTypeDef, RunInstancesRequestTypeDef

log = logging.getLogger(__name__)


class Provisioner(Protocol):
    name: str

    def provision(self, reason: str) -> str:
        """Ask for more capacity; returns one line saying what was done (never raises)."""


class NoProvisioner:
    name = "none"

    def provision(self, reason: str) -> str:
        message = f"capacity exhausted ({reason}); provisioner none starts no machine"
        log.warning("%s", message)
        return message


def user_data(config: Ec2Config) -> str:
    """Cloud-init user data that makes an instance of the roq image join as a host.

    The image's contract (ami/files/roq-configure): /etc/roq/role.env names the role, the GCM
    address, the ZooKeeper servers and the interface; roq-configure writes HCM.properties from it
    and starts roq-host.service. Only characters roq-configure accepts are written. The cluster's
    keys are not in it (user data is readable by anyone who can describe the instance): only the
    name of the SSM parameter the host fetches them from with its instance role."""
    parameter = (
        [f"      ROQ_CLUSTER_PARAMETER={config.cluster_parameter}"]
        if config.cluster_parameter
        else []
    )
    # a cluster run with security=off launches hosts without it: a secured host could not
    # talk to it (CURVE against NULL), and would not know it is meant to be open
    if not config.secured:
        parameter.append("      ROQ_SECURITY=off")
    return "\n".join(
        [
            "#cloud-config",
            "# written by roq's ec2 provisioner: this instance joins the cluster as a host",
            "write_files:",
            "  - path: /etc/roq/role.env",
            '    permissions: "0644"',
            "    content: |",
            "      ROQ_ROLE=host",
            f"      ROQ_GCM_ADDRESS={config.join_gcm}",
            f"      ROQ_ZK_SERVERS={config.join_zk}",
            f"      ROQ_INTERFACE={config.join_interface}",
            *parameter,
            "runcmd:",
            "  - [/opt/roq/bin/roq-configure]",
            "",
        ]
    )


def run_instances_args(config: Ec2Config, client_token: str) -> RunInstancesRequestTypeDef:
    """The arguments of one RunInstances call (one instance). boto3 base64-encodes UserData."""
    args: RunInstancesRequestTypeDef = {
        "ImageId": config.image,
        # EC2 checks the type; the stubs' literal list would only lag behind new types
        "InstanceType": cast("InstanceTypeType", config.instance_type),
        "MinCount": 1,
        "MaxCount": 1,
        "ClientToken": client_token,  # EC2's idempotency: a retried request starts no second VM
        "UserData": user_data(config),
        # IMDSv2 only: a request forged through the host (SSRF) cannot read the instance
        # role's credentials without a PUT for a token; one hop, so no container gets one
        "MetadataOptions": {
            "HttpTokens": "required",
            "HttpEndpoint": "enabled",
            "HttpPutResponseHopLimit": 1,
        },
        # the root volume (the logs and the cluster's keys) encrypted, whatever the image's
        # snapshot is (ami/roq.pkr.hcl encrypts it too) and the account's default
        "BlockDeviceMappings": [
            {
                "DeviceName": config.root_device,
                "Ebs": {
                    "Encrypted": True,
                    "DeleteOnTermination": True,
                    "VolumeSize": config.root_size_gib,
                },
            }
        ],
        "TagSpecifications": [
            {
                "ResourceType": "instance",
                "Tags": [
                    {"Key": "Name", "Value": "roq-host"},
                    {"Key": "roq:cluster", "Value": config.join_namespace},
                ],
            }
        ],
    }
    if config.instance_profile:
        profile = config.instance_profile
        args["IamInstanceProfile"] = (
            {"Arn": profile} if profile.startswith("arn:") else {"Name": profile}
        )
    if config.key_name:
        args["KeyName"] = config.key_name
    if config.subnet:
        args["SubnetId"] = config.subnet
    if config.security_groups:
        args["SecurityGroupIds"] = list(config.security_groups)
    return args


def new_client(config: Ec2Config) -> tuple[EC2Client, str]:
    """An EC2 client with the default credential chain, and where its credentials come from
    ("iam-role", "env", ... or "nowhere"). boto3 is loaded only then: a GCM with provisioner
    none never loads it (0.4 s and its service models)."""
    try:
        client, source = aws.new_client(
            "ec2",
            config.region,
            config.endpoint or None,
            config.timeout_s,
            limits.ec2_request_attempts,
        )
    except ConfigError as error:
        raise ConfigError(f"keys 'cloud.region' / 'cloud.endpoint': {error}") from None
    return cast("EC2Client", client), source


class Ec2Provisioner:
    name = "ec2"

    def __init__(self, config: Ec2Config):
        self.config = config
        self.launched: list[str] = []
        self._last_attempt = float("-inf")
        self._client: EC2Client | None
        self._client, source = new_client(config)
        log.info(
            "ec2 provisioner: region %s, endpoint %s, AWS credentials from %s",
            config.region,
            config.endpoint or "the region's",
            source,
        )
        if source == "nowhere":
            self._client = None  # made again at the first launch: the chain is read again
            log.warning(
                "ec2 provisioner: no AWS credentials yet (environment, ~/.aws, instance role); "
                "give this machine an IAM instance role (docs/deploy.md)"
            )
        if config.cluster_parameter and not config.instance_profile:
            log.warning(
                "ec2 provisioner: cloud.cluster.parameter is set but cloud.instance.profile is "
                "not: the hosts it starts have no role to read %s with",
                config.cluster_parameter,
            )

    def provision(self, reason: str) -> str:
        now = time.monotonic()
        if len(self.launched) >= self.config.instances_max:
            return self._say(
                f"capacity exhausted ({reason}); ec2 already started "
                f"{len(self.launched)} instance(s), its limit cloud.instances.max"
            )
        if now - self._last_attempt < self.config.cooldown_s:
            return self._say(
                f"capacity exhausted ({reason}); an ec2 launch was asked "
                f"{now - self._last_attempt:.0f} s ago: waiting for that host to join"
            )
        self._last_attempt = now
        return self._say(f"capacity exhausted ({reason}); {self._launch()}")

    def _launch(self) -> str:
        """Start one instance; what happened, in a few words (never raises)."""
        try:
            client = self._client if self._client is not None else new_client(self.config)[0]
        except ConfigError as error:
            return f"ec2 RunInstances failed: {error}"
        try:
            with aws.translated("ec2 RunInstances"):  # EC2's refusal: its code and message
                answer = client.run_instances(**run_instances_args(self.config, uuid.uuid4().hex))
        except SecurityError as error:  # no credentials, or they may not: read the chain again
            self._client = None  # next time, so a role attached (or changed) later is found
            return str(error)
        except RoqError as error:  # unreachable, or EC2 refused the request
            return str(error)
        self._client = client
        instance = _instance_id(answer)
        self.launched.append(instance)
        return (
            f"ec2 started instance {instance} of {self.config.image}: it joins as a host when "
            "it has booted"
        )

    @staticmethod
    def _say(message: str) -> str:
        log.warning("%s", message)
        return message


def _instance_id(answer: ReservationResponseTypeDef) -> str:
    instances = answer.get("Instances") or []
    return instances[0].get("InstanceId", "?") if instances else "?"


def make_provisioner(settings: ProvisioningSettings) -> Provisioner:
    if settings.ec2 is not None:
        return Ec2Provisioner(settings.ec2)
    return NoProvisioner()
