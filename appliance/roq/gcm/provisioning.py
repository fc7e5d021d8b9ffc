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
unit tests check; tests never send it. Called from the GCM's main thread only.
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
from dataclasses import dataclass
from typing import Protocol

from roq.config import Settings
from roq.errors import ConfigError

log = logging.getLogger(__name__)

EC2_API_VERSION = "2016-11-15"
_SAFE = re.compile(r"^[A-Za-z0-9.,:_\-]*$")  # what ami/files/roq-configure accepts in role.env
_RESPONSE_BYTES_MAX = 1024 * 1024


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


@dataclass(frozen=True)
class Ec2Config:
    region: str
    endpoint: str  # https://ec2.<region>.amazonaws.com/
    access_key: str
    secret_key: str
    image: str
    instance_type: str
    key_name: str
    security_groups: tuple[str, ...]
    subnet: str
    join_zk: str
    join_namespace: str
    join_gcm: str
    join_interface: str
    gcm_ports_base: int
    instances_max: int
    cooldown_s: float
    timeout_s: float

    @classmethod
    def from_settings(cls, settings: Settings) -> Ec2Config:
        region = settings.get_str("cloud.region")
        config = cls(
            region=region,
            endpoint=settings.get_str("cloud.endpoint") or f"https://ec2.{region}.amazonaws.com/",
            access_key=settings.get_str("cloud.user"),
            secret_key=settings.get_str("cloud.password"),
            image=settings.get_str("cloud.image"),
            instance_type=settings.get_str("cloud.instance.type"),
            key_name=settings.get_str("cloud.key.name"),
            security_groups=tuple(
                g.strip() for g in settings.get_str("cloud.security.groups").split(",") if g.strip()
            ),
            subnet=settings.get_str("cloud.subnet"),
            join_zk=settings.get_str("cloud.join.zk") or settings.get_str("zk.servers"),
            join_namespace=settings.get_str("zk.namespace"),
            join_gcm=settings.get_str("cloud.join.gcm") or settings.get_str("network.interface"),
            join_interface=settings.get_str("cloud.join.interface"),
            gcm_ports_base=settings.get_int("ports.base"),
            instances_max=settings.get_int("cloud.instances.max"),
            cooldown_s=settings.get_int("cloud.provision.cooldown.ms") / 1000,
            timeout_s=settings.get_int("cloud.request.timeout.ms") / 1000,
        )
        config.check(settings.source)
        return config

    def check(self, where: str) -> None:
        """Refuse at start-up what would make a broken launch later."""
        for key, value in (
            ("cloud.image", self.image),
            ("cloud.user", self.access_key),
            ("cloud.password", self.secret_key),
        ):
            if not value:
                raise ConfigError(f"{where}: provisioner=ec2 needs key '{key}'")
        if not self.endpoint.startswith("https://"):
            raise ConfigError(f"{where}: key 'cloud.endpoint' must be an https:// URL")
        if self.join_namespace != "/roq":
            raise ConfigError(
                f"{where}: key 'zk.namespace' is {self.join_namespace!r}: a provisioned host "
                "joins /roq (the image's roq-configure has no namespace setting)"
            )
        for key, value in (
            ("cloud.join.zk", self.join_zk),
            ("cloud.join.gcm", self.join_gcm),
            ("cloud.join.interface", self.join_interface),
        ):
            if not value or not _SAFE.match(value):
                raise ConfigError(
                    f"{where}: key '{key}' has value {value!r}: a provisioned host needs it, "
                    "made of letters, digits and .:,_- only (the image's roq-configure rule)"
                )


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
                text = response.read(_RESPONSE_BYTES_MAX).decode(errors="replace")
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


def make_provisioner(settings: Settings) -> Provisioner:
    if settings.get_str("provisioner") == "ec2":
        return Ec2Provisioner(Ec2Config.from_settings(settings))
    return NoProvisioner()
