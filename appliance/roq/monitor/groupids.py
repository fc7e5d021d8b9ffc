"""A consumer group's de-duplication window by message id (issue 33, item 2; docs/guarantees.md,
"De-duplication by message id").

The exchanges' windows (log/dedup.py) keep a re-sent batch out of a log that holds it or its copy;
a batch re-sent to an exchange with no copy (its first exchange died before confirming it, and
the publisher moved) is appended there, so the same message sits in two logs, and the group reads
both. Here each id the group's consumers read is kept with the *place* of its copy: (exchange,
start of its slot's range, key part (-1 but in a key-ordered group), index in the range's, or
the part's, records). A copy of the id at another place within the
window is a duplicate: settled without being handed out (`Group.drop_duplicates`). The same place
seen again (its slot read again after a lease expired, by another consumer, or a part of a split
slot) is the same message, not a duplicate: so a redelivery is never taken for one.

An id is remembered from the first time a consumer names it (when it read the slot, before it
handed anything of it out) for `window_ms` by the monitor's wall clock, never refreshed by a
duplicate; it expires in steps of `limits.dedup_bucket_ms`, as the exchange's. Bounded at
`ids_max` ids (`limits.work_dedup_ids_max`): past it the oldest bucket is forgotten before its
time and counted in `forgotten_early` (a copy of a forgotten id is handed out again: a missed
duplicate, never a lost message). The buckets, expiry and bound are the exchange's window's
(log/dedup.py `ExpiringIds`); the places are this window's own.

What it took since the last save is `unsaved` (id hex, exchange, start, part, index, wall ms): the
group manager appends it to the monitor's state log, from which a restarted or re-placed monitor
rebuilds the window (`restore`). Pure and single-threaded: the monitor's loop calls it.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable
from typing import Any

from roq import limits
from roq.log.dedup import ExpiringIds

Place = tuple[str, int, int, int]  # exchange, start of the slot's range, key part, index
Entry = tuple[str, str, int, int, int, int]  # id (hex), exchange, start, part, index, wall ms


class GroupIds(ExpiringIds):
    """The ids a group's consumers read within the last `window_ms`, with their places."""

    shortest_ms = 1  # never off: without a window the manager keeps none

    def __init__(
        self,
        window_ms: int,
        ids_max: int = limits.work_dedup_ids_max,
        bucket_ms: int = limits.dedup_bucket_ms,
    ):
        super().__init__(window_ms, ids_max, bucket_ms)
        self._places: dict[int, Place] = {}
        self.unsaved: list[Entry] = []  # taken since the manager last saved them
        self.records: collections.deque[tuple[int, int]] = collections.deque()  # saved: (n, ms)
        self.next_record = 0

    def __len__(self) -> int:
        return len(self._places)

    def check(self, where: tuple[str, int, int], entries: Iterable[tuple[int, bytes]],
              now_ms: int) -> list[int]:  # fmt: skip
        """Take each (index, id) of the slot `where` (exchange, start, part); the indices whose
        id the window holds at another place (duplicates, in the order given)."""
        exchange, start, part = where
        self.expire(now_ms)
        places, duplicates = self._places, []
        for index, message_id in entries:
            key = int.from_bytes(message_id, "little")
            place = places.get(key)
            if place is None:
                self._add(key, (exchange, start, part, index), now_ms)
                self.unsaved.append((message_id.hex(), exchange, start, part, index, now_ms))
            elif place != (exchange, start, part, index):
                duplicates.append(index)
        return duplicates

    def restore(self, entries: Iterable[Any], now_ms: int) -> int:
        """Entries read back from the state log (oldest first, each as `unsaved` holds it, in
        a list): those still in the window are taken with their own times; one that is not
        an entry is skipped (its duplicate is missed, never a message lost). How many were."""
        taken = 0
        for entry in entries:
            found = _entry(entry)
            if found is None or found[-1] + self.window_ms <= now_ms:
                continue
            key, place, at_ms = found
            if key not in self._places:
                self._add(key, place, at_ms)
                taken += 1
        self.expire(now_ms)
        return taken

    def _add(self, key: int, place: Place, at_ms: int) -> None:
        self._places[key] = place
        self._taken((key,), at_ms)

    def _forget(self, keys: list[int]) -> None:
        for key in keys:
            del self._places[key]


def _entry(entry: Any) -> tuple[int, Place, int] | None:
    """A saved entry [id hex, exchange, start, part, index, ms] as (key, place, ms); None if it
    is not one."""
    if not isinstance(entry, list) or len(entry) != 6:
        return None
    hex_id, exchange, start, part, index, at_ms = entry
    if not (isinstance(hex_id, str) and len(hex_id) == 32 and isinstance(exchange, str)):
        return None
    numbers = (start, part, index, at_ms)
    if not all(isinstance(n, int) and not isinstance(n, bool) for n in numbers):
        return None
    try:
        key = int.from_bytes(bytes.fromhex(hex_id), "little")
        return key, (exchange, start, part, index), at_ms
    except ValueError:
        return None
