"""The memory log (thesis §2.2, §4.2): a bounded ring of the most recent batches with their
offsets, so that subscribers replaying the tail are served without a disk read.

The ring holds the same stamped bytes that were written to the segment, so a read served from
memory returns exactly what the same read from disk returns. Owned by one thread (the exchange's
main thread), like the Log that holds it.
"""

from __future__ import annotations

from bisect import bisect_left


class MemoryLog:
    """Recent batches, oldest first, using at most `bytes_max` bytes of batch data (0 disables
    it). A batch larger than the bound is not kept."""

    def __init__(self, bytes_max: int):
        assert bytes_max >= 0
        self.bytes_max = bytes_max
        self.bytes = 0
        self._offsets: list[int] = []
        self._batches: list[bytes | bytearray] = []
        self._head = 0  # entries before it are evicted; compacted when it passes half the list

    def __len__(self) -> int:
        return len(self._offsets) - self._head

    @property
    def start_offset(self) -> int | None:
        """Offset of the oldest batch held, None if empty."""
        return self._offsets[self._head] if len(self) else None

    def append(self, offset: int, batch: bytes | bytearray) -> None:
        """Keep `batch` (not copied: the caller never changes it afterwards) at `offset`, which
        must follow the last batch held."""
        if len(self):
            assert offset == self._offsets[-1] + len(self._batches[-1]), offset
        if len(batch) > self.bytes_max:
            self.clear()
            return
        self._offsets.append(offset)
        self._batches.append(batch)
        self.bytes += len(batch)
        while self.bytes > self.bytes_max:
            self._pop()

    def _pop(self) -> None:
        self.bytes -= len(self._batches[self._head])
        self._batches[self._head] = b""
        self._head += 1
        if self._head * 2 > len(self._offsets):
            del self._offsets[: self._head]
            del self._batches[: self._head]
            self._head = 0

    def drop_before(self, offset: int) -> None:
        """Forget batches below `offset` (retention moved the log's start)."""
        while len(self) and self._offsets[self._head] < offset:
            self._pop()

    def drop_from(self, offset: int) -> None:
        """Forget batches at or after `offset` (the log was truncated there)."""
        index = bisect_left(self._offsets, offset, self._head)
        for batch in self._batches[index:]:
            self.bytes -= len(batch)
        del self._offsets[index:]
        del self._batches[index:]

    def clear(self) -> None:
        self._offsets.clear()
        self._batches.clear()
        self._head = 0
        self.bytes = 0

    def read(self, offset: int, max_bytes: int) -> bytes | None:
        """Whole batches from `offset`, as many as fit in `max_bytes` but at least one; None if
        `offset` is not the offset of a batch held here (the caller reads the disk instead)."""
        index = bisect_left(self._offsets, offset, self._head)
        if index == len(self._offsets) or self._offsets[index] != offset:
            return None
        first = self._batches[index]
        total = len(first)
        end = index + 1
        while end < len(self._batches) and total + len(self._batches[end]) <= max_bytes:
            total += len(self._batches[end])
            end += 1
        if end == index + 1:
            return bytes(first)
        return b"".join(self._batches[index:end])
