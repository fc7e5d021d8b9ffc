"""systemd units: `systemd-analyze verify` accepts each one, `security` scores each one low."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
from appliance_support import ROOT

pytestmark = pytest.mark.e2e

UNITS = sorted((ROOT / "systemd").glob("*.service"))
INSTALLED = "/opt/roq/roq"
MAX_EXPOSURE = 2.0


def unit_copy(unit: Path, tmp: Path, frozen: Path) -> Path:
    """verify insists that ExecStart exists here: point it at the freshly built executable."""
    copy = tmp / unit.name
    copy.write_text(unit.read_text().replace(INSTALLED, str(frozen)))
    return copy


def verify(path: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["systemd-analyze", "verify", str(path)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )


def test_there_are_four_units() -> None:
    assert [u.name for u in UNITS] == [
        "roq-gcm.service",
        "roq-host.service",
        "roq-http.service",
        "roq-zookeeper.service",
    ]


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_unit_verifies_without_warnings(unit: Path, tmp_path: Path, frozen_roq: Path) -> None:
    result = verify(unit_copy(unit, tmp_path, frozen_roq))
    # An unknown key is only a warning with rc 0, so stderr must be empty too.
    assert result.returncode == 0 and result.stderr == "", result.stderr


def test_verify_flags_a_broken_unit(tmp_path: Path, frozen_roq: Path) -> None:
    """The check above can fail: a bad value is reported on stderr, a missing binary by rc."""
    copy = unit_copy(ROOT / "systemd" / "roq-gcm.service", tmp_path, frozen_roq)
    copy.write_text(copy.read_text().replace("Type=notify", "Type=notifyy"))
    assert "notifyy" in verify(copy).stderr
    missing = str(tmp_path / "missing" / "roq")
    copy.write_text((ROOT / "systemd" / "roq-gcm.service").read_text().replace(INSTALLED, missing))
    assert verify(copy).returncode != 0


@pytest.mark.parametrize("unit", UNITS, ids=lambda u: u.name)
def test_unit_exposure_is_low(unit: Path) -> None:
    result = subprocess.run(
        ["systemd-analyze", "security", "--offline=true", str(unit)],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    match = re.search(r"Overall exposure level for \S+: ([0-9.]+)", result.stdout + result.stderr)
    assert match, result.stdout + result.stderr
    assert float(match.group(1)) <= MAX_EXPOSURE


@pytest.mark.parametrize("name", ["roq-gcm.service", "roq-host.service", "roq-http.service"])
def test_daemon_units_stop_restart_loops_on_config_errors(name: str) -> None:
    text = (ROOT / "systemd" / name).read_text()
    for line in (
        "Type=notify",
        "Restart=on-failure",
        "RestartPreventExitStatus=78",
        "KillMode=mixed",
        f"ExecStart={INSTALLED} ",
    ):
        assert re.search(rf"^{re.escape(line)}", text, re.M), line


# Issue 32: the daemons' watchdog. Each loop beats every WatchdogSec/2 (system/notify.py); the
# interval must leave room for the longest wait the loop makes on purpose.
WATCHDOG_MIN_S = {"roq-gcm.service": 60, "roq-host.service": 60, "roq-http.service": 10}


@pytest.mark.parametrize("name", sorted(WATCHDOG_MIN_S))
def test_daemon_units_have_a_watchdog(name: str) -> None:
    found = re.findall(r"^WatchdogSec=(\d+)s$", (ROOT / "systemd" / name).read_text(), re.M)
    assert len(found) == 1 and int(found[0]) >= WATCHDOG_MIN_S[name], found
