"""One AWS client, built the same way for every service roq calls (EC2, SSM).

Credentials come only from boto3's default chain: the environment, ~/.aws, then the machine's
instance role through the instance metadata service. Nothing here reads a key from roq's
configuration, and nothing logs one: `new_client` says only where the credentials came from.

boto3 is imported inside the functions, not at the top: a process that never calls AWS (a GCM
with provisioner none, every `roq` command but `keys ssm-*`) never loads it and its models.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, cast

import roq
from roq.errors import ConfigError, SecurityError, TransportError

if TYPE_CHECKING:
    from botocore.client import BaseClient

# AWS error codes that mean "these credentials may not do this": exit 77, like a refused key.
_DENIED = frozenset(
    {
        "AccessDenied",
        "AccessDeniedException",
        "UnauthorizedOperation",
        "UnrecognizedClientException",
        "InvalidClientTokenId",
        "AuthFailure",
        "ExpiredToken",
        "ExpiredTokenException",
        "KMSAccessDeniedException",
    }
)
NO_CREDENTIALS = "no AWS credentials (environment, ~/.aws, instance role)"


def new_client(
    service: str, region: str | None, endpoint: str | None, timeout_s: float, attempts: int
) -> tuple[BaseClient, str]:
    """A client of `service` and where its credentials come from ("iam-role", "env", ... or
    "nowhere"). Every request is bounded: `timeout_s` to connect and for each read, at most
    `attempts` attempts (botocore's standard retry mode). `region` None: boto3's own (AWS_REGION,
    ~/.aws/config, on EC2 the instance's); `endpoint` None: the region's (or AWS_ENDPOINT_URL).
    ConfigError when boto3 refuses the region or the endpoint. The caller casts the client to
    its service's type (mypy_boto3_*), which it knows."""
    import boto3
    import botocore.config
    import botocore.exceptions

    bounds = botocore.config.Config(
        connect_timeout=timeout_s,
        read_timeout=timeout_s,
        retries={"total_max_attempts": attempts, "mode": "standard"},
        user_agent_extra=f"roq/{roq.__version__}",
    )
    session = boto3.session.Session()
    try:
        # the stubs type session.client per literal service name; this takes any
        make = cast("Callable[..., BaseClient]", session.client)
        client = make(service, region_name=region, endpoint_url=endpoint, config=bounds)
    except botocore.exceptions.NoRegionError:
        raise ConfigError(
            f"no AWS region for {service}: give one (--region, cloud.region) or set AWS_REGION"
        ) from None
    except (botocore.exceptions.BotoCoreError, ValueError) as error:
        raise ConfigError(f"the {service} client refuses region or endpoint: {error}") from None
    credentials = session.get_credentials()  # found once when the client was made: cached
    return client, credentials.method if credentials is not None else "nowhere"


@contextmanager
def translated(what: str, codes: dict[str, type[Exception]] | None = None) -> Iterator[None]:
    """AWS's errors in the block become one line starting with `what` and a roq error with its
    exit code: no credentials or access denied SecurityError (77), an unreachable or failing
    service TransportError (69); `codes` maps other AWS error codes to roq errors (a missing
    SSM parameter: ConfigError). The line names AWS's error code and message, never a key."""
    import botocore.exceptions

    try:
        yield
    except (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError):
        raise SecurityError(
            f"{what} failed: {NO_CREDENTIALS}: give this machine an IAM instance role"
        ) from None
    except botocore.exceptions.ClientError as error:
        code = str(error.response.get("Error", {}).get("Code", ""))
        kind = (codes or {}).get(code) or (SecurityError if code in _DENIED else TransportError)
        raise kind(f"{what} failed: {_one_line(error)}") from None
    except (botocore.exceptions.BotoCoreError, OSError, ValueError) as error:
        raise TransportError(f"{what} failed: {_one_line(error)}") from None


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())
