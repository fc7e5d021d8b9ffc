"""log.format=json (issue 32): a real `roq up -D log.format=json`; every line its processes log
(itself, its GCM, host, gateway, and the monitor and exchange the host starts) is one JSON
object, and each names what the process serves."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import uuid
from pathlib import Path

import pytest

from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import LocalCluster, PortBlocks, processes_with, wait_for

pytestmark = pytest.mark.integration


def _start(tmp_path: Path, base: int) -> subprocess.Popen[bytes]:
    args = ["up", "--data-dir", str(tmp_path / "data"), "--port-base", str(base),
            "-D", "log.format=json", "-D", f"security.dir={tmp_path / 'security'}",
            "-D", f"zk.namespace=/roq-test-{uuid.uuid4().hex[:10]}"]  # fmt: skip
    with (tmp_path / "up.out").open("wb") as out, (tmp_path / "up.err").open("wb") as err:
        return subprocess.Popen(
            roq_command(*args), env=child_environment(), stdin=subprocess.DEVNULL, stdout=out,
            stderr=err, start_new_session=True, cwd=tmp_path,
        )  # fmt: skip


def _stop(process: subprocess.Popen[bytes], tmp_path: Path) -> None:
    process.send_signal(signal.SIGTERM)
    try:
        process.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
    for pid in processes_with(str(tmp_path / "data")):
        os.kill(pid, signal.SIGKILL)


def test_every_line_of_roq_up_and_its_children_is_json(
    tmp_path: Path, port_blocks: PortBlocks
) -> None:
    base = port_blocks.take(1200)  # the layout spans base .. base + 1000 + the exchanges'
    helper = LocalCluster(tmp_path, "", port_blocks)  # its keys and CLI; it starts nothing
    gcm = f"127.0.0.1:{base}"
    up = _start(tmp_path, base)
    try:
        wait_for(lambda: "roq is up" in (tmp_path / "up.out").read_text() or up.poll() is not None,
                 60, "roq up to serve")  # fmt: skip
        assert up.poll() is None, (tmp_path / "up.err").read_text()[-3000:]
        made = helper.cli("queue", "create", "q1", "--gcm", gcm, timeout_s=60)
        assert made.returncode == 0, made.stderr
        sent = helper.cli("pub", "q1", "--count", "20", "--acks", "leader", "--gcm", gcm,
                          timeout_s=60)  # fmt: skip
        assert sent.returncode == 0, sent.stderr
    finally:
        _stop(up, tmp_path)
    lines = (tmp_path / "up.err").read_text().splitlines()
    objects = []
    for number, line in enumerate(lines, 1):
        try:
            objects.append(json.loads(line))
        except ValueError:
            pytest.fail(f"up.err line {number} is not JSON: {line!r}")
    for item in objects:
        assert {"time", "level", "logger", "message", "process", "pid"} <= item.keys(), item
    by_process: dict[str, list[dict[str, object]]] = {}
    for item in objects:
        by_process.setdefault(str(item["process"]), []).append(item)
    assert {"up", "gcm", "host", "http", "monitor", "exchange"} <= by_process.keys(), by_process
    # the gateway's queues (http-N) have their monitors and exchanges too: each names its own
    for role in ("monitor", "exchange"):
        queues = {str(item["queue"]) for item in by_process[role]}
        assert "q1" in queues and all(q == "q1" or q.startswith("http-") for q in queues), queues
        assert all(item["host"] == "127.0.0.1" for item in by_process[role]), role
    exchanges = {str(item["exchange"]) for item in by_process["exchange"]}  # ids: host-port-...
    assert exchanges and all(name.startswith("127.0.0.1-") for name in exchanges), exchanges
    assert all(item["host"] == "127.0.0.1" for item in by_process["host"])
