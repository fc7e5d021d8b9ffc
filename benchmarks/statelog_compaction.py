"""The longest pause a state log's compaction causes its owner's loop, whole against sliced.

A state log of N keys (60 B values, each key written twice, so half the log is superseded) is
compacted with `compact()` (one call, as before 26 Nov) and then, on a fresh log, with
`maybe_compact()` once per turn (`limits.state_compact_keys_per_turn` keys a turn), an append
between turns as the monitor's loop would make. Prints the turns, the longest and the total.

    PYTHONPATH=appliance .venv/bin/python benchmarks/statelog_compaction.py 300000
"""

from __future__ import annotations

import sys
import tempfile
import time

from roq.log import FlushPolicy, LogSettings
from roq.log.statelog import Change, StateLog

SETTINGS = LogSettings(flush=FlushPolicy("os"), memory_bytes=0)


def _filled(directory: str, keys: int) -> StateLog:
    state = StateLog.open(directory, SETTINGS, bytes(16))
    for value in (b"x" * 60, b"y" * 60):
        for start in range(0, keys, 1000):
            names = range(start, min(start + 1000, keys))
            state.append([Change(f"http/t{i:07d}", value) for i in names])
    return state


def _pauses(state: StateLog, whole: bool) -> list[float]:
    if whole:
        started = time.perf_counter()
        state.compact()
        return [time.perf_counter() - started]
    pauses = []
    while True:
        started = time.perf_counter()
        done = state.maybe_compact()
        pauses.append(time.perf_counter() - started)
        state.append([Change("http/tick", b"z")])  # the loop's own work between turns
        if done:
            return pauses


def main() -> None:
    keys = int(sys.argv[1]) if len(sys.argv) > 1 else 300_000
    for mode in ("whole", "sliced"):
        with tempfile.TemporaryDirectory() as directory, _filled(directory, keys) as state:
            pauses = _pauses(state, whole=mode == "whole")
        print(f"{mode}: {keys} keys, {len(pauses)} turns, longest pause "
              f"{max(pauses) * 1000:.0f} ms, in all {sum(pauses):.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
