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
