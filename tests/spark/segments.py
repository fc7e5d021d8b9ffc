"""Writes log segments the way an exchange does (record batches stamped with their byte offset),
for the analytics tests. Returns what it wrote so tests can check the job's tables exactly."""

from __future__ import annotations

import uuid
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from roq.log import format as fmt


@dataclass
class Written:
    messages: Counter[tuple[str, str]] = field(default_factory=Counter)  # (queue, producer hex)
    payload_bytes: Counter[tuple[str, str]] = field(default_factory=Counter)
    batch_positions: list[tuple[Path, int, int, int]] = field(default_factory=list)  # +size,count


def producer_id(name: str) -> bytes:
    return uuid.uuid5(uuid.NAMESPACE_DNS, name).bytes


class SegmentWriter:
    """Appends batches to `<root>/<queue>/<exchange>/`, rolling segments past `segment_bytes`."""

    def __init__(self, root: Path, queue: str, exchange: str, segment_bytes: int, out: Written):
        self.dir = root / queue / exchange
        self.dir.mkdir(parents=True, exist_ok=True)
        self.queue = queue
        self.segment_bytes = segment_bytes
        self.base = 0
        self.size = 0
        self.out = out

    def append(
        self,
        producer: bytes,
        first_seq: int,
        payloads: list[bytes],
        ts: list[int],
        metas: list[bytes] | None = None,  # log format v2: one meta per payload
    ) -> None:
        batch = bytearray(fmt.encode_batch(producer, first_seq, b"key", payloads, ts, metas))
        if self.size and self.size + len(batch) > self.segment_bytes:
            self.base, self.size = self.base + self.size, 0
        fmt.stamp_offset(batch, self.base + self.size)
        path = self.dir / f"{self.base:020d}.log"
        with open(path, "ab") as f:
            f.write(batch)
        self.out.batch_positions.append((path, self.size, len(batch), len(payloads)))
        self.size += len(batch)
        key = (self.queue, producer.hex())
        self.out.messages[key] += len(payloads)
        self.out.payload_bytes[key] += sum(len(p) for p in payloads)
