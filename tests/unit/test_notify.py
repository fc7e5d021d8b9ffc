"""sd_notify and the systemd watchdog (system/notify.py), against a real AF_UNIX datagram socket
standing in for systemd's $NOTIFY_SOCKET."""

from __future__ import annotations

import asyncio
import os
import socket
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from roq.system import notify


class Listener:
    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(address)
        self.sock.setblocking(False)

    def received(self) -> list[str]:
        out = []
        while True:
            try:
                out.append(self.sock.recv(4096).decode())
            except BlockingIOError:
                return out


@pytest.fixture(params=["path", "abstract"])
def listener(
    request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Listener]:
    if request.param == "path":
        address = name = str(tmp_path / "notify.sock")
    else:
        name = f"@roq-test-{uuid.uuid4().hex}"
        address = "\0" + name[1:]
    made = Listener(address)
    monkeypatch.setenv("NOTIFY_SOCKET", name)
    monkeypatch.delenv("WATCHDOG_USEC", raising=False)
    monkeypatch.delenv("WATCHDOG_PID", raising=False)
    notify.process_watchdog.cache_clear()
    yield made
    made.sock.close()
    notify.process_watchdog.cache_clear()


def test_ready_and_stopping_reach_the_socket(listener: Listener) -> None:
    assert notify.ready("serving") and notify.stopping()
    ready, stopping = listener.received()
    assert ready.splitlines() == ["READY=1", "STATUS=serving", f"MAINPID={os.getpid()}"]
    assert stopping == "STOPPING=1"


def test_without_a_socket_nothing_is_sent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    assert not notify.notify("READY=1")
    monkeypatch.setenv("NOTIFY_SOCKET", "/nonexistent/notify.sock")
    assert not notify.notify("READY=1")  # a gone socket is no error for the daemon


@pytest.mark.parametrize(
    ("usec", "pid", "interval"),
    [("", "", None), ("0", "", None), ("junk", "", None), ("3000000", "", 3.0),
     ("3000000", "self", 3.0), ("3000000", "1", None)],
)  # fmt: skip
def test_the_interval_is_systemds_for_this_process_only(
    monkeypatch: pytest.MonkeyPatch, usec: str, pid: str, interval: float | None
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", usec)
    monkeypatch.setenv("WATCHDOG_PID", str(os.getpid()) if pid == "self" else pid)
    assert notify.watchdog_interval_s() == interval  # pid 1: a child that inherited them


def test_a_beat_goes_out_at_most_every_half_interval(listener: Listener) -> None:
    now = [100.0]
    watchdog = notify.Watchdog(4.0, clock=lambda: now[0])
    sent = []
    for _ in range(9):  # a loop turning every 0.5 s for 4 s
        sent.append(watchdog.beat())
        now[0] += 0.5
    assert sent == [True, False, False, False, True, False, False, False, True]
    assert listener.received() == ["WATCHDOG=1"] * 3


def test_no_watchdog_no_beat(listener: Listener) -> None:
    assert not notify.keepalive()  # no WATCHDOG_USEC
    assert listener.received() == []


def test_keepalive_reads_the_environment(
    listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("WATCHDOG_USEC", "60000000")
    assert notify.keepalive()
    assert not notify.keepalive()  # the next one in 30 s
    assert listener.received() == ["WATCHDOG=1"]


def test_the_event_loop_task_beats_only_while_its_loop_turns(
    listener: Listener, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gateway's task: a loop that runs beats every half interval; a loop blocked by a call
    that does not return (time.sleep here) sends nothing until it turns again."""
    monkeypatch.setenv("WATCHDOG_USEC", "400000")  # 0.4 s: beats every 0.2 s

    async def run() -> tuple[int, int]:
        task = asyncio.get_running_loop().create_task(notify.keep_alive_while_the_loop_turns())
        await asyncio.sleep(1.0)
        turning = len(listener.received())
        time.sleep(1.0)  # the loop is stuck: the task cannot run
        stuck = len(listener.received())
        task.cancel()
        return turning, stuck

    turning, stuck = asyncio.run(run())
    assert 3 <= turning <= 7, turning  # ~5 in 1 s
    assert stuck == 0
