"""Shared by the appliance tests: the frozen executable: built once per source state, shared by the
xdist workers through a lock file, reused while the sources it was built from are unchanged."""

from __future__ import annotations

import fcntl
import hashlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIST = ROOT / "dist"
FROZEN = DIST / "roq" / "roq"
STAMP = DIST / "roq.sources-sha256"
LOCK = ROOT / "build" / "appliance-build.lock"
# PyInstaller takes ~25 s alone on 2 cores; the other xdist worker may be running tests meanwhile.
BUILD_TIMEOUT_S = 240.0


def sources_digest() -> str:
    """Hash of everything that goes into the executable (paths and contents)."""
    digest = hashlib.sha256()
    files = sorted((ROOT / "appliance" / "roq").rglob("*.py"))
    files += [ROOT / "packaging" / "roq.spec", ROOT / "pyproject.toml"]
    for path in files:
        digest.update(str(path.relative_to(ROOT)).encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def _up_to_date(digest: str) -> bool:
    return FROZEN.exists() and STAMP.exists() and STAMP.read_text().strip() == digest


def _build(digest: str) -> None:
    STAMP.unlink(missing_ok=True)
    # the compiled batch loops go into the executable as `make dist` builds it (`make setup`)
    native = [sys.executable, str(ROOT / "packaging" / "build_native.py")]
    subprocess.run(native, cwd=ROOT, timeout=BUILD_TIMEOUT_S, check=True)
    pyinstaller = Path(sys.executable).with_name("pyinstaller")
    command = [str(pyinstaller), "--noconfirm", "--log-level", "WARN", "--distpath", str(DIST)]
    command += ["--workpath", str(ROOT / "build" / "pyinstaller"), str(ROOT / "packaging/roq.spec")]
    started = time.monotonic()
    result = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S, check=False
    )
    if result.returncode != 0:
        pytest.fail(f"PyInstaller failed ({result.returncode}):\n{result.stderr[-4000:]}")
    STAMP.write_text(digest + "\n")
    print(f"built {FROZEN} in {time.monotonic() - started:.1f} s", file=sys.stderr)


def frozen_env() -> dict[str, str]:
    env = dict(os.environ)
    env.pop("NOTIFY_SOCKET", None)
    env["PYTHONUNBUFFERED"] = "1"
    return env


def build_frozen() -> Path:
    """dist/roq/roq, (re)built under an exclusive lock if the sources changed."""
    LOCK.parent.mkdir(parents=True, exist_ok=True)
    digest = sources_digest()
    with LOCK.open("w") as lock:
        # Blocks while the other worker builds; the build itself is bounded by BUILD_TIMEOUT_S.
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not _up_to_date(digest):
                _build(digest)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return FROZEN


def run_frozen(
    frozen: Path, *args: str, timeout_s: float = 60.0, input_text: str | None = None
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(frozen), *args],
        env=frozen_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
        check=False,
        input=input_text,
        stdin=subprocess.DEVNULL if input_text is None else None,
    )


def last_line(text: str) -> str:
    lines = [line for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""
