"""The failure text `request.retry.pattern` is searched in (JLupin's exceptionStringToRepeat
matched the whole stack trace): the handler's `Type: message` and its whole traceback, bounded
with its oldest lines cut first; a command's `exit N: stderr` whole (client/requests.py)."""

from __future__ import annotations

import re

from roq import limits
from roq.client.requests import failure_text
from roq.errors import HandlerFailure


def _backend_call() -> None:
    raise ConnectionResetError("peer went away")


def _handler() -> None:
    try:
        _backend_call()
    except OSError as error:
        raise ValueError("request failed") from error


def _raised(function) -> BaseException:
    try:
        function()
    except Exception as error:
        return error
    raise AssertionError("it did not raise")


def test_the_text_holds_the_summary_and_the_whole_trace_with_its_cause():
    text = failure_text(_raised(_handler))
    assert text.startswith("ValueError: request failed\n")
    # a pattern on the cause or on a frame deep in the trace matches, as in JLupin
    assert re.search(r"ConnectionResetError: peer went away", text)
    assert re.search(r"in _backend_call", text)


def test_a_long_trace_keeps_the_summary_and_the_failing_frame():
    def chained() -> None:
        try:
            raise OSError("b" * 1500)
        except OSError as error:
            raise ValueError("a" * 600) from error

    text = failure_text(_raised(chained))
    assert len(text) <= limits.task_error_chars_max
    summary, trace = text.split("\n", 1)
    assert summary == "ValueError: " + "a" * 600
    assert trace.startswith("…") and "b" * 1500 not in trace  # the oldest lines were cut ...
    assert trace.endswith("ValueError: " + "a" * 600)  # ... the failing frame and line stay
    assert 'raise ValueError("a" * 600) from error' in trace


def test_a_commands_failure_is_its_exit_and_stderr_alone():
    assert failure_text(HandlerFailure("exit 3: disk full")) == "exit 3: disk full"
    assert len(failure_text(HandlerFailure("x" * 10_000))) == limits.task_error_chars_max
