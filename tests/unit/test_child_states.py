"""What a host tells the cluster of the children it is restarting or gave up on (issue 17): its
supervision's report, the record in ZooKeeper (an older host's record has none), and how
`roq status` prints it."""

from __future__ import annotations

import dataclasses
import json
import logging
import subprocess
import sys
import time
from types import SimpleNamespace
from typing import Any

from roq import limits
from roq.cli.queues import _render_status
from roq.coordination.paths import Paths
from roq.coordination.registry import ChildState, HostRecord, Registry
from roq.host import supervision
from roq.host.supervision import Child
from roq.protocol.messages.admin import (
    ChildReport,
    ClusterStatus,
    HostInfo,
    QueueInfo,
    QueueStatus,
    RecordedExchange,
)
from roq.transport import new_context


def test_a_child_that_keeps_failing_is_reported_restarting_then_given_up(caplog):
    caplog.set_level(logging.WARNING, logger="roq")
    failing = [sys.executable, "-c", "raise SystemExit(73)"]
    child = Child("exchange q1/x1", "exchange", "q1", 1, "tcp://127.0.0.1:1", failing, id="x1")
    context = new_context()
    try:
        assert supervision.report(child) is None  # not started, not scheduled: nothing to say
        child.process = subprocess.Popen(failing)  # as if started, then crashed
        child.process.wait(timeout=10)
        supervision.watch(child, context, time.monotonic())  # notices the exit
        first = supervision.report(child)
        assert first is not None
        assert first == ChildState("q1", "x1", "exchange", "RESTARTING", 1, "exit code 73",
                                   first.at)  # fmt: skip
        assert 0 < first.at - time.time() <= limits.child_restart_backoff_ms_min / 1000
        while not child.given_up:  # each restart fails the same way, without the back-off
            assert child.restart_at is not None
            supervision.watch(child, context, child.restart_at)
        given_up = supervision.report(child)
        assert given_up is not None and given_up.state == "GIVEN_UP"
        assert given_up.failures == limits.child_restarts_max + 1
        assert given_up.last_exit == "exit code 73" and abs(given_up.at - time.time()) < 5
    finally:
        context.term()
    errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    failures = limits.child_restarts_max + 1
    assert (
        f"exchange q1/x1: {failures} failures in a row (last: exit code 73); giving up"
        in errors[-1]
    )


def test_a_signal_is_named():
    assert supervision._ended(-9) == "killed by signal 9 (SIGKILL)"
    assert supervision._ended(0) == "exit code 0"


class _Znodes:
    """A ZooKeeper client's `get`, over a dict of path → bytes."""

    def __init__(self, data: dict[str, bytes]):
        self.data = data

    def get(self, path: str) -> tuple[bytes, Any]:
        return self.data[path], SimpleNamespace(version=0)


def test_the_host_record_carries_its_children_and_an_older_one_reads_as_none():
    paths = Paths("/roq")
    state = ChildState("q1", "monitor-q1", "monitor", "RESTARTING", 2, "exit code 1", 1.7e9)
    new = HostRecord("h1", "127.0.0.1", "tcp://127.0.0.1:5100", 4, 42, [state])
    old = {"name": "h2", "address": "127.0.0.2", "hcm": "tcp://127.0.0.2:5100",
           "max_exchanges": 4, "pid": 43}  # fmt: skip
    registry = Registry(
        _Znodes({paths.host("h1"): json.dumps(dataclasses.asdict(new)).encode(),
                 paths.host("h2"): json.dumps(old).encode()}),
        paths,
    )  # fmt: skip
    assert registry.host("h1") == new
    assert registry.host("h2") == HostRecord(**old, children=[])


def _status(children: tuple[ChildReport, ...]) -> ClusterStatus:
    queue = QueueInfo("q1", "h1", "RUNNING", "tcp://127.0.0.1:17000", "tcp://127.0.0.1:17101", True)
    exchange = RecordedExchange("x1", "h1", "tcp://127.0.0.1:18000", "tcp://127.0.0.1:18001")
    return ClusterStatus(
        (HostInfo("h1", "127.0.0.1", "tcp://127.0.0.1:5100", 4, children),),
        (QueueStatus(queue, (exchange,)),),
    )


def test_roq_status_says_restarting_or_given_up():
    now = time.time()
    monitor = ChildReport("q1", "monitor-q1", "monitor", "RESTARTING", 2, "exit code 1", now + 2)
    exchange = ChildReport("q1", "x1", "exchange", "GIVEN_UP", 11, "exit code 73", now - 30)
    text = _render_status(_status((monitor, exchange)), {"q1": None})
    assert "NOT SERVING: the monitor on host h1 is restarting (failure 2, next try in " in text
    assert "s; last: exit code 1)" in text
    now_text = _render_status(_status((dataclasses.replace(monitor, at=now - 1),)), {"q1": None})
    assert "restarting (failure 2, trying again now; last: exit code 1)" in now_text
    assert "\n      given up after 11 failures (last: exit code 73, 30 s ago;" in text
    plain = _render_status(_status(()), {"q1": None})  # a host that reports nothing (older)
    assert "the monitor does not answer, and the host reports no failure" in plain
    assert "(monitor unreachable)" in plain
