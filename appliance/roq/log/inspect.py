"""Read-only inspection of segment files (what `roq log inspect` prints): every batch, every
corrupt span with its file and offset, gaps between segments, and a summary. Unlike recovery it
changes nothing and goes on after a bad span: it looks for the next position where a CRC-valid
batch stamped with its own offset begins, so one bad block does not hide the rest of a file. A
batch whose CRC holds but whose records do not fill it is one corrupt span of its own length
(its header is sound), and its records are counted as skipped.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from roq.errors import CorruptRecord
from roq.log import format as fmt
from roq.log.segment import SegmentCorrupt, find_next_batch, iter_file, parse_segment_name


@dataclass(frozen=True, slots=True)
class Batch:
    path: Path
    offset: int
    data: bytes
    header: fmt.BatchHeader


@dataclass(frozen=True, slots=True)
class Corrupt:
    """Bytes [offset, offset + length) of `path` hold no valid batch."""

    path: Path
    offset: int
    position: int
    length: int
    reason: str
    records: int | None = None  # records skipped, when a sound header says how many


class _TornRecords(SegmentCorrupt):
    """A batch with a sound header (its CRC holds) whose records do not fill it."""

    def __init__(self, path: Path, base: int, position: int, reason: str, header: fmt.BatchHeader):
        super().__init__(path, base + position, position, reason)
        self.header = header


@dataclass(frozen=True, slots=True)
class Gap:
    """No segment holds offsets [start, end) although later ones exist (or they overlap)."""

    directory: Path
    start: int
    end: int


Item = Batch | Corrupt | Gap


def segment_files(path: Path) -> list[list[Path]]:
    """The segment files under `path` (a segment file or a directory searched recursively),
    grouped per log directory and sorted by base offset."""
    if path.is_file():
        return [[path]]
    groups: dict[Path, list[Path]] = {}
    for file in sorted(path.rglob("*.log")):
        if parse_segment_name(file.name) is not None and file.is_file():
            groups.setdefault(file.parent, []).append(file)
    return [groups[key] for key in sorted(groups)]


def walk(path: Path) -> Iterator[Item]:
    """Every batch, corrupt span and gap under `path`, in log order."""
    for files in segment_files(path):
        expected: int | None = None
        for file in files:
            base = parse_segment_name(file.name)
            assert base is not None
            if expected is not None and base != expected:
                yield Gap(file.parent, expected, base)
            size = file.stat().st_size
            yield from walk_segment(file, base, size)
            expected = base + size


def walk_segment(path: Path, base: int, size: int) -> Iterator[Item]:
    fd = os.open(path, os.O_RDONLY)
    try:
        position = 0
        while position < size:
            try:
                for at, view, header in _batches(fd, path, base, size, position):
                    yield Batch(path, base + at, bytes(view), header)
                    position = at + header.size
                return
            except _TornRecords as error:  # its length is sound: the next batch follows it
                stop = error.position + error.header.size
                length, records = stop - error.position, error.header.count
                yield Corrupt(path, error.offset, error.position, length, error.reason, records)
                position = stop
            except SegmentCorrupt as error:
                resume = find_next_batch(fd, base, size, error.position + 1)
                stop = size if resume is None else resume
                length = stop - error.position
                yield Corrupt(path, error.offset, error.position, length, error.reason)
                position = stop
    finally:
        os.close(fd)


def _batches(
    fd: int, path: Path, base: int, size: int, start: int
) -> Iterator[tuple[int, memoryview, fmt.BatchHeader]]:
    """iter_file from `start` (a batch boundary), with each batch's records checked too."""
    for at, view, header in iter_file(fd, path, base, size, verify=True, start=start):
        try:
            fmt.check_records(view, header)
        except CorruptRecord as error:
            raise _TornRecords(path, base, at, str(error), header) from None
        yield at, view, header


@dataclass(slots=True)
class Summary:
    """Totals over what walk() found."""

    path: str
    segments: int = 0
    batches: int = 0
    records: int = 0
    total_bytes: int = 0
    producers: set[bytes] = field(default_factory=set)
    first_ts_us: int | None = None
    last_ts_us: int | None = None
    corrupt: list[Corrupt] = field(default_factory=list)
    gaps: list[Gap] = field(default_factory=list)

    @property
    def clean(self) -> bool:
        return not self.corrupt and not self.gaps

    @property
    def skipped_records(self) -> int:
        """Records in corrupt spans, as far as sound headers tell."""
        return sum(c.records or 0 for c in self.corrupt)

    def add(self, item: Item) -> None:
        if isinstance(item, Corrupt):
            self.corrupt.append(item)
        elif isinstance(item, Gap):
            self.gaps.append(item)
        else:
            self._add_batch(item)

    def _add_batch(self, item: Batch) -> None:
        header = item.header
        self.batches += 1
        self.records += header.count
        self.total_bytes += header.size
        self.producers.add(header.producer_id)
        last = max(record.timestamp_us for record in fmt.iter_records(item.data))
        first = header.first_ts_us
        self.first_ts_us = first if self.first_ts_us is None else min(self.first_ts_us, first)
        self.last_ts_us = last if self.last_ts_us is None else max(self.last_ts_us, last)

    def to_dict(self) -> dict[str, Any]:
        return {
            "path": self.path,
            "clean": self.clean,
            "segments": self.segments,
            "batches": self.batches,
            "records": self.records,
            "bytes": self.total_bytes,
            "producers": len(self.producers),
            "first_ts_us": self.first_ts_us,
            "last_ts_us": self.last_ts_us,
            "skipped_records": self.skipped_records,
            "corrupt": [
                {
                    "file": str(c.path),
                    "offset": c.offset,
                    "position": c.position,
                    "bytes": c.length,
                    "reason": c.reason,
                    "records": c.records,
                }
                for c in self.corrupt
            ],
            "gaps": [
                {"directory": str(g.directory), "start": g.start, "end": g.end} for g in self.gaps
            ],
        }
