"""Where an exchange's log is cut into work-queue slots (monitor/slots.py), as its reports say.

The exchange cuts its log every `work.slot.messages` messages (one call per slot, never per
message) and each heartbeat report carries the cuts made since the previous report, after the
last few reported already (repeated: a lost report loses no cut). A burst between two reports
never drops a cut: dropping the oldest made the monitor cut one giant slot that a single
consumer then held while the others idled (issue 19, the 4-consumer share test). Past the
report's bound, repeats of reported cuts go first; then the new ones are thinned evenly (every
other one merged: slots twice as large, all alike).
"""

from __future__ import annotations

from roq import limits


class SlotCuts:
    def __init__(self) -> None:
        self.cuts: list[int] = []
        self._told = 0  # how many of `cuts` (the oldest) went in a report already

    def add(self, offset: int) -> None:
        cuts = self.cuts
        cuts.append(offset)
        if len(cuts) <= limits.work_cuts_reported_max:
            return
        if self._told:
            del cuts[0]
            self._told -= 1
        else:
            cuts[:] = cuts[::-1][::2][::-1]  # keeps the newest: the open slot starts there

    def report(self) -> tuple[int, ...]:
        """The cuts for this report; afterwards only the last few are repeated."""
        out = tuple(self.cuts)
        del self.cuts[: -limits.work_cuts_repeated]
        self._told = len(self.cuts)
        return out
