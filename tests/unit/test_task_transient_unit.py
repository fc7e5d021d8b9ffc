"""`request.transient.ms` (JLupin's howLongTaskStatusWillBeInATransientStateInMillis): a task left
`accepted` without its message ends `expired` then, not after `request.input.ttl.ms` (5 min);
and `request.gc.period.ms` (waitTimeBetweenCheckingTaskByGarbageManagerInMillis)."""

from __future__ import annotations

import time

from test_monitor_requests import _TaskStore

from roq import config
from roq.config.components import RequestSettings
from roq.monitor.tasks import Record, TaskManager


def _manager(**values: str) -> TaskManager:
    settings = config.MonitorSettings.from_settings(config.load_hcm(None, values))
    return TaskManager("q1", settings, None, lambda *_: 1, store=_TaskStore())  # type: ignore[arg-type]


def test_an_accepted_task_never_started_expires_after_the_transient_bound():
    tasks = _manager(**{"request.transient.ms": "2000"})
    record = Record("t1", "svc", accepted_ms=0, changed_ms=0)
    assert not tasks._apply_deadlines(record, 2000)  # at the bound: not yet
    assert tasks._apply_deadlines(record, 2001)
    assert record.state == "expired"
    assert "howLongTaskStatusWillBeInATransientStateInMillis" in record.error


def test_the_bound_counts_from_the_last_retry_and_spares_a_started_task():
    tasks = _manager(**{"request.transient.ms": "2000"})
    retried = Record("t1", "svc", accepted_ms=0, changed_ms=5000)  # accepted again at 5 s
    assert not tasks._apply_deadlines(retried, 6000) and retried.state == "accepted"
    started = Record("t2", "svc", state="in_progress", accepted_ms=0, changed_ms=0)
    assert not tasks._apply_deadlines(started, 60_000) and started.state == "in_progress"


def test_off_by_default_the_input_ttl_alone_ends_it():
    tasks = _manager()
    record = Record("t1", "svc", accepted_ms=0, changed_ms=0)
    assert not tasks._apply_deadlines(record, 299_000)
    assert tasks._apply_deadlines(record, 300_001) and "InputShouldBeOnQueue" in record.error


def test_it_is_a_per_queue_request_setting():
    defaults = RequestSettings.from_settings(config.load_hcm(None))
    assert defaults.as_text()["request.transient.ms"] == "0"
    changed = defaults.overridden({"request.transient.ms": "1500"}, "roq task config")
    assert changed.transient_s == 1.5


def test_the_collectors_period_is_request_gc_period_ms():
    """JLupin's waitTimeBetweenCheckingTaskByGarbageManagerInMillis: a key, not a constant."""
    tasks = _manager(**{"request.gc.period.ms": "60000"})
    assert tasks.settings.gc_period_s == 60.0
    tasks.tick()  # the first pass runs at once (no records) and sets the next
    assert tasks._next_gc - time.monotonic() > 59.0
    per_queue = tasks.settings.overridden({"request.gc.period.ms": "250"}, "roq task config")
    assert per_queue.gc_period_s == 0.25
