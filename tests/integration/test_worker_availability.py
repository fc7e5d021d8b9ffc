"""JLupin's checkAvailableScript (issue 34): `roq serve --check-available CMD`. Two real `roq
serve` workers of one service; one's check reads a flag file: while the flag says "busy" its
worker leaves the service's group and every request goes to the other; once the flag is gone
it takes requests again."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from roq.client.requests import Requester
from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.integration

HOST = {"work.slot.messages": 100, "work.slot.ms": 100, "work.lease.ms": 2000}


def _serve(cluster: LocalCluster, tmp: Path, name: str, *options: str) -> subprocess.Popen[bytes]:
    """A worker whose result is its own name."""
    with (tmp / f"{name}.err").open("wb") as err:
        return subprocess.Popen(
            roq_command("serve", "q1", "echo", "--exec", f"cat >/dev/null; printf {name}",
                        "--gcm", cluster.gcm, *options),
            env=child_environment(), stdout=subprocess.DEVNULL, stderr=err,
            start_new_session=True,
        )  # fmt: skip


def _said(tmp: Path, name: str, text: str, times: int = 1) -> bool:
    return (tmp / f"{name}.err").read_text().count(text) >= times


def _results(cluster: LocalCluster, count: int) -> list[bytes]:
    with Requester("q1", gcm=cluster.gcm) as requester:
        tasks = [requester.submit("echo", f"r{n}".encode()) for n in range(count)]
        return [task.result(60) for task in tasks]


def _stop(worker: subprocess.Popen[bytes]) -> None:
    if worker.poll() is None:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(10)


def test_a_worker_not_available_takes_no_request_until_its_check_says_so(
    cluster: LocalCluster, tmp_path: Path
):
    cluster.start_with_queue(**HOST)
    flag = tmp_path / "busy"
    check = f"test ! -e {flag}"
    a = _serve(cluster, tmp_path, "A", "--check-available", check, "--check-every", "0.2")
    b = _serve(cluster, tmp_path, "B")
    try:
        for name in ("A", "B"):
            wait_for(lambda n=name: _said(tmp_path, n, "roq serve: worker"), 60, f"{name} joined")
        flag.touch()
        wait_for(lambda: _said(tmp_path, "A", "leaves its group"), 30, "A left its group")
        assert _results(cluster, 6) == [b"B"] * 6
        flag.unlink()
        wait_for(lambda: _said(tmp_path, "A", "available again"), 30, "A available again")
        b.send_signal(signal.SIGTERM)
        assert b.wait(30) == 0
        assert _results(cluster, 3) == [b"A"] * 3
        assert a.poll() is None, (tmp_path / "A.err").read_text()
    finally:
        _stop(a)
        _stop(b)


def test_a_missing_check_script_is_logged_and_the_worker_stays_up(
    cluster: LocalCluster, tmp_path: Path
):
    cluster.start_with_queue(**HOST)
    missing = tmp_path / "no-such-script"
    a = _serve(cluster, tmp_path, "A", "--check-available", str(missing), "--check-every", "0.2")
    b = _serve(cluster, tmp_path, "B")
    try:
        wait_for(lambda: _said(tmp_path, "A", "exit 127"), 60, "A's missing script logged")
        wait_for(lambda: _said(tmp_path, "A", "leaves its group"), 30, "A left its group")
        wait_for(lambda: _said(tmp_path, "B", "roq serve: worker"), 60, "B joined")
        assert _results(cluster, 3) == [b"B"] * 3
        assert a.poll() is None, (tmp_path / "A.err").read_text()
    finally:
        _stop(a)
        _stop(b)
