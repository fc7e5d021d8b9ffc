"""A record as a reader sees it (`Record`) and its decoded meta: in a module of their own so that
the compiled loops (`roq.log._native`) build them without importing format.py."""

from __future__ import annotations

from typing import NamedTuple

Headers = tuple[tuple[str, bytes], ...]


class RecordMeta(NamedTuple):
    """A v2 record's meta section, decoded (docs/log-format.md §1). The log carries the times;
    the reading clients enforce them (client/timing.py)."""

    message_id: bytes | None = None  # 16 bytes the publisher chose; None: (producer, seq)
    expires_at_us: int | None = None  # µs since the Unix epoch, the publisher's wall clock
    not_before_us: int | None = None
    headers: Headers = ()  # (name, value) in the publisher's order; names may repeat


class Record(NamedTuple):
    """One message as a reader sees it. A named tuple: immutable, and built 3x faster than a
    frozen dataclass, which is most of a subscriber's per-message cost. A v1 record, or a v2 one
    without meta, has `meta` None: the properties below then answer empty."""

    offset: int  # base offset of the batch that holds it (the thesis: its byte position)
    producer_id: bytes
    seq: int
    timestamp_us: int
    key: bytes
    payload: bytes
    meta: RecordMeta | None = None

    @property
    def headers(self) -> Headers:
        return () if self.meta is None else self.meta.headers

    @property
    def message_id(self) -> bytes | None:
        """The publisher's id, or None: the message is then identified by (producer_id, seq)."""
        return None if self.meta is None else self.meta.message_id

    @property
    def expires_at_us(self) -> int | None:
        return None if self.meta is None else self.meta.expires_at_us

    @property
    def not_before_us(self) -> int | None:
        return None if self.meta is None else self.meta.not_before_us

    def header(self, name: str) -> bytes | None:
        """The value of the first header called `name`, or None."""
        for found, value in self.headers:
            if found == name:
                return value
        return None
