"""How a daemon's main loop ends on an error: a roq error passes as it is (its own exit code and
one line), anything else is a bug, logged with its traceback, exit 70."""

from __future__ import annotations

import logging

import pytest
import typer

from roq.cli.common import serving
from roq.errors import EXIT_SOFTWARE, PortInUse


def test_an_unexpected_error_is_logged_with_its_traceback_and_exits_70(caplog):
    caplog.set_level(logging.ERROR, logger="roq")
    with pytest.raises(typer.Exit) as stopped, serving("exchange q1/x1"):
        raise ValueError("embedded null byte")
    assert stopped.value.exit_code == EXIT_SOFTWARE == 70
    [record] = caplog.records
    assert record.getMessage() == "exchange q1/x1 stopped by an unexpected error"
    assert record.exc_info is not None and record.exc_info[0] is ValueError


def test_a_roq_error_passes_unchanged():
    with pytest.raises(PortInUse), serving("host h1"):
        raise PortInUse("port 6000 on 127.0.0.1 is already in use")
