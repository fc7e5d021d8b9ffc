"""Key parts of a key-ordered consumer group (monitor/keyed.py): which part a routing key is in.

The monitor cuts each range of a log into one slot per part, and the consumer that reads a
part's slot hands out only that part's records: so the function must be the same in every
consumer and stable across versions (crc32: in the standard library, in C, and fixed).
"""

from __future__ import annotations

import zlib


def key_part(key: bytes, parts: int) -> int:
    """The part of `key` among `parts` (every record of one key is in the same part)."""
    return zlib.crc32(key) % parts if parts > 1 else 0
