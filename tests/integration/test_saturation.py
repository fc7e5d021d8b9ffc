"""A saturated machine is not a dead one (issue 30 item 6, issue 34; docs/guarantees.md §3,
"Late is not dead"). The CPU saturated for real: busy loops, more of them than the core they
are pinned to with `taskset`, share that core with q1's monitor and both its exchanges while
acks=all and acks=none publishers stream into it; no exchange is declared dead and nothing
is lost. In the same module, a frozen exchange (SIGSTOP) is still declared dead within its
bound, and one seen starved before (frozen in bursts, heard again after each) is given the
longer bound its record earns."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from roq import limits
from roq.client.live import monitor_status
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.testing.cluster import LocalCluster, processes_with, wait_for

pytestmark = pytest.mark.integration

HOST = {"replicationFactor": 2, "exchange.warmup": 500}
CORE = 0  # the core the queue's processes and the loops share; the other stays free (CI's
BUSY_LOOPS = 4  # second worker, the publishers): 4 loops and 3 roq processes on one core
SATURATION_S = 12.0  # over 2x the 5 s late bound: the old detector's deaths had room
LATE_MAX_S = limits.monitor_late_silence_max_ms / 1000
HEARD_AGAIN = "of silence: late, not dead"  # the monitor's line when a late one reports again
DETECTION_SLACK_S = 5.0  # a loaded machine's poll and status round trips, on top of a bound


def _live(cluster: LocalCluster) -> list[str]:
    """Ids of q1's exchanges its monitor lists as live ([] while it does not answer)."""
    with cluster.admin() as admin:
        [queue] = admin.status().queues
    status = monitor_status(queue.info.monitor_host)
    return sorted(x.exchange_id for x in status.exchanges) if status else []


def _queue_of_two(cluster: LocalCluster) -> list[str]:
    """q1 with its monitor and an exchange on h1 and its second exchange (R=2) on h2."""
    cluster.start_gcm()
    cluster.start_host("h1", **HOST)
    cluster.start_host("h2", **HOST)
    cluster.wait_ready(hosts=2)
    with cluster.admin() as admin:
        admin.create_queue("q1", host="h1")
    return wait_for(lambda: len(_live(cluster)) == 2 and _live(cluster), 30, "q1's 2 exchanges")


def _monitor_log(cluster: LocalCluster) -> str:
    """Every line of q1's monitor (it logs through its host, h1)."""
    return next(d for d in cluster.daemons if d.name == "h1").log_text()


def _deaths(cluster: LocalCluster) -> list[str]:
    return [line for line in _monitor_log(cluster).splitlines() if "declared dead" in line]


# --- the CPU saturated for real ----------------------------------------------------------------
def _pin(pids: list[int], cpus: str) -> None:
    """Every thread of each process (-a) onto `cpus`; a process gone meanwhile is skipped."""
    for pid in pids:
        subprocess.run(["taskset", "-a", "-p", "-c", cpus, str(pid)], capture_output=True)


def _run_delay_s(pids: list[int]) -> float:
    """Seconds the threads of `pids` spent runnable but waiting for a CPU (schedstat)."""
    total = 0
    for pid in pids:
        for task in Path(f"/proc/{pid}/task").glob("*/schedstat"):
            with contextlib.suppress(OSError, ValueError, IndexError):
                total += int(task.read_text().split()[1])
    return total / 1e9


@contextlib.contextmanager
def _saturated(pids: list[int]) -> Iterator[None]:
    """`pids` and BUSY_LOOPS busy loops on CORE alone; loops killed and `pids` free again on
    the way out, whatever happened."""
    every_cpu = f"0-{(os.cpu_count() or 1) - 1}"
    loop = ["taskset", "-c", str(CORE), sys.executable, "-c", "while True: pass"]
    loops: list[subprocess.Popen[bytes]] = []
    try:
        loops = [subprocess.Popen(loop, stdin=subprocess.DEVNULL) for _ in range(BUSY_LOOPS)]
        _pin(pids, str(CORE))
        yield
    finally:
        for busy in loops:
            busy.kill()
            busy.wait(timeout=10)
        _pin(pids, every_cpu)


@dataclass
class Stream:
    """One publisher on its own thread, numbered messages until stopped; what it had flushed."""

    acks: str
    stop: threading.Event = field(default_factory=threading.Event)
    sent: int = 0
    flushed: int = 0  # messages 0..flushed-1 were flushed (with acks=all: acknowledged)
    error: BaseException | None = None
    thread: threading.Thread | None = None

    def start(self, cluster: LocalCluster) -> None:
        self.thread = threading.Thread(target=self._run, args=(cluster,), daemon=True)
        self.thread.start()

    def _run(self, cluster: LocalCluster) -> None:
        try:
            with Publisher("q1", gcm=cluster.gcm, acks=self.acks, linger_ms=5) as publisher:
                while not self.stop.is_set():
                    for _ in range(20):
                        publisher.send(f"{self.acks}-{self.sent}".encode())
                        self.sent += 1
                    publisher.flush(timeout_s=60)
                    self.flushed = self.sent
                    time.sleep(0.01)  # ~1,000 messages/s each: a stream, not a flood
        except BaseException as error:  # shown by the test, not lost with the thread
            self.error = error

    def finish(self) -> None:
        self.stop.set()
        assert self.thread is not None
        self.thread.join(90)
        assert not self.thread.is_alive(), f"the acks={self.acks} publisher did not finish"
        assert self.error is None, f"acks={self.acks}: {self.error!r}"


def _read_all(cluster: LocalCluster, count: int) -> set[bytes]:
    with Subscriber("q1", gcm=cluster.gcm, start="beginning") as subscriber:
        return {bytes(r.payload) for r in subscriber.messages(count=count, timeout_s=60)}


def test_a_cpu_saturated_queue_declares_no_exchange_dead_and_loses_nothing(
    cluster: LocalCluster,
) -> None:
    """12 s of 4 busy loops and q1's monitor and two exchanges on one core (taskset), while an
    acks=all and an acks=none publisher stream: no exchange is declared dead, both stay
    listed, and every message flushed is read back, the acks=none ones too (a false death
    would have moved that publisher and lost what it had in flight)."""
    exchanges = _queue_of_two(cluster)
    queue_pids = cluster.queue_processes("q1")
    assert len(queue_pids) == 3, f"q1's monitor and 2 exchanges, not {queue_pids}"
    streams = [Stream("all"), Stream("none")]
    for stream in streams:
        stream.start(cluster)
    wait_for(lambda: all(s.flushed >= 200 for s in streams), 30, "both publishers streaming")
    waited_before = _run_delay_s(queue_pids)
    with _saturated(queue_pids):
        time.sleep(SATURATION_S)  # the fault's length
        starved_s = _run_delay_s(queue_pids) - waited_before
        during = [s.flushed for s in streams]
    for stream in streams:
        stream.finish()
    print(f"q1's processes waited {starved_s:.1f} s for the core in {SATURATION_S} s; "
          f"flushed {[s.flushed for s in streams]} ({during} when it ended); "
          f"{_monitor_log(cluster).count('late, not dead yet')} late-not-dead, "
          f"{len(_deaths(cluster))} deaths")  # fmt: skip
    assert starved_s > 1.0, f"the saturation was not real: {starved_s:.2f} s waited"
    assert _deaths(cluster) == [], "\n".join(_deaths(cluster))
    assert _live(cluster) == exchanges
    expected = {f"{s.acks}-{n}".encode() for s in streams for n in range(s.flushed)}
    got = _read_all(cluster, sum(s.sent for s in streams))
    missing = sorted(expected - got)
    assert not missing, f"{len(missing)} flushed messages lost, first {missing[:5]}"


# --- a frozen exchange is still dead -----------------------------------------------------------
@contextlib.contextmanager
def _frozen(pid: int) -> Iterator[None]:
    """SIGSTOP'd; continued on the way out whatever happened (the cluster's stop needs it)."""
    os.kill(pid, signal.SIGSTOP)
    print(f"{time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} SIGSTOP {pid}")
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)
        print(f"{time.strftime('%H:%M:%S')}.{int(time.time() * 1000) % 1000:03d} SIGCONT {pid}")


def _declared_dead_within(cluster: LocalCluster, exchange_id: str, bound_s: float) -> float:
    """Seconds until q1's monitor no longer lists `exchange_id`, failing past the bound."""
    started = time.monotonic()
    wait_for(lambda: exchange_id not in _live(cluster), bound_s + DETECTION_SLACK_S,
             f"{exchange_id} declared dead", 0.2)  # fmt: skip
    return time.monotonic() - started


def test_a_frozen_exchange_is_dead_within_its_bound_one_seen_starved_within_a_longer_one(
    cluster: LocalCluster,
) -> None:
    """An exchange frozen for good with no record of starvation is dead after the late bound
    (5 s), not after its heartbeats (0.6 s: its connection stays up), and not much later. One
    frozen for 4 s and heard again has shown a starved machine: frozen 6 s next, past the late
    bound, it is kept (its bound is now 2 x 4 s)."""
    starved, frozen = _queue_of_two(cluster)
    [starved_pid], [frozen_pid] = processes_with(starved), processes_with(frozen)
    for length_s in (4.0, 6.0):  # the second is past the late bound, within the stretched
        log_before = _monitor_log(cluster).count(HEARD_AGAIN)
        with _frozen(starved_pid):
            time.sleep(length_s)  # the fault's length
        wait_for(lambda: _monitor_log(cluster).count(HEARD_AGAIN) > log_before, 10,  # noqa: B023
                 f"{starved} heard again after {length_s} s frozen")  # fmt: skip
    assert _deaths(cluster) == [], "\n".join(_deaths(cluster))
    assert starved in _live(cluster)
    with _frozen(frozen_pid):
        took_s = _declared_dead_within(cluster, frozen, LATE_MAX_S)
    print(f"frozen exchange declared dead after {took_s:.1f} s; the starved one kept")
    assert took_s >= LATE_MAX_S - 0.5, f"declared dead after {took_s:.1f} s: before the bound"
    [death] = _deaths(cluster)
    assert frozen in death and "its connection up (bound 5.0 s)" in death, death
