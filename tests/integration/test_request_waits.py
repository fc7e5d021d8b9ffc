"""The requester's wait for a result on a real cluster (docs/requests.md, "Hand out"): the monitor
holds a TASK_GET until its task is final (a long poll) instead of being asked every 10 ms, and a
monitor killed while a requester waits still yields the result, once."""

from __future__ import annotations

import os
import signal
import statistics
import threading
import time
from collections.abc import Iterator

import pytest

from roq import limits
from roq.client.requests import Requester, Task, TaskExpired
from roq.testing.cluster import LocalCluster, processes_with, wait_for

# every guarantee with the task records in ZooKeeper and in the monitor's state log (conftest.py)
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("delivery_store")]

HOST = {"work.slot.messages": 100, "work.slot.ms": 100, "work.lease.ms": 2000}


def _counting(requester: Requester) -> list[int]:
    """How often the requester subscribes to a task's outcome on its reply stream, and asks
    the monitor for a task's state by a request of its own (wrappers of its own methods)."""
    asked = [0]
    results = requester._results
    subscribe, refresh = results._subscribe, Task.refresh

    def counted(task: str) -> None:
        asked[0] += 1
        subscribe(task)

    def refreshed(task: Task, wait_ms: int = 0) -> object:
        asked[0] += 1
        return refresh(task, wait_ms)

    results._subscribe = counted  # type: ignore[method-assign]
    Task.refresh = refreshed  # type: ignore[assignment,method-assign]
    return asked


@pytest.fixture(autouse=True)
def _restore_refresh() -> Iterator[None]:
    refresh = Task.refresh
    yield
    Task.refresh = refresh  # type: ignore[method-assign]


def test_a_waiting_requester_is_answered_when_its_result_is_stored_not_by_polling(
    cluster: LocalCluster,
):
    """Each handler runs 1.5 s. Polled every 10 ms, a result would cost ~150 asks; on the
    requester's reply stream, one subscription made when the request is published, answered
    (pushed) when the result is stored, within its `task_watch_max_ms`. And the answer comes
    as the result is stored, not when a held request's wait ends."""
    cluster.start_with_queue(**HOST)
    run_s = 1.5
    returned: list[float] = []

    def handler(payload: bytes) -> bytes:
        time.sleep(run_s)
        returned.append(time.monotonic())
        return payload.upper()

    gaps, asks = [], []
    with cluster.worker("echo", handler), Requester("q1", gcm=cluster.gcm) as requester:
        asked = _counting(requester)
        for n in range(5):
            before = asked[0]
            task = requester.submit("echo", f"r{n}".encode())
            assert task.result(30) == f"R{n}".encode()
            gaps.append(time.monotonic() - returned[-1])
            asks.append(asked[0] - before)
    assert run_s * 1000 < limits.task_watch_max_ms
    assert asks == [1] * 5, asks
    assert statistics.median(gaps) < 0.3, (gaps, cluster.logs())


def test_outcomes_are_pushed_on_the_reply_stream_in_the_order_tasks_end(cluster: LocalCluster):
    """Twenty tasks in flight on one requester: each subscribed once, when published; the
    first submitted ends last (its handler waits until the others have ended), and every
    result is there to take, whatever order `result()` is called in. (CI, 26 Nov: sleeps of
    different lengths did not order the ends on a loaded machine; the gate does.)"""
    cluster.start_with_queue(**HOST)
    ended: list[bytes] = []
    others_ended = threading.Event()

    def handler(payload: bytes) -> bytes:
        if payload == b"0":
            others_ended.wait(30)
        ended.append(payload)
        return payload

    with (
        cluster.worker("echo", handler, concurrency=20),
        Requester("q1", gcm=cluster.gcm) as requester,
    ):
        asked = _counting(requester)
        tasks = [requester.submit("echo", str(n).encode()) for n in range(20)]
        wait_for(lambda: len(ended) == 19, 30, "the other handlers ran\n" + cluster.logs())
        others_ended.set()
        assert [task.result(30) for task in tasks] == [str(n).encode() for n in range(20)]
        assert asked[0] == 20, asked
    assert ended[-1] == b"0", ended


def test_on_done_calls_back_every_outcome_from_one_thread(cluster: LocalCluster):
    """Until 26 Nov `on_done` started a thread per task, polling, and a timeout killed that
    thread without a callback; nothing tested it. Now: done results (acknowledged: gone
    after), a task without a worker (NoWorker), one that outlasts its timeout (TaskTimeout,
    and it goes on), a callback that raises (logged, the others still called): all from one
    thread, `roq-results-q1`."""
    cluster.start_with_queue(**HOST)
    release = threading.Event()

    def handler(payload: bytes) -> bytes:
        if payload == b"slow":
            release.wait(30)
        return payload[::-1]

    outcomes: dict[str, tuple[bytes | None, str]] = {}
    threads: set[str] = set()

    def note(task: Task, result: bytes | None, failure: Exception | None) -> None:
        threads.add(threading.current_thread().name)
        outcomes[task.id] = (result, type(failure).__name__ if failure else "")
        if result == b"esiar":
            raise RuntimeError("a callback's own bug")

    with (
        cluster.worker("echo", handler, concurrency=4),
        Requester("q1", gcm=cluster.gcm) as requester,
    ):
        requester.settings({"request.delegator.repeats": "2", "request.delegator.wait.ms": "300"})
        tasks = [requester.submit("echo", f"t{n}".encode()) for n in range(10)]
        raising = requester.submit("echo", b"raise")
        nobody = requester.submit("nobody", b"x")
        slow = requester.submit("echo", b"slow")
        for task in [*tasks, raising, nobody]:
            task.on_done(note)
        slow.on_done(note, timeout_s=1.0)
        wait_for(lambda: len(outcomes) == 13, 60, f"every callback: {outcomes}")
        release.set()
        assert slow.result(30) == b"wols"  # it went on after its timeout
        with pytest.raises(TaskExpired):  # acknowledged by the callback thread
            requester.task(tasks[0].id).result(5)
    assert [outcomes[t.id] for t in tasks] == [(f"{n}t".encode(), "") for n in range(10)]
    assert outcomes[raising.id] == (b"esiar", "")
    assert outcomes[nobody.id] == (None, "NoWorker")
    assert outcomes[slow.id] == (None, "TaskTimeout")
    assert threads == {"roq-results-q1"}


def test_an_idle_worker_is_woken_by_the_requesters_wait_not_its_next_poll(
    cluster: LocalCluster,
):
    """An idle Worker's consumer asks with a LEASE the monitor holds (work_poll_ms); the
    requester's first TASK_GET, right after its request is on the log, wakes it (`Woken`), so
    it reads the log's end at once. A wake while the worker was between two held LEASEs
    answers its next one at once: most are woken (one the worker found itself is not)."""
    cluster.start_with_queue(**HOST)
    with (
        cluster.worker("echo", lambda p: p) as worker,
        Requester("q1", gcm=cluster.gcm) as requester,
    ):
        stats = worker.consumer.stats
        wait_for(lambda: stats["held"] >= 2, 30, "the idle worker's LEASE is held")
        for n in range(10):
            held = stats["held"]
            assert requester.call("echo", f"w{n}".encode(), timeout_s=30) == f"w{n}".encode()
            wait_for(lambda held=held: stats["held"] > held + 1, 30, "the worker idles again")
        # A wake that finds no LEASE held (the worker between two, more often on a loaded
        # machine: 1 of 10 woken in CI before) is kept for the next one: 9-10 of 10 with two
        # busy loops beside the test; polling alone: 0. (Kept for one 25 ms wait, CI's load
        # still made 4 of 10: it is kept for work_lease_wake_kept_ms, 500 ms.)
        assert stats["woken"] >= 6, dict(stats)


def test_a_held_wait_ends_with_the_task_still_running(cluster: LocalCluster):
    """A held TASK_GET is answered when its wait ends, with the task as it is then."""
    cluster.start_with_queue(**HOST)
    release = threading.Event()

    def handler(payload: bytes) -> bytes:
        release.wait(30)
        return payload

    with cluster.worker("echo", handler), Requester("q1", gcm=cluster.gcm) as requester:
        task = requester.submit("echo", b"held")
        wait_for(lambda: task.status == "in_progress", 30, "the worker took it\n" + cluster.logs())
        started = time.monotonic()
        view = task.refresh(wait_ms=500)
        waited = time.monotonic() - started
        assert view.state == "in_progress"
        assert 0.45 <= waited < 0.5 + limits.work_request_timeout_ms / 1000, waited
        release.set()
        assert task.result(30) == b"held"


def test_the_monitor_killed_while_a_requester_waits_the_result_comes_once(
    cluster: LocalCluster,
):
    """kill -9 of the monitor holding a requester's TASK_GET: the host starts it again (an
    empty cache: ZooKeeper is read), the worker's result is stored there, and the requester,
    asking again, gets it once; the task is gone after."""
    cluster.start_with_queue(**HOST)
    release, runs = threading.Event(), []

    def handler(payload: bytes) -> bytes:
        runs.append(payload)
        release.wait(60)
        return payload[::-1]

    got: list[bytes] = []
    with cluster.worker("echo", handler), Requester("q1", gcm=cluster.gcm) as requester:
        task = requester.submit("echo", b"kept")
        wait_for(lambda: runs, 30, "the worker took it\n" + cluster.logs())
        asked = _counting(requester)
        waiter = threading.Thread(target=lambda: got.append(task.result(90)), daemon=True)
        waiter.start()  # the requester's link is the waiter's until it is joined
        assert asked[0] == 0  # subscribed by submit(), held by the monitor
        [pid] = processes_with("monitor q1 --bind", str(cluster.tmp))
        os.kill(pid, signal.SIGKILL)
        wait_for(
            lambda: processes_with("monitor q1 --bind", str(cluster.tmp)) not in ([], [pid]),
            20, "the monitor restarted",
        )  # fmt: skip
        # the stream reconnected to the new monitor: the subscription is made again
        wait_for(lambda: asked[0] >= 1, 30, "subscribed again\n" + cluster.logs())
        release.set()
        waiter.join(90)
        assert got == [b"tpek"], cluster.logs()
        with pytest.raises(TaskExpired, match="no such task"):
            requester.task(task.id).result(5)
    assert runs == [b"kept"], "run once"
