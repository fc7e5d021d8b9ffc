"""The monitor's cache of task records (monitor/tasks.py): bounded by count and by bytes, least
recently used out first, and never handing out the object it keeps."""

from __future__ import annotations

import pytest

from roq import limits
from roq.monitor.tasks import Record, TaskCache


def _record(task: str, result: bytes = b"") -> Record:
    return Record(task, "svc", state="done", result=result)


def test_the_cache_keeps_at_most_its_count_and_drops_the_least_recently_used(
    monkeypatch: pytest.MonkeyPatch,
):
    monkeypatch.setattr(limits, "task_cache_records_max", 3)
    cache = TaskCache()
    for n in range(3):
        cache.put(f"t{n}", _record(f"t{n}"), n)
    assert cache.get("t0") is not None  # used: t1 is now the oldest
    cache.put("t3", _record("t3"), 0)
    assert len(cache) == 3
    assert "t1" not in cache
    assert all(t in cache for t in ("t0", "t2", "t3"))


def test_the_cache_keeps_at_most_its_bytes(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(limits, "task_cache_bytes_max", 3 * 1024)
    cache = TaskCache()
    for n in range(10):
        cache.put(f"t{n}", _record(f"t{n}", b"x" * 1000), 0)
        assert cache.bytes <= limits.task_cache_bytes_max
    assert 1 <= len(cache) <= 3
    assert "t9" in cache
    cache.drop("t9")
    cache.clear()
    assert (len(cache), cache.bytes) == (0, 0)


def test_the_cache_hands_out_copies_so_a_change_before_its_write_is_not_seen():
    cache = TaskCache()
    kept = _record("t")
    cache.put("t", kept, 4)
    kept.state = "failed"  # the caller's object, changed after it was cached
    found = cache.get("t")
    assert found is not None and (found[0].state, found[1]) == ("done", 4)
    found[0].state = "expired"  # a request changes its copy before writing it
    again = cache.get("t")
    assert again is not None and again[0].state == "done"
