"""Assignment epochs: which monitor of a queue is the current one (docs/guarantees.md §8).

The leading GCM bumps the `epoch` of a queue's record in ZooKeeper each time it places the
queue's monitor (create, start, re-placement after a host loss); the host hands it to the
monitor and to the queue's exchanges. The monitor's replies and notices carry it as `Epoch`,
and whoever receives them keeps the highest epoch seen for the queue and refuses anything
older: a monitor that was re-placed while its host was cut off, and that acts again for a
moment, cannot steer a client or an exchange that already heard from its successor.

A message without `Epoch` (from a peer older than this field) reads as epoch 0, as a queue
record written before epochs existed does; 0 is compared like any other epoch. Only control
messages carry it: nothing is added per data-plane message.
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Callable, Mapping
from typing import Any, Final

from roq import limits
from roq.protocol.bsonmsg import field_int

log = logging.getLogger(__name__)

EPOCH: Final = "Epoch"  # the field's name in every message that carries it


def field_epoch(doc: Mapping[str, Any], *, prefix: str = "") -> int:
    """The `Epoch` of a message: absent or null (an older peer) is 0; anything but an integer
    from 0 to 2**63 - 1 is a DecodeError naming the field."""
    return field_int(doc, EPOCH, default=0, prefix=prefix)


class Verdict(enum.Enum):
    STALE = "stale"  # older than the highest seen: refuse it
    CURRENT = "current"  # the highest seen
    NEWER = "newer"  # higher than any seen before (now the highest): a newer placement exists


class EpochWatch:
    """The highest epoch one client or exchange has seen for its queue, and the refusals.

    Not thread-safe: each owner calls it from the one thread that reads its sockets."""

    def __init__(self, name: str, epoch: int = 0):
        self.name = name
        self.highest = epoch
        self.refused = 0  # stale messages refused so far
        self._logged: set[str] = set()

    def judge(self, epoch: int, source: str) -> Verdict:
        """Whether a message of `epoch` from `source` (a monitor's address, or what it was)
        may act: STALE ones are counted and logged once per source, never acted on."""
        if epoch < self.highest:
            self.refused += 1
            if source not in self._logged and len(self._logged) < (
                limits.epoch_stale_sources_logged_max
            ):
                self._logged.add(source)
                log.debug("%s: refused a message of epoch %d from %s (epoch %d is current)",
                          self.name, epoch, source, self.highest)  # fmt: skip
            return Verdict.STALE
        if epoch > self.highest:
            self.highest = epoch
            return Verdict.NEWER
        return Verdict.CURRENT

    def note(self, epoch: int) -> None:
        """An epoch learnt from the authority (the GCM's record): at least this one from now."""
        self.highest = max(self.highest, epoch)

    def heard(self, source: str, follow: Callable[[], bool], epoch: int) -> bool:
        """Whether a client may act on a reply or notice of `epoch` from its monitor at
        `source`: not if it is older than one seen (refused, counted), nor if it is newer and
        `follow` (ask the GCM where the monitor is) then finds another monitor: ask that one."""
        verdict = self.judge(epoch, source)
        if verdict is Verdict.NEWER and follow():
            return False
        return verdict is not Verdict.STALE

    def admits(self, epoch: int, source: str) -> bool:
        """`judge`, for owners that treat a newer epoch like the current one."""
        return self.judge(epoch, source) is not Verdict.STALE
