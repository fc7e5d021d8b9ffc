"""JLupin's MEMORY_ERRORS (issue 34): `roq serve --memory-max MB --memory-growth P
--memory-restarts N`. A real worker whose --exec command allocates 300 MB: each request is
finished and stored, then its worker, past its threshold, is restarted with the threshold grown
(120, 180, 270 MB), and past the restarts allowed it is drained and `roq serve` exits 1."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from roq.client.requests import Requester
from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.integration

HOST = {"work.slot.messages": 100, "work.slot.ms": 100, "work.lease.ms": 2000}
ALLOCATE = """
import sys, time
sys.stdin.buffer.read()
held = b"x" * (300 * 1024 * 1024)  # written: resident, not only reserved
time.sleep(2)  # the supervisor reads the memory every 0.5 s
sys.stdout.write("done")
"""


def _log(tmp: Path) -> str:
    return (tmp / "serve.err").read_text()


def test_a_worker_past_its_memory_threshold_finishes_its_request_and_restarts_grown(
    cluster: LocalCluster, tmp_path: Path
):
    cluster.start_with_queue(**HOST)
    script = tmp_path / "allocate.py"
    script.write_text(ALLOCATE)
    command = f"{sys.executable} {script}"
    with (tmp_path / "serve.err").open("wb") as err:
        serve = subprocess.Popen(
            roq_command("serve", "q1", "mem", "--exec", command, "--gcm", cluster.gcm,
                        "--memory-max", "120", "--memory-growth", "50", "--memory-restarts", "2"),
            env=child_environment(), stdout=subprocess.DEVNULL, stderr=err,
            start_new_session=True,
        )  # fmt: skip
    try:
        with Requester("q1", gcm=cluster.gcm) as requester:
            for restart in ("restart 1 of 2; threshold now 180 MB", "restart 2 of 2; "
                            "threshold now 270 MB", "after 2 restarts"):  # fmt: skip
                assert requester.submit("mem", b"x").result(120) == b"done", _log(tmp_path)
                wait_for(lambda r=restart: r in _log(tmp_path), 60, restart)
        assert serve.wait(60) == 1, _log(tmp_path)
        lines = [line for line in _log(tmp_path).splitlines() if "past its threshold" in line]
        assert len(lines) == 3, _log(tmp_path)
        for line in lines:  # each names its worker: a new one after each restart
            assert line.startswith("roq serve: worker ") and " of q1/mem: memory " in line
        assert len({line.split()[3] for line in lines}) == 3
    finally:
        if serve.poll() is None:
            os.killpg(serve.pid, signal.SIGKILL)
            serve.wait(10)
