"""A record's meta as people write it (`roq pub --id/--ttl/--delay`, the HTTP gateway's v2
publish): a message id as text, a time to live or a delay as an absolute time. One reading for
both, so an id accepted by one is accepted by the other.

A message id is 16 bytes (docs/log-format.md §1); as text it is 32 hex digits
(`0123456789abcdef0123456789abcdef`, what `roq sub --meta` and a v2 get print) or a UUID in its
usual 8-4-4-4-12 form, either case. Nothing else: no braces, no `urn:uuid:`, no spaces, so that
an id copied out of a log line means one thing.
"""

from __future__ import annotations

import re
import time

from roq.log.format import MESSAGE_ID_BYTES

_HEX = re.compile(r"[0-9a-fA-F]{32}")
_UUID = re.compile(r"[0-9a-fA-F]{8}(-[0-9a-fA-F]{4}){3}-[0-9a-fA-F]{12}")


def message_id_from_text(text: str) -> bytes:
    """The 16 bytes of a message id written as 32 hex digits or a UUID; ValueError says why
    `text` is neither (quoting at most its first 40 characters)."""
    if _HEX.fullmatch(text) or _UUID.fullmatch(text):
        raw = bytes.fromhex(text.replace("-", ""))
        assert len(raw) == MESSAGE_ID_BYTES
        return raw
    return _refuse_id(text)


def _refuse_id(text: str) -> bytes:
    raise ValueError(f"{text[:40]!r} is not a message id: 32 hex digits or a UUID "
                     "(8-4-4-4-12 hex digits)")  # fmt: skip


def message_id_text(raw: bytes) -> str:
    """A message id as the gateway and `roq sub --meta` print it: 32 lowercase hex digits."""
    return raw.hex()


def now_us() -> int:
    """The wall clock as the record's times read it: µs since the Unix epoch (log-format §1)."""
    return time.time_ns() // 1000


def after_ms(ms: int, now: int | None = None) -> int:
    """The absolute time, µs since the epoch, `ms` milliseconds from `now` (default: now)."""
    return (now_us() if now is None else now) + ms * 1000
