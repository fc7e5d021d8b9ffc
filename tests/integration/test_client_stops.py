"""Every client command stops within a second of Ctrl-C (SIGINT) or SIGTERM, idle or busy, with
what it holds settled or released (issue 32 item 1; `roq work` idle is test_workqueues.py's).
Real `roq` processes against one real cluster; each is signalled once it is observably in the
state named (its own line on stderr, a message it sent received, a process it started)."""

from __future__ import annotations

import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from roq.client.subscriber import Subscriber
from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import LocalCluster, PortBlocks, processes_with, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

STOP_S = 1.0  # the bound, from the signal to the exit
WORK = {"work.slot.messages": 10, "work.slot.ms": 200, "work.lease.ms": 30_000}
SIGNALS = pytest.mark.parametrize(
    "signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"]
)


@pytest.fixture(scope="module")
def cluster(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: str, port_blocks: PortBlocks
) -> Iterator[LocalCluster]:
    """One cluster with q1 for the module: the commands, not the cluster, are under test."""
    local = LocalCluster(tmp_path_factory.mktemp("stops"), zookeeper, port_blocks)
    try:
        local.start_with_queue(**WORK)
        # a task whose worker was stopped (or that has none yet) waits for one: ended "no
        # worker" after 3 looks by default, before the next worker's Python has started
        assert local.cli("task", "config", "q1", "request.delegator.repeats=1000",
                         "--gcm", local.gcm).returncode == 0  # fmt: skip
        yield local
    finally:
        local.stop()


class Command:
    """A `roq` command with its stderr in a file (read while it runs)."""

    def __init__(
        self, cluster: LocalCluster, tmp: Path, *args: str, stdin: int = subprocess.DEVNULL
    ):
        self.err_path = tmp / f"{args[0]}-{time.monotonic_ns()}.err"
        with self.err_path.open("wb") as err:
            self.process = subprocess.Popen(
                roq_command(*args), env=child_environment(), stdin=stdin,
                stdout=subprocess.PIPE, stderr=err, start_new_session=True,
            )  # fmt: skip

    @property
    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_said(self, text: str, timeout_s: float = 60) -> None:
        wait_for(lambda: text in self.stderr or self.process.poll() is not None, timeout_s,
                 f"{text!r} on stderr")  # fmt: skip
        assert self.process.poll() is None, self.stderr

    def stopped_by(self, signum: int) -> tuple[int, float]:
        """Its exit code and the seconds from `signum` to its exit."""
        started = time.monotonic()
        self.process.send_signal(signum)
        try:
            code = self.process.wait(timeout=30)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait(10)
        took = time.monotonic() - started
        print(f"{self.err_path.name}: {signal.Signals(signum).name} -> exit {code} in {took:.2f} s")
        return code, took


def _gcm(cluster: LocalCluster) -> list[str]:
    return ["--gcm", cluster.gcm]


@SIGNALS
def test_an_idle_sub_stops(cluster: LocalCluster, tmp_path: Path, signum: int):
    sub = Command(cluster, tmp_path, "sub", "q1", *_gcm(cluster))
    sub.wait_said("subscribed to q1")
    code, took = sub.stopped_by(signum)
    assert code == 0 and took < STOP_S, (code, took, sub.stderr)


def test_a_sub_waiting_for_a_silent_gcm_stops(tmp_path: Path, cluster: LocalCluster):
    """While it finds the queue (nothing received, nothing to settle): exit 130 at once. Before,
    the signal only set a flag read after the wait (up to the whole placement timeout)."""
    import socket

    with socket.socket() as silent:  # bound and listening, never accepting: a hung GCM
        silent.bind(("127.0.0.1", 0))
        silent.listen(0)
        given = f"127.0.0.1:{silent.getsockname()[1]}"
        sub = Command(cluster, tmp_path, "sub", "q1", "--gcm", given)
        sub.wait_said(f"waiting for the GCM at {given}")
        code, took = sub.stopped_by(signal.SIGINT)
    assert code == 130 and took < STOP_S, (code, took, sub.stderr)


@SIGNALS
def test_pub_from_an_idle_stdin_stops_and_sends_what_it_read(
    cluster: LocalCluster, tmp_path: Path, signum: int
):
    """Waiting for a line that never comes (stdin open): the read is given up, what was read is
    flushed, exit 0."""
    marker = f"line-{signum}-{time.monotonic_ns()}".encode()
    with Subscriber("q1", gcm=cluster.gcm) as subscriber:
        pub = Command(cluster, tmp_path, "pub", "q1", *_gcm(cluster), stdin=subprocess.PIPE)
        assert pub.process.stdin is not None
        pub.process.stdin.write(marker + b"\n")
        pub.process.stdin.flush()  # and kept open: the next read waits
        wait_for(
            lambda: any(r.payload == marker for r in subscriber.messages(None, 0.2)),
            60, "the first line received",
        )  # fmt: skip
        code, took = pub.stopped_by(signum)
    assert code == 0 and took < STOP_S, (code, took, pub.stderr)
    assert "roq pub: 1 messages sent to q1" in pub.stderr


def test_a_busy_pub_stops(cluster: LocalCluster, tmp_path: Path):
    with Subscriber("q1", gcm=cluster.gcm) as subscriber:
        pub = Command(cluster, tmp_path, "pub", "q1", "--count", "100000000", "--rate", "2000",
                      *_gcm(cluster))  # fmt: skip
        wait_for(lambda: list(subscriber.messages(1, 0.2)), 60, "messages arriving")
        code, took = pub.stopped_by(signal.SIGTERM)
    assert code == 0 and took < STOP_S, (code, took, pub.stderr)


def test_a_busy_work_stops_and_releases_its_message(cluster: LocalCluster, tmp_path: Path):
    """Its --exec command runs (a long one): it is ended and the message handed back at once,
    so that another consumer has it (before, the stop waited for the command)."""
    marker = tmp_path / "running"
    work = Command(cluster, tmp_path, "work", "q1", "--group", "busy", "--from-now", "--exec",
                   f"touch {marker}; sleep 60", *_gcm(cluster))  # fmt: skip
    work.wait_said("consuming q1")
    assert cluster.cli("pub", "q1", "--acks", "leader", *_gcm(cluster),
                       input_text="job\n").returncode == 0  # fmt: skip
    wait_for(marker.exists, 60, "--exec running")
    code, took = work.stopped_by(signal.SIGTERM)
    assert code == 0 and took < STOP_S, (code, took, work.stderr)
    assert not processes_with(str(marker)), "the --exec command outlived it"
    again = cluster.cli("work", "q1", "--group", "busy", "--count", "1", "--timeout", "30",
                        *_gcm(cluster))  # fmt: skip
    assert again.returncode == 0 and again.stdout.splitlines()[-1:] == ["job"], again.stderr


def test_an_idle_serve_stops(cluster: LocalCluster, tmp_path: Path):
    serve = Command(cluster, tmp_path, "serve", "q1", "upper", "--exec", "tr a-z A-Z",
                    *_gcm(cluster))  # fmt: skip
    serve.wait_said("roq serve: worker")
    code, took = serve.stopped_by(signal.SIGINT)
    assert code == 0 and took < STOP_S, (code, took, serve.stderr)


def test_a_busy_serve_stops_and_hands_its_request_to_another_worker(
    cluster: LocalCluster, tmp_path: Path
):
    """Its --exec command runs: it is ended, the request handed back without an outcome, and
    the next worker of the service runs it (before, the stop waited for the command)."""
    marker = tmp_path / "serving"
    busy = Command(cluster, tmp_path, "serve", "q1", "slow", "--exec",
                   f"touch {marker}; sleep 60", *_gcm(cluster))  # fmt: skip
    busy.wait_said("roq serve: worker")
    submitted = cluster.cli("call", "q1", "slow", "--no-wait", *_gcm(cluster), input_text="job")
    assert submitted.returncode == 0, submitted.stderr
    task = submitted.stdout.strip()
    wait_for(marker.exists, 60, "the request running")
    code, took = busy.stopped_by(signal.SIGTERM)
    assert code == 0 and took < STOP_S, (code, took, busy.stderr)
    assert not processes_with(str(marker)), "the --exec command outlived it"
    other = cluster.cli("serve", "q1", "slow", "--exec", "tr a-z A-Z", "--count", "1",
                        "--timeout", "60", *_gcm(cluster), timeout_s=120)  # fmt: skip
    assert other.returncode == 0, other.stderr
    result = cluster.cli("task", "result", task, "--timeout", "30", *_gcm(cluster))
    assert (result.returncode, result.stdout) == (0, "JOB"), result.stderr


@SIGNALS
def test_a_call_waiting_for_its_result_stops_and_the_task_goes_on(
    cluster: LocalCluster, tmp_path: Path, signum: int
):
    task = f"q1/stop-{int(signum)}-{time.monotonic_ns()}"
    call = Command(cluster, tmp_path, "call", "q1", "nobody", "--request-id",
                   task.split("/")[1], *_gcm(cluster), stdin=subprocess.PIPE)  # fmt: skip
    assert call.process.stdin is not None
    call.process.stdin.write(b"hello\n")
    call.process.stdin.close()
    wait_for(lambda: cluster.cli("task", "show", task, *_gcm(cluster)).returncode == 0, 60,
             "the request accepted")  # fmt: skip
    code, took = call.stopped_by(signum)
    assert code == 130 and took < STOP_S, (code, took, call.stderr)
    assert f"stopped waiting; task {task} goes on" in call.stderr, call.stderr
    shown = cluster.cli("task", "show", task, *_gcm(cluster))
    assert shown.returncode == 0, shown.stderr  # the task is still there


def test_a_running_bench_stops_with_its_workers(cluster: LocalCluster, tmp_path: Path):
    bench = Command(cluster, tmp_path, "bench", "--queue", "q1", "--seconds", "60",
                    "--rate", "1000", *_gcm(cluster))  # fmt: skip
    bench.wait_said("published")  # its first progress line: the workers run
    workers = processes_with("bench-worker", cluster.gcm)
    assert workers
    code, took = bench.stopped_by(signal.SIGINT)
    assert code == 130 and took < STOP_S, (code, took, bench.stderr)
    assert not [p for p in workers if p in processes_with("bench-worker", cluster.gcm)]


def test_kpi_record_stops(cluster: LocalCluster, tmp_path: Path):
    record = Command(cluster, tmp_path, "kpi-record", "-q", "q1", "--dir", str(tmp_path),
                     *_gcm(cluster))  # fmt: skip
    wait_for(lambda: list((tmp_path / "_kpi").rglob("*.log")), 60, "the KPI log started")
    code, took = record.stopped_by(signal.SIGTERM)
    assert code == 0 and took < STOP_S, (code, took, record.stderr)
