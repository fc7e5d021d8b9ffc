"""Checks a fault run's history. Imports nothing from roq, so a bug in roq cannot hide itself
from the check (Jepsen's rule: the checker trusts only what the clients wrote down).

The history is JSON lines, one event each, in any order (several writers; sorted by time here):
- `{"type": "invoke"|"ok"|"fail"|"unknown", "producer": P, "worker": W, "seq": N, "key": K,
  "time": T}`: a publish of message (P, N). `ok` means acknowledged (flush returned), `fail`
  means refused, `unknown` means the outcome is not known (a timed-out flush). P names one
  publisher object; W names the workload thread that owns it (a thread that had to make a new
  publisher keeps W and takes a new P), so availability is per W.
- `{"type": "read", "reader": R, "producer": P, "seq": N, "key": K, "time": T}`: a subscriber R
  was delivered (P, N). A payload that names no message is a read with `"raw"` instead.
- `{"type": "nemesis", "name": F, "phase": "start"|"heal", "time": T, "from_heal": bool}`:
  a fault began or ended (`from_heal`: publishing need only resume after the heal).
- `{"type": "phase", "name": "stop", "time": T}`: the producers stopped.

Order: roq promises order per stream (one publisher, one routing key), so an order violation is
a message of (P, K) read after a later sequence number of (P, K) by the same reader.
Duplicates: a message a reader was delivered more than once (subscribers dedupe by sequence
number; what gets past that counts). Acknowledged missing: an `ok` message absent from the
final reader's reads. Never sent: a read of a message no producer invoked.
"""

from __future__ import annotations

import itertools
import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Message = tuple[str, int]  # (producer, seq)
OUTCOMES = ("ok", "fail", "unknown")


@dataclass
class FaultWindow:
    name: str
    start: float
    heal: float
    end: float  # the next fault's start, or the stop of the producers
    from_heal: bool
    longest_gap_s: float = 0.0  # longest span in the window without an ok, any worker
    resume_s: float = 0.0  # the worst worker: how long after the fault (or heal) it resumed


@dataclass
class Report:
    counts: dict[str, int] = field(default_factory=dict)
    acked_missing: list[Message] = field(default_factory=list)
    order_violations: list[str] = field(default_factory=list)
    duplicates: list[str] = field(default_factory=list)
    never_sent: list[str] = field(default_factory=list)
    faults: list[FaultWindow] = field(default_factory=list)

    @property
    def safe(self) -> bool:
        return not (
            self.acked_missing or self.order_violations or self.duplicates or self.never_sent
        )

    def summary(self) -> str:
        lines = [f"counts: {self.counts}"]
        for label, items in (
            ("acknowledged missing", self.acked_missing),
            ("order violations", self.order_violations),
            ("duplicates", self.duplicates),
            ("never sent", self.never_sent),
        ):
            shown = ", ".join(str(item) for item in items[:10])
            lines.append(f"{label}: {len(items)}" + (f" (first: {shown})" if items else ""))
        for fault in self.faults:
            lines.append(
                f"fault {fault.name}: longest gap {fault.longest_gap_s:.2f} s, "
                f"resumed {fault.resume_s:.2f} s after its "
                f"{'heal' if fault.from_heal else 'start'}"
            )
        return "\n".join(lines)


def load(*paths: Path) -> list[dict[str, Any]]:
    """Every event of the given JSON-lines files, by time. A torn last line (a writer killed
    mid-write) is skipped."""
    events = []
    for path in paths:
        for line in path.read_text().splitlines():
            try:
                event = json.loads(line)
            except ValueError:
                continue
            if isinstance(event, dict) and isinstance(event.get("time"), int | float):
                events.append(event)
    events.sort(key=lambda event: float(event["time"]))
    return events


def check(events: list[dict[str, Any]], final_reader: str = "final") -> Report:
    """The report over a time-sorted history (see `load`)."""
    report = Report()
    invoked: set[Message] = set()
    acked: set[Message] = set()
    kinds: Counter[str] = Counter()
    for event in events:
        kind = str(event.get("type"))
        kinds[kind] += 1
        if kind == "invoke":
            invoked.add(_message(event))
        elif kind == "ok":
            acked.add(_message(event))
    report.counts = dict(kinds)
    reads = [event for event in events if event.get("type") == "read"]
    _check_reads(reads, invoked, report)
    final = {_message(e) for e in reads if e.get("reader") == final_reader and "raw" not in e}
    report.acked_missing = sorted(acked - final)
    report.faults = availability(events)
    return report


def _message(event: dict[str, Any]) -> Message:
    return (str(event.get("producer")), int(event.get("seq", -1)))


def _check_reads(reads: Iterable[dict[str, Any]], invoked: set[Message], report: Report) -> None:
    seen: dict[str, set[Message]] = defaultdict(set)
    last: dict[tuple[str, str, str], int] = {}
    for event in reads:
        reader = str(event.get("reader"))
        if "raw" in event:
            report.never_sent.append(f"{reader} read {event['raw']!r}")
            continue
        message = _message(event)
        if message not in invoked:
            report.never_sent.append(f"{reader} read {message}")
        if message in seen[reader]:
            report.duplicates.append(f"{reader} read {message} again")
        seen[reader].add(message)
        stream = (reader, message[0], str(event.get("key")))
        if stream in last and message[1] <= last[stream]:
            report.order_violations.append(
                f"{reader} read {message} (key {stream[2]}) after seq {last[stream]}"
            )
        last[stream] = max(message[1], last.get(stream, -1))


def availability(events: list[dict[str, Any]]) -> list[FaultWindow]:
    """Per fault, the longest span without an acknowledged publish, and how long after the
    fault (or its heal) every worker had an acknowledged publish again."""
    windows = _windows(events)
    oks: dict[str, list[float]] = defaultdict(list)
    for event in events:
        if event.get("type") == "ok":
            oks[str(event.get("worker", event.get("producer")))].append(float(event["time"]))
    for window in windows:
        reference = window.heal if window.from_heal else window.start
        for times in oks.values():
            if not times or times[0] > window.start:
                continue  # a worker that began after the fault says nothing about it
            points = [window.start, *(t for t in times if window.start < t <= window.end)]
            points.append(window.end)  # a worker that never resumed: its gap runs to the end
            for before, after in itertools.pairwise(points):
                window.longest_gap_s = max(window.longest_gap_s, after - before)
                window.resume_s = max(window.resume_s, after - max(before, reference))
    return windows


def _windows(events: list[dict[str, Any]]) -> list[FaultWindow]:
    starts = [e for e in events if e.get("type") == "nemesis" and e.get("phase") == "start"]
    heals = [e for e in events if e.get("type") == "nemesis" and e.get("phase") == "heal"]
    stops = [float(e["time"]) for e in events if e.get("type") == "phase" and e["name"] == "stop"]
    end_of_run = stops[0] if stops else float(events[-1]["time"]) if events else 0.0
    windows = []
    for index, start in enumerate(starts):
        at = float(start["time"])
        heal = next(
            (float(h["time"]) for h in heals if h.get("name") == start["name"] and h["time"] >= at),
            at,
        )
        following = [float(s["time"]) for s in starts[index + 1 :]]
        end = max(min([*following, end_of_run]), heal)
        windows.append(
            FaultWindow(str(start["name"]), at, heal, end, bool(start.get("from_heal", False)))
        )
    return windows
