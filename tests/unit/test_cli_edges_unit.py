"""The parts of issue 32's client fixes that need no cluster: a signal inside an interruptible wait
ends it and outside only asks to stop; stdin lines past a message are bad input, read no further
than the bound; a request record is told from a message; `roq analytics` over nothing refuses;
a `roq work --exec` command running at a stop is ended at once."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import bson
import pytest

from roq import limits
from roq.analytics import submit
from roq.cli import work
from roq.cli.common import interruptible, stop_event
from roq.cli.data import _stdin_lines
from roq.errors import EXIT_DATAERR, EXIT_NOINPUT, BadInput, NoInput
from roq.protocol.messages.tasks import RequestMessage, request_of


@pytest.fixture
def stop() -> Iterator[threading.Event]:
    """`stop_event`'s handlers for this test only."""
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield stop_event()
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_a_signal_ends_an_interruptible_wait_and_only_asks_to_stop_outside(
    stop: threading.Event, signum: int
):
    os.kill(os.getpid(), signum)  # outside: the flag, read between messages
    assert stop.is_set()
    stop.clear()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt), interruptible(stop):
        threading.Timer(0.2, os.kill, (os.getpid(), signum)).start()
        time.sleep(30)  # a wait with nothing in flight: ended by the signal
    assert stop.is_set() and time.monotonic() - started < 5
    with pytest.raises(KeyboardInterrupt), interruptible(stop):  # stopped already: at once
        pytest.fail("entered")


class Reads(io.RawIOBase):
    """An endless line: counts what was read of it."""

    def __init__(self) -> None:
        self.read_bytes = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        buffer[:] = b"x" * len(buffer)
        self.read_bytes += len(buffer)
        return len(buffer)


def test_stdin_lines_past_a_message_are_bad_input_read_no_further_than_the_bound(
    stop: threading.Event,
):
    lines = io.BufferedReader(io.BytesIO(b"a\n\nb"))
    assert list(_stdin_lines(lines, stop)) == [b"a", b"", b"b"]
    exact = b"y" * limits.message_bytes_max
    assert list(_stdin_lines(io.BufferedReader(io.BytesIO(exact + b"\n")), stop)) == [exact]
    too_long = io.BytesIO(b"ok\n" + b"z" * (limits.message_bytes_max + 1) + b"\nnever\n")
    read = []
    with pytest.raises(BadInput, match="stdin line 2 is longer than a message") as refused:
        read.extend(_stdin_lines(io.BufferedReader(too_long), stop))
    assert read == [b"ok"] and "the 1 lines before it were sent" in str(refused.value)
    assert BadInput.exit_code == EXIT_DATAERR == 65


def test_an_endless_line_is_read_only_to_the_bound(stop: threading.Event):
    endless = Reads()
    with pytest.raises(BadInput, match="stdin line 1 is longer"):
        list(_stdin_lines(io.BufferedReader(endless), stop))
    assert endless.read_bytes < 2 * limits.message_bytes_max


def test_a_request_record_is_told_from_a_message():
    doc = bson.encode(RequestMessage("t1", "upper", 1, b"hello").encode())
    assert request_of(b"upper/", doc) == RequestMessage("t1", "upper", 1, b"hello")
    assert request_of(b"lower/", doc) is None  # not the service its key names
    assert request_of(b"upper", doc) is None  # not a service's key
    assert request_of(b"upper/", b"hello") is None  # a text line
    assert request_of(b"upper/", bson.encode({"Task": "t1"})) is None  # not a request


def test_analytics_refuses_a_missing_or_empty_log_directory(tmp_path: Path):
    pytest.importorskip("pyarrow")
    with pytest.raises(NoInput, match="does not exist") as missing:
        submit.check_input(str(tmp_path / "nope"))
    assert missing.value.exit_code == EXIT_NOINPUT == 66
    (tmp_path / "q1" / "x1").mkdir(parents=True)
    with pytest.raises(NoInput, match="holds no log segment"):
        submit.check_input(str(tmp_path))
    (tmp_path / "q1" / "x1" / f"{0:020d}.log").write_bytes(b"")
    assert submit.check_input(str(tmp_path)) == 1


def test_a_running_exec_command_is_ended_at_the_stop(stop: threading.Event):
    child = subprocess.Popen(
        "cat > /dev/null; sleep 30", shell=True, stdin=subprocess.PIPE, start_new_session=True
    )
    threading.Timer(0.3, stop.set).start()
    started = time.monotonic()
    assert work._fed_and_waited(child, b"payload" * 100_000, stop) == -1  # larger than a pipe
    assert time.monotonic() - started < 1.5
    assert child.poll() is not None
