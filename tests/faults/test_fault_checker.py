"""The fault-history checker on hand-made histories: each anomaly it must report, and a clean
history it must pass. These need no namespaces (no `faults` marker)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from checker import check, load


def _publish(producer: str, seq: int, t: float, outcome: str = "ok", key: str = "a") -> list[Any]:
    base = {"producer": producer, "worker": producer.split(".")[0], "seq": seq, "key": key}
    return [{**base, "type": "invoke", "time": t}, {**base, "type": outcome, "time": t + 0.01}]


def _read(producer: str, seq: int, t: float, reader: str = "final", key: str = "a") -> Any:
    return {"type": "read", "reader": reader, "producer": producer, "seq": seq, "key": key,
            "time": t}  # fmt: skip


def _clean() -> list[Any]:
    events: list[Any] = []
    for seq in range(5):
        events += _publish("p1.0", seq, float(seq))
        events.append(_read("p1.0", seq, 10.0 + seq))
    return events


def test_a_clean_history_passes() -> None:
    report = check(sorted(_clean(), key=lambda e: e["time"]))
    assert report.safe, report.summary()
    assert report.counts["ok"] == 5 and report.counts["read"] == 5


def test_an_acknowledged_message_missing_from_the_final_read_is_reported() -> None:
    events = [e for e in _clean() if not (e["type"] == "read" and e["seq"] == 3)]
    report = check(sorted(events, key=lambda e: e["time"]))
    assert report.acked_missing == [("p1.0", 3)]
    assert not report.safe


def test_unknown_and_failed_publishes_may_be_missing() -> None:
    events = _clean() + _publish("p1.0", 5, 6.0, "unknown") + _publish("p1.0", 6, 7.0, "fail")
    report = check(sorted(events, key=lambda e: e["time"]))
    assert report.safe, report.summary()


def test_a_message_read_only_by_a_live_reader_is_still_missing() -> None:
    events = _clean() + _publish("p1.0", 5, 6.0) + [_read("p1.0", 5, 6.5, reader="live")]
    report = check(sorted(events, key=lambda e: e["time"]))
    assert report.acked_missing == [("p1.0", 5)]


def test_an_order_violation_within_a_stream_is_reported() -> None:
    events = _clean()
    events[-1]["time"], events[-4]["time"] = events[-4]["time"], events[-1]["time"]
    report = check(sorted(events, key=lambda e: e["time"]))
    assert len(report.order_violations) == 1
    assert "('p1.0', 3)" in report.order_violations[0], report.order_violations


def test_streams_of_different_keys_or_readers_are_not_ordered_together() -> None:
    events = _publish("p1.0", 0, 0.0, key="a") + _publish("p1.0", 1, 1.0, key="b")
    events += [_read("p1.0", 1, 5.0, key="b"), _read("p1.0", 0, 6.0, key="a")]
    events += [_read("p1.0", 1, 7.0, reader="live", key="b")]
    report = check(sorted(events, key=lambda e: e["time"]))
    assert report.safe, report.summary()


def test_a_duplicate_delivery_is_reported_per_reader() -> None:
    events = [*_clean(), _read("p1.0", 2, 20.0)]
    report = check(sorted(events, key=lambda e: e["time"]))
    assert report.duplicates == ["final read ('p1.0', 2) again"]
    # the duplicate is also out of order (seq 2 after seq 4): both are reported
    assert len(report.order_violations) == 1


def test_a_message_never_sent_is_reported() -> None:
    events = [*_clean(), _read("p9.0", 0, 20.0)]
    events.append({"type": "read", "reader": "final", "raw": "garbage", "time": 21.0})
    report = check(sorted(events, key=lambda e: e["time"]))
    assert report.never_sent == ["final read ('p9.0', 0)", "final read 'garbage'"]


def _steady(worker: str, start: float, end: float, step: float, skip: tuple[float, float]) -> Any:
    events, seq, t = [], 0, start
    while t < end:
        if not skip[0] <= t < skip[1]:
            events += _publish(f"{worker}.0", seq, t)
            seq += 1
        t += step
    return events


def test_availability_is_the_longest_gap_of_the_worst_worker_per_fault() -> None:
    events = _steady("p1", 0.0, 30.0, 0.5, (10.0, 16.0)) + _steady("p2", 0.0, 30.0, 0.5, (0, 0))
    events += [
        {"type": "nemesis", "name": "kill", "phase": "start", "time": 10.0},
        {"type": "nemesis", "name": "kill", "phase": "heal", "time": 12.0},
        {"type": "nemesis", "name": "cut", "phase": "start", "time": 20.0, "from_heal": True},
        {"type": "nemesis", "name": "cut", "phase": "heal", "time": 25.0},
        {"type": "phase", "name": "stop", "time": 30.0},
    ]
    report = check(sorted(events, key=lambda e: e["time"]))
    kill, cut = report.faults
    # p1's first ok after 10.0 completes at 16.01: a 6 s gap counted from the fault
    assert kill.longest_gap_s == pytest.approx(6.01)
    assert kill.resume_s == pytest.approx(6.01)
    assert kill.end == 20.0
    assert cut.longest_gap_s == pytest.approx(0.5) == cut.resume_s


def test_a_worker_that_never_resumes_is_unavailable_until_the_stop() -> None:
    events = _steady("p1", 0.0, 10.0, 0.5, (5.0, 99.0))
    events += [
        {"type": "nemesis", "name": "kill", "phase": "start", "time": 5.0},
        {"type": "phase", "name": "stop", "time": 40.0},
    ]
    (kill,) = check(sorted(events, key=lambda e: e["time"])).faults
    assert kill.longest_gap_s == pytest.approx(35.0)


def test_load_merges_files_by_time_and_skips_a_torn_line(tmp_path: Path) -> None:
    one, two = tmp_path / "one.jsonl", tmp_path / "two.jsonl"
    one.write_text(json.dumps({"type": "phase", "name": "stop", "time": 3}) + '\n{"type": ')
    two.write_text(json.dumps({"type": "nemesis", "name": "x", "phase": "start", "time": 1}))
    assert [e["time"] for e in load(one, two)] == [1, 3]
