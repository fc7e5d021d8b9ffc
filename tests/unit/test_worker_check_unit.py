"""`roq serve --check-available` (JLupin's checkAvailableScript): the command's verdict."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from roq.cli.requests import CheckFailed, check_available
from roq.client.requests import _Availability


def test_exit_0_is_available_and_any_other_exit_says_why(tmp_path: Path):
    assert check_available("true")
    with pytest.raises(CheckFailed, match=r"exit 3: busy"):
        check_available("echo busy; exit 3")


def test_a_missing_or_non_executable_script_is_not_available_not_a_crash(tmp_path: Path):
    with pytest.raises(CheckFailed, match=r"exit 127: .*not found"):
        check_available(str(tmp_path / "missing.sh"))
    script = tmp_path / "plain.sh"
    script.write_text("#!/bin/sh\nexit 0\n")  # not executable
    with pytest.raises(CheckFailed, match=r"exit 126: .*[Pp]ermission denied"):
        check_available(str(script))


def test_a_check_over_its_timeout_is_ended_and_not_available():
    started = time.monotonic()
    with pytest.raises(CheckFailed, match=r"longer than 0\.3 s"):
        check_available("sleep 30", timeout_s=0.3)
    assert time.monotonic() - started < 5


def test_a_check_that_raises_counts_as_not_available_and_is_logged_once(caplog):
    availability = _Availability()

    def broken() -> bool:
        raise CheckFailed("exit 1: down")

    for _ in range(3):
        availability.check(broken, "worker w")
    assert not availability.now
    assert [r.getMessage() for r in caplog.records].count(
        "worker w: the availability check says not available: CheckFailed: exit 1: down"
    ) == 1
    availability.check(lambda: True, "worker w")
    assert availability.now
