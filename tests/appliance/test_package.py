"""Packaging (issue 32): the docs promise `pip install 'roq[analytics]'`. `python -m build` makes
the sdist and, from it, the wheel; the wheel installs into a clean venv with its dependencies and
the README tour's first commands run from that venv's `roq`, with nothing of this checkout on the
path.

The build, the venv and pip's cache are all under the test's tmp directory: nothing is cached
elsewhere, so each run builds and installs afresh (about a minute; pip reaches the package index
for the build's setuptools and roq's dependencies, as a user's `pip install` would).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import zipfile
from pathlib import Path

import pytest
from appliance_support import ROOT

from roq.testing.cluster import PortBlocks, processes_with, wait_for

pytestmark = pytest.mark.integration

PIP_TIMEOUT_S = 300.0  # build (its isolated setuptools) and install, each, on a loaded machine
UP_TIMEOUT_S = 60.0
# Issue 32 asks every process of `roq up` gone within 5 s of SIGTERM; the bound here leaves room
# for a loaded machine (tests/integration/test_resume.py measures the stop itself).
GONE_WITHIN_S = 15.0
# What a build, the docs and the shipped configuration need, beside the package's sources.
SDIST_MUST_HOLD = [
    "pyproject.toml", "README.md", "MANIFEST.in", "Makefile",
    "docs/architecture.md", "docs/configuration.md", "docs/operations.md", "docs/deploy.md",
    "config/GCM.properties", "config/HCM.properties", "config/supervisord.conf",
    "systemd/roq-gcm.service", "systemd/roq-host.service", "systemd/roq-http.service",
    "packaging/roq.spec", "ami/roq.pkr.hcl", "tests/conftest.py",
]  # fmt: skip
_SKIPPED_IN_COPY = shutil.ignore_patterns(
    ".venv", "build", "dist", "roq-data", "*.egg-info", "__pycache__", ".*_cache", ".hypothesis",
    "benchmarks", ".git",
)  # fmt: skip


def _clean_env(tmp: Path, venv: Path | None = None) -> dict[str, str]:
    """This checkout off the path (PYTHONPATH names its sources), pip's cache in tmp."""
    # nor the ROQ_* settings an earlier test of this worker left (another cluster's credentials,
    # its GCM, ZooKeeper TLS off): the wheel's roq runs as a new user's would
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PYTHONPATH", "VIRTUAL_ENV") and not k.startswith("ROQ_")
    }
    env.pop("NOTIFY_SOCKET", None)
    env["PIP_CACHE_DIR"] = str(tmp / "pip-cache")
    env["PYTHONUNBUFFERED"] = "1"
    if venv is not None:
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        env["VIRTUAL_ENV"] = str(venv)
    return env


def _run(
    command: list[str], env: dict[str, str], cwd: Path, timeout_s: float
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        command, env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout_s,
        stdin=subprocess.DEVNULL, check=False,
    )  # fmt: skip


def _build(tmp: Path) -> tuple[Path, Path]:
    """The sdist and the wheel built from it (`python -m build`'s default), from a copy of the
    sources: setuptools writes its egg-info and build/ beside what it builds."""
    source = tmp / "src"
    shutil.copytree(ROOT, source, ignore=_SKIPPED_IN_COPY)
    out = tmp / "dist"
    done = _run([sys.executable, "-m", "build", "--outdir", str(out), str(source)],
                _clean_env(tmp), tmp, PIP_TIMEOUT_S)  # fmt: skip
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (sdist,) = out.glob("roq-*.tar.gz")
    (wheel,) = out.glob("roq-*-py3-none-any.whl")
    return sdist, wheel


def _package_sources() -> set[str]:
    package = ROOT / "appliance"
    return {p.relative_to(package).as_posix() for p in (package / "roq").rglob("*.py")}


def _check_sdist(sdist: Path) -> None:
    with tarfile.open(sdist) as archive:
        top = sdist.name.removesuffix(".tar.gz")
        names = {name.removeprefix(f"{top}/") for name in archive.getnames()}
    missing = [name for name in SDIST_MUST_HOLD if name not in names]
    missing += sorted(f"appliance/{s}" for s in _package_sources() if f"appliance/{s}" not in names)
    assert not missing, f"{sdist.name} lacks {missing}"


def _check_wheel(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        (entry_points,) = (n for n in names if n.endswith(".dist-info/entry_points.txt"))
        scripts = archive.read(entry_points).decode()
    assert not sorted(_package_sources() - names), f"{wheel.name} lacks package modules"
    assert "roq = roq.cli:main" in scripts, scripts


def _venv_with(wheel: Path, tmp: Path) -> Path:
    venv = tmp / "venv"
    made = _run([sys.executable, "-m", "venv", str(venv)], _clean_env(tmp), tmp, 120)
    assert made.returncode == 0, made.stderr
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", str(wheel)]
    installed = _run(pip, _clean_env(tmp), tmp, PIP_TIMEOUT_S)
    assert installed.returncode == 0, installed.stdout[-3000:] + installed.stderr[-3000:]
    return venv


def _start_up(venv: Path, tmp: Path, base: int) -> subprocess.Popen[bytes]:
    with (tmp / "up.log").open("wb") as log_file:
        return subprocess.Popen(
            [str(venv / "bin" / "roq"), "up", "--port-base", str(base)],
            env=_clean_env(tmp, venv), cwd=tmp, stdin=subprocess.DEVNULL, stdout=log_file,
            stderr=subprocess.STDOUT, start_new_session=True,
        )  # fmt: skip


def _stop_up(process: subprocess.Popen[bytes], data: str) -> float:
    """SIGTERM to `roq up`; seconds until none of its processes is left (inf: killed)."""
    sent = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        wait_for(lambda: process.poll() is not None and not processes_with(data),
                 GONE_WITHIN_S, "every process of roq up to exit")  # fmt: skip
    except TimeoutError:
        for pid in processes_with(data):
            os.kill(pid, signal.SIGKILL)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=10)
        return float("inf")
    return time.monotonic() - sent


def test_wheel_from_sdist_installs_in_a_clean_venv_and_runs_the_tour(
    tmp_path: Path, port_blocks: PortBlocks
) -> None:
    sdist, wheel = _build(tmp_path)
    _check_sdist(sdist)
    _check_wheel(wheel)
    venv = _venv_with(wheel, tmp_path)
    env = _clean_env(tmp_path, venv)

    def roq(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(venv / "bin" / "roq"), *args], env=env, cwd=tmp_path, input=stdin or "",
            capture_output=True, text=True, timeout=90, check=False,
        )  # fmt: skip

    where = _run([str(venv / "bin" / "python"), "-c", "import roq; print(roq.__file__)"],
                 env, tmp_path, 60)  # fmt: skip
    assert where.stdout.startswith(str(venv)), where.stdout + where.stderr  # not this checkout's
    helped = roq("--help")
    assert helped.returncode == 0 and "queue" in helped.stdout, helped.stderr

    base = port_blocks.take(1200)  # the layout spans base .. base + 1000 + the exchanges'
    gcm = f"127.0.0.1:{base}"
    up = _start_up(venv, tmp_path, base)
    data = str(tmp_path)  # in the command line of each: the venv, the data directory
    try:
        up_log = tmp_path / "up.log"
        wait_for(lambda: "roq is up" in up_log.read_text() or up.poll() is not None,
                 UP_TIMEOUT_S, "roq up to serve")  # fmt: skip
        assert up.poll() is None, up_log.read_text()
        made = roq("queue", "create", "q1", "--gcm", gcm)
        assert made.returncode == 0, made.stderr + up_log.read_text()[-3000:]
        published = roq("pub", "q1", "--acks", "leader", "--gcm", gcm, stdin="hello\nworld\n")
        assert published.returncode == 0, published.stderr
        read = roq("sub", "q1", "--from-beginning", "--count", "2", "--timeout", "30",
                   "--gcm", gcm)  # fmt: skip
        assert read.returncode == 0, read.stderr
        assert read.stdout.splitlines() == ["hello", "world"]
    finally:
        gone_s = _stop_up(up, data)
    print(f"every process of roq up gone {gone_s:.2f} s after SIGTERM", file=sys.stderr)
    assert gone_s <= GONE_WITHIN_S, (tmp_path / "up.log").read_text()[-3000:]
    assert up.returncode == 0, (tmp_path / "up.log").read_text()[-3000:]
