"""`roq pub`'s meta options: --header, --id, --ttl and --delay, read once before anything is sent
into what each message carries (log format v2, docs/log-format.md §1).

Whatever is wrong with one of them is `BadInput` (exit 65) naming the option and the value,
raised before the command looks for its queue: nothing is sent. The log's modules are imported
where used: `roq --help` loads no more than it did.
"""

from __future__ import annotations

import re
import time
import uuid
from dataclasses import dataclass
from typing import Any

from roq import limits
from roq.errors import BadInput

AUTO = "auto"  # --id auto: a new random id for each message
_UNITS_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d)")
DURATION_HELP = "a number and a unit: 500ms, 30s, 5m, 1.5h, 2d"


def duration_ms(text: str, option: str, most_ms: int) -> int:
    """Whole milliseconds of a duration written as a number and a unit (ms, s, m, h, d); a bare
    number is refused (seconds or milliseconds? the unit says). BadInput names `option`."""
    found = _DURATION.fullmatch(text.strip())
    if found is None:
        raise BadInput(f"{option} {text[:40]!r}: expected {DURATION_HELP}")
    ms = round(float(found.group(1)) * _UNITS_MS[found.group(2)])
    if not 1 <= ms <= most_ms:
        raise BadInput(f"{option} {text!r}: from 1ms to {most_ms // _UNITS_MS['d']}d")
    return ms


def header(text: str) -> tuple[str, str]:
    """NAME=VALUE as (name, value): split at the first '=', the value may be empty or hold '='."""
    name, equals, value = text.partition("=")
    if not equals or not name:
        raise BadInput(f"--header {text[:40]!r}: expected NAME=VALUE with a non-empty NAME")
    return name, value


@dataclass(frozen=True)
class PubMeta:
    """What every message of one `roq pub` carries; `send_args` gives each its keywords."""

    headers: tuple[tuple[str, str], ...] = ()
    message_id: bytes | None = None  # every message's, unless `auto_id`
    auto_id: bool = False
    ttl_ms: int | None = None
    delay_ms: int | None = None

    @classmethod
    def read(
        cls, headers: list[str], message_id: str | None, ttl: str | None, delay: str | None
    ) -> PubMeta:
        from roq.log.format import encode_meta
        from roq.log.metatext import message_id_from_text

        pairs = tuple(header(text) for text in headers)
        try:
            encode_meta(pairs)  # the bounds of limits.record_headers_*, checked once here
        except ValueError as error:
            raise BadInput(f"--header: {error}") from None
        fixed = None
        if message_id is not None and message_id != AUTO:
            try:
                fixed = message_id_from_text(message_id)
            except ValueError as error:
                raise BadInput(f"--id: {error}, or 'auto'") from None
        ttl_ms = None if ttl is None else duration_ms(ttl, "--ttl", limits.message_ttl_ms_max)
        delay_ms = None
        if delay is not None:
            delay_ms = duration_ms(delay, "--delay", limits.message_delay_ms_max)
        if ttl_ms is not None and delay_ms is not None and delay_ms >= ttl_ms:
            raise BadInput(f"--delay {delay} is not shorter than --ttl {ttl}: every message "
                           "would expire before it is due")  # fmt: skip
        return cls(pairs, fixed, message_id == AUTO, ttl_ms, delay_ms)

    def send_args(self) -> dict[str, Any]:
        """`Publisher.send`'s meta keywords for the next message: its times from now."""
        if not (self.headers or self.message_id or self.auto_id or self.ttl_ms or self.delay_ms):
            return {}
        now_us = time.time_ns() // 1000  # the clock of the records' times (log-format §1)
        return {
            "headers": self.headers,
            "message_id": uuid.uuid4().bytes if self.auto_id else self.message_id,
            "expires_at_us": None if self.ttl_ms is None else now_us + self.ttl_ms * 1000,
            "not_before_us": None if self.delay_ms is None else now_us + self.delay_ms * 1000,
        }
