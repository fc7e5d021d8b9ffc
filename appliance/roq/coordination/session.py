"""A ZooKeeper session with bounded retries (kazoo's default back-off grows to an hour)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.retry import KazooRetry

from roq import limits
from roq.errors import CoordinationError

log = logging.getLogger(__name__)


def connect(
    servers: str,
    session_timeout_ms: int,
    *,
    connect_timeout_s: float = limits.zk_connect_timeout_s,
    on_state: Callable[[str], None] | None = None,
) -> Any:
    """A started KazooClient, or CoordinationError naming the servers within the bound."""
    client = KazooClient(
        hosts=servers,
        timeout=session_timeout_ms / 1000.0,
        connection_retry=KazooRetry(max_tries=-1, max_delay=limits.zk_reconnect_delay_max_s),
        command_retry=KazooRetry(
            max_tries=limits.zk_command_retries_max, max_delay=limits.zk_reconnect_delay_max_s
        ),
    )
    if on_state is not None:
        client.add_listener(lambda state: on_state(_state_name(state)))
    try:
        client.start(timeout=connect_timeout_s)
    except (KazooTimeoutError, KazooException, OSError) as error:
        client.stop()
        client.close()
        raise CoordinationError(
            f"cannot reach ZooKeeper at {servers} within {connect_timeout_s:.0f} s ({error})"
        ) from None
    return client


def _state_name(state: Any) -> str:
    if state == KazooState.LOST:
        return "LOST"
    if state == KazooState.SUSPENDED:
        return "SUSPENDED"
    return "CONNECTED"


def close(client: Any) -> None:
    try:
        client.stop()
        client.close()
    except KazooException as error:  # closing must never mask the reason we are closing
        log.warning("closing the ZooKeeper session failed: %s", error)
