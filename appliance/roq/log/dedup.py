"""A de-duplication window of message ids (issue 33, item 2; NATS JetStream's duplicate_window).

An id is remembered from the first time it is `add`ed for `window_ms` (by the caller's clock,
milliseconds), never refreshed by a duplicate: a message sent again every minute with a
two-minute window is a duplicate once, then new again. Ids are kept as Python ints (a 16-byte
id is a 128-bit int: 8 bytes a set entry less than the bytes object, benchmarks/dedup_window.py)
in one set for lookups, and in time buckets of `limits.dedup_bucket_ms` for expiry, so expiry
costs one deque pop per bucket, not a scan.

Bounded: at most `ids_max` ids (`limits.dedup_window_ids_max`). Past it the oldest bucket is
forgotten before its time, and its ids counted in `forgotten_early`: an id forgotten so is
taken as new if it comes again, so the bound trades a missed duplicate for memory, never a
message for one.

The buckets, the expiry and the bound are `ExpiringIds`, shared with the monitor's window of a
consumer group (monitor/groupids.py, id → place); each keeps its ids in its own store (here a
set: a dict would hold 8 bytes an id more, for values it does not have).

Pure and single-threaded: its owner's loop calls it (the exchange's, the monitor's).
"""

from __future__ import annotations

import abc
import collections
from collections.abc import Iterable

from roq import limits


class ExpiringIds(abc.ABC):
    """Ids (ints) taken within the last `window_ms`, listed in buckets of `bucket_ms` by the
    time each was taken, at most `ids_max`. A subclass looks them up in its own store (`len`
    is its size) and forgets there what `_forget` is given."""

    shortest_ms = 0  # the shortest window_ms taken (0: off, the subclass's to mean)

    def __init__(self, window_ms: int, ids_max: int, bucket_ms: int):
        if window_ms < self.shortest_ms or ids_max < 1 or bucket_ms < 1:
            raise ValueError(f"window of {window_ms} ms, {ids_max} ids, {bucket_ms} ms buckets")
        self.window_ms, self.ids_max, self.bucket_ms = window_ms, ids_max, bucket_ms
        # (bucket start, its ids) oldest first; the last one is the one being filled
        self._buckets: collections.deque[tuple[int, list[int]]] = collections.deque()
        self.forgotten_early = 0  # ids dropped by the bound before their window ended

    @abc.abstractmethod
    def __len__(self) -> int: ...

    @abc.abstractmethod
    def _forget(self, keys: list[int]) -> None:
        """Drop `keys` from the store (each is in it)."""

    def expire(self, now_ms: int) -> None:
        """Forget the buckets whose every id is older than the window."""
        buckets, cutoff = self._buckets, now_ms - self.window_ms
        while buckets and buckets[0][0] + self.bucket_ms <= cutoff:
            self._forget(buckets.popleft()[1])

    def _taken(self, keys: Iterable[int], at_ms: int) -> None:
        """List `keys`, new in the store, as taken at `at_ms` (an older time, read back, joins
        the newest bucket); past the bound, forget the oldest."""
        start = at_ms - at_ms % self.bucket_ms
        if not self._buckets or self._buckets[-1][0] < start:
            self._buckets.append((start, []))
        self._buckets[-1][1].extend(keys)
        while len(self) > self.ids_max:
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        """Over the bound: the oldest bucket goes whole; the only one left loses its older half
        (a burst larger than the bound keeps its latest ids, at a cost shared by many adds)."""
        if len(self._buckets) > 1:
            gone = self._buckets.popleft()[1]
        else:
            bucket = self._buckets[-1][1]
            gone = bucket[: len(bucket) // 2 or 1]
            del bucket[: len(gone)]
        self._forget(gone)
        self.forgotten_early += len(gone)


def _keys(message_ids: Iterable[bytes]) -> set[int]:
    return {int.from_bytes(message_id, "little") for message_id in message_ids}


def _ordered_keys(message_ids: Iterable[bytes]) -> list[int]:
    return [int.from_bytes(message_id, "little") for message_id in message_ids]


class IdWindow(ExpiringIds):
    """Message ids seen within the last `window_ms` (0: off, every id is new)."""

    def __init__(
        self,
        window_ms: int,
        ids_max: int = limits.dedup_window_ids_max,
        bucket_ms: int = limits.dedup_bucket_ms,
    ):
        super().__init__(window_ms, ids_max, bucket_ms)
        self._ids: set[int] = set()
        self.duplicates = 0  # counted by the owner: what it did not take again (records, …)

    @property
    def enabled(self) -> bool:
        return self.window_ms > 0

    def __len__(self) -> int:
        return len(self._ids)

    def seen(self, message_id: bytes, now_ms: int) -> bool:
        """Whether `message_id` was added within the window (expired buckets go first)."""
        self.expire(now_ms)
        return int.from_bytes(message_id, "little") in self._ids

    def add(self, message_id: bytes, now_ms: int) -> bool:
        """Remember `message_id` from `now_ms`; False if it was already in the window (its
        first time stays its time)."""
        if not self.window_ms:
            return True
        self.expire(now_ms)
        key = int.from_bytes(message_id, "little")
        if key in self._ids:
            return False
        self._ids.add(key)
        self._taken((key,), now_ms)
        return True

    def all_seen(self, message_ids: Iterable[bytes], now_ms: int) -> bool:
        """Whether every one of `message_ids` is in the window (one set operation in C)."""
        self.expire(now_ms)
        return self._ids.issuperset(_keys(message_ids))

    def add_all(self, message_ids: Iterable[bytes], now_ms: int) -> int:
        """`add` each, in bulk (set operations in C, not a call per id); how many were new."""
        if not self.window_ms:
            return 0
        self.expire(now_ms)
        seen = self._ids  # in order, once each: past the bound the latest are kept
        fresh = [key for key in dict.fromkeys(_ordered_keys(message_ids)) if key not in seen]
        if fresh:
            self._ids.update(fresh)
            self._taken(fresh, now_ms)
        return len(fresh)

    def _forget(self, keys: list[int]) -> None:
        self._ids.difference_update(keys)
