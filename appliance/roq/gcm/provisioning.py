"""The provisioning hook: what the GCM does when a queue needs an exchange and no host has room.

Two provisioners, chosen by GCM.properties `provisioner`:

* `none` logs that capacity is exhausted and starts nothing; the GCM refuses the exchange with
  `no_capacity`, and the queue's monitor raises the KPI alarm (SCALING_EVENT capacity_exhausted).
* `ec2` starts one instance of the roq machine image (`cloud.image`) through the EC2 Query API
  (RunInstances, Signature Version 4, no SDK), with cloud-init user data in the image's own
  format (ami/user-data/host.yaml: /etc/roq/role.env, then roq-configure), so the machine joins
  this cluster's ZooKeeper as a host. It is
  bounded: at most `cloud.instances.max` launches per GCM, `cloud.provision.cooldown.ms` apart (a
  booting VM is not asked for twice), each request limited to `cloud.request.timeout.ms`.

The request is built by pure functions (`run_instances_params`, `user_data`, `sign_v4`) that the
unit tests check; tests never send it. Called from the GCM's main thread only. The ec2 settings
(`roq.config.Ec2Config`) are read and checked when the GCM starts.
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import hmac
import logging
import re
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from typing import Protocol

from roq import limits
from roq.config import Ec2Config, ProvisioningSettings

log = logging.getLogger(__name__)

EC2_API_VERSION = "2016-11-15"


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
    and starts roq-host.service. Only characters roq-configure accepts are written."""
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
            "runcmd:",
            "  - [/opt/roq/bin/roq-configure]",
            "",
        ]
    )


def run_instances_params(config: Ec2Config, client_token: str) -> dict[str, str]:
    """The AWS Query parameters of one RunInstances call (one instance)."""
    params = {
        "Action": "RunInstances",
        "Version": EC2_API_VERSION,
        "ImageId": config.image,
        "InstanceType": config.instance_type,
        "MinCount": "1",
        "MaxCount": "1",
        "ClientToken": client_token,  # EC2's idempotency: a retried request starts no second VM
        "UserData": base64.b64encode(user_data(config).encode()).decode(),
        "TagSpecification.1.ResourceType": "instance",
        "TagSpecification.1.Tag.1.Key": "Name",
        "TagSpecification.1.Tag.1.Value": "roq-host",
        "TagSpecification.1.Tag.2.Key": "roq:cluster",
        "TagSpecification.1.Tag.2.Value": config.join_namespace,
    }
    if config.key_name:
        params["KeyName"] = config.key_name
    if config.subnet:
        params["SubnetId"] = config.subnet
    for index, group in enumerate(config.security_groups, start=1):
        params[f"SecurityGroupId.{index}"] = group
    return params


def encode_query(params: dict[str, str]) -> str:
    """AWS's canonical form: sorted by name, RFC 3986 percent-encoding (space is %20)."""
    return "&".join(
        f"{urllib.parse.quote(k, safe='-_.~')}={urllib.parse.quote(v, safe='-_.~')}"
        for k, v in sorted(params.items())
    )


def sign_v4(
    method: str,
    url: str,
    headers: dict[str, str],
    body: bytes,
    access_key: str,
    secret_key: str,
    region: str,
    service: str,
    amz_date: str,
) -> dict[str, str]:
    """`headers` plus X-Amz-Date and the Signature Version 4 Authorization header.

    `url` carries no query string (the EC2 request sends its parameters in the body)."""
    parts = urllib.parse.urlsplit(url)
    signed = {k.lower(): " ".join(v.split()) for k, v in headers.items()}
    signed.setdefault("host", parts.netloc)
    signed["x-amz-date"] = amz_date
    names = sorted(signed)
    canonical = "\n".join(
        [
            method,
            parts.path or "/",
            "",
            *(f"{name}:{signed[name]}" for name in names),
            "",
            ";".join(names),
            hashlib.sha256(body).hexdigest(),
        ]
    )
    scope = f"{amz_date[:8]}/{region}/{service}/aws4_request"
    to_sign = "\n".join(
        ["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()]
    )
    key = f"AWS4{secret_key}".encode()
    for part in (amz_date[:8], region, service, "aws4_request"):
        key = hmac.new(key, part.encode(), hashlib.sha256).digest()
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    result = dict(headers)
    result["X-Amz-Date"] = amz_date
    result["Authorization"] = (
        f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, "
        f"SignedHeaders={';'.join(names)}, Signature={signature}"
    )
    return result


def build_request(config: Ec2Config, client_token: str, amz_date: str) -> urllib.request.Request:
    body = encode_query(run_instances_params(config, client_token)).encode()
    headers = sign_v4(
        "POST",
        config.endpoint,
        {"Content-Type": "application/x-www-form-urlencoded; charset=utf-8"},
        body,
        config.access_key,
        config.secret_key,
        config.region,
        "ec2",
        amz_date,
    )
    # the scheme is checked at start-up (https only): S310's file: worry does not apply
    return urllib.request.Request(config.endpoint, data=body, headers=headers, method="POST")  # noqa: S310


class Ec2Provisioner:
    name = "ec2"

    def __init__(self, config: Ec2Config):
        self.config = config
        self.launched: list[str] = []
        self._last_attempt = float("-inf")

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
        amz_date = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
        request = build_request(self.config, uuid.uuid4().hex, amz_date)
        try:
            with urllib.request.urlopen(request, timeout=self.config.timeout_s) as response:  # noqa: S310
                text = response.read(limits.ec2_response_bytes_max).decode(errors="replace")
        except (urllib.error.URLError, OSError, ValueError) as error:
            return self._say(f"capacity exhausted ({reason}); ec2 RunInstances failed: {error}")
        found = re.search(r"<instanceId>([^<]+)</instanceId>", text)
        instance = found.group(1) if found else "?"
        self.launched.append(instance)
        return self._say(
            f"capacity exhausted ({reason}); ec2 started instance {instance} of "
            f"{self.config.image}: it joins as a host when it has booted"
        )

    @staticmethod
    def _say(message: str) -> str:
        log.warning("%s", message)
        return message


def make_provisioner(settings: ProvisioningSettings) -> Provisioner:
    if settings.ec2 is not None:
        return Ec2Provisioner(settings.ec2)
    return NoProvisioner()
