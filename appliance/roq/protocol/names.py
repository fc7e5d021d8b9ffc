"""Names users give (queues, hosts, keys) and the rules they must follow."""

from __future__ import annotations

import re

from roq import limits
from roq.errors import DecodeError

_QUEUE_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")


def check_queue_name(name: str) -> str:
    """A queue name is a znode name and a file name: letters, digits, `_`, `.`, `-`."""
    if not name or len(name) > limits.queue_name_chars_max:
        raise DecodeError(
            f"queue name {name!r} must have 1 to {limits.queue_name_chars_max} characters"
        )
    if not _QUEUE_RE.match(name) or name in (".", ".."):
        raise DecodeError(
            f"queue name {name!r} may only hold letters, digits, '_', '.' and '-', "
            "and must start with a letter or digit"
        )
    return name


EXCHANGE_ID_CHARS_MAX = 200


def check_exchange_id(exchange_id: str) -> str:
    """An exchange id names directories (its log, and `<leader>@<replica>` for copies), and
    peers send it in frames: it must be a plain file name."""
    if not 0 < len(exchange_id) <= EXCHANGE_ID_CHARS_MAX:
        raise DecodeError(f"exchange id must have 1 to {EXCHANGE_ID_CHARS_MAX} characters")
    if exchange_id in (".", "..") or any(c in exchange_id for c in "/@\0\\"):
        raise DecodeError(f"exchange id {exchange_id!r} is not a plain file name")
    return exchange_id


# A monitor's delivery-state log is copied by exchanges like an exchange's message log, under
# this leader id (docs/architecture.md §12); an exchange id never starts so (ids are made of the
# host's address and port), so no copy of one is ever taken for the other.
STATE_LOG_PREFIX = "state."


def state_log_id(epoch: int) -> str:
    """The leader id of the state log of a queue's monitor placed under `epoch`."""
    return f"{STATE_LOG_PREFIX}{epoch}"


def is_state_log(leader_id: str) -> bool:
    return leader_id.startswith(STATE_LOG_PREFIX)


def state_log_epoch(leader_id: str) -> int:
    """The epoch of `state.<epoch>`, or -1 for any other id."""
    tail = leader_id.removeprefix(STATE_LOG_PREFIX)
    return int(tail) if tail != leader_id and tail.isdigit() else -1
