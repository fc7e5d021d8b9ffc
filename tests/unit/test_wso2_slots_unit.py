"""WSO2 MB 3.0's OVERLAPPED slot state (seed 001) has no counterpart in roq: the monitor cuts each
log's slots from a cursor that only moves forward, so whatever order, repetition or loss the
exchanges' reports come in, a log's slots never overlap and leave no gap (docs/architecture.md
§11, "WSO2's slot states in roq")."""

from __future__ import annotations

import itertools
import random

from roq.monitor.slots import Group


def _covered(group: Group, exchange: str) -> list[tuple[int, int]]:
    return sorted((s.start, s.end) for s in group.slots.values() if s.exchange == exchange)


def test_reports_repeated_late_or_lost_never_make_overlapping_slots():
    rng = random.Random(34)
    for _ in range(200):
        group = Group("g")
        cuts = sorted(rng.sample(range(1, 50_000), 40))
        reports = []
        for n in range(1, len(cuts) + 1):  # each report: End and its cuts, the last 16 again
            end = cuts[n - 1] + rng.randrange(0, 500)
            reports.append((end, cuts[max(0, n - 16) : n]))
        rng.shuffle(reports)  # late and out of order ...
        reports = [r for r in reports if rng.random() > 0.2]  # ... and some lost
        now = 0.0
        for end, seen in reports:
            now += 0.1
            group.observe("x1", end, seen, now=now, slot_s=0.5)
        ranges = _covered(group, "x1")
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges)), ranges
        assert not ranges or ranges[0][0] == 0
        assert all(start < end for start, end in ranges)
