"""The cluster's cluster.json in AWS Systems Manager Parameter Store (docs/security.md §2).

A host the ec2 provisioner launches must hold the same cluster.json as every other node, and no
secret may travel in user data or configuration. So the operator uploads cluster.json once as a
SecureString parameter (`roq keys ssm-put`: SSM encrypts it with KMS), the GCM passes the
parameter's name to the hosts it launches, and each host fetches the file at boot with its
instance role (`roq keys ssm-get`, run by the image's roq-configure) before roq starts.

What is fetched is checked as a cluster.json before anything is written, then written as roq
writes its keys (mode 0600 in a 0700 directory, whole or not at all) and never over another
cluster.json: a machine of another cluster is refused rather than silently re-keyed.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from roq import limits
from roq.cloud import aws
from roq.config import api_endpoint, check_parameter_name
from roq.errors import EXIT_CANTCREAT, ConfigError, RoqError, SecurityError
from roq.transport import security

if TYPE_CHECKING:
    from mypy_boto3_ssm.client import SSMClient


@dataclass(frozen=True)
class Where:
    """Which parameter, in which region, through which endpoint (None: boto3's default)."""

    name: str
    region: str | None = None
    endpoint: str | None = None

    def checked(self) -> Where:
        check_parameter_name(self.name, "the parameter name")
        if self.endpoint and not api_endpoint(self.endpoint):
            raise ConfigError(
                f"endpoint {self.endpoint!r}: an https:// URL, or http:// on a loopback address "
                "(an emulator on this machine)"
            )
        return self


def _client(where: Where) -> SSMClient:
    client, _source = aws.new_client(
        "ssm",
        where.region,
        where.endpoint,
        limits.ssm_request_timeout_s,
        limits.ssm_request_attempts,
    )
    return cast("SSMClient", client)


def put_cluster(where: Where, directory: Path, *, overwrite: bool) -> int:
    """Upload `directory`/cluster.json (checked first) as the SecureString parameter; returns its
    version. An existing parameter is replaced only with `overwrite`."""
    where = where.checked()
    doc = security.read_cluster_doc(directory)
    value = json.dumps(doc, separators=(",", ":"))
    if len(value.encode()) > limits.ssm_value_bytes_max:
        raise ConfigError(
            f"{directory / security.CLUSTER_FILE} is {len(value)} bytes compacted: more than "
            f"a Standard SSM parameter holds ({limits.ssm_value_bytes_max})"
        )
    codes: dict[str, type[Exception]] = {"ParameterAlreadyExists": ConfigError}
    try:
        with aws.translated(f"ssm PutParameter {where.name}", codes):
            answer = _client(where).put_parameter(
                Name=where.name,
                Value=value,
                Type="SecureString",  # encrypted with KMS (the account's aws/ssm key) by SSM
                Tier="Standard",
                Overwrite=overwrite,
                Description="roq cluster.json (roq keys ssm-put)",
            )
    except ConfigError as error:  # the only code mapped to it: the parameter exists
        raise ConfigError(f"{error} (--overwrite replaces it)") from None
    return int(answer.get("Version", 0))


def fetch_cluster(where: Where) -> dict[str, Any]:
    """The parameter's value, decrypted and checked as a cluster.json (nothing is written)."""
    where = where.checked()
    codes: dict[str, type[Exception]] = {"ParameterNotFound": ConfigError}
    with aws.translated(f"ssm GetParameter {where.name}", codes):
        answer = _client(where).get_parameter(Name=where.name, WithDecryption=True)
    value = answer.get("Parameter", {}).get("Value", "")
    return _cluster_doc(value, where.name)


def _cluster_doc(value: str, name: str) -> dict[str, Any]:
    source = f"from SSM parameter {name}"
    if len(value.encode()) > limits.ssm_value_bytes_max:
        raise ConfigError(f"the value {source} is larger than any cluster.json")
    try:
        doc = json.loads(value)
    except ValueError:
        doc = None  # never quote the value: it may be a secret of something else
    if not isinstance(doc, dict):
        raise ConfigError(f"the value {source} is not a cluster.json (not a JSON object)")
    try:
        security.parse_cluster(doc, source)
    except SecurityError as error:
        raise ConfigError(f"the value is not a cluster.json: {error}") from None
    return doc


def install_cluster(doc: dict[str, Any], directory: Path) -> bool:
    """Write `doc` as `directory`/cluster.json; True when written, False when the same one is
    there already. Another cluster's cluster.json there is left alone: ConfigError."""
    path = directory / security.CLUSTER_FILE
    try:
        written = security.write_private(path, doc)
    except OSError as error:
        failed = RoqError(f"cannot write {path}: {error.strerror or error}")
        failed.exit_code = EXIT_CANTCREAT
        raise failed from None
    if written:
        return True
    try:
        existing = security.read_cluster_doc(directory)
    except SecurityError as error:
        raise ConfigError(f"{error}: left as it is, not replaced") from None
    if existing == doc:
        return False
    raise ConfigError(
        f"{path} exists and holds another cluster's keys: left as it is. Move it away to take "
        "the parameter's (this machine then leaves its old cluster)"
    )
