"""The README's tour run exactly as written (issue 32): its command blocks are read from README.md
(so this breaks when the README drifts) and run in order by bash, in a fresh directory, against
a `roq up` started there as the README says (`.venv/bin/roq up`, data in ./roq-data). The only
additions are the README's own ways to run beside another cluster: `roq up --port-base N` and
`ROQ_GCM` for the clients, and a `roq` on PATH (the README: put .venv/bin on your PATH).
Lines ending in `&` run in the background; each long-running command (the background ones
still running at the end, and a foreground one waiting out its --timeout) gets Ctrl-C (SIGINT)
and must stop within a second with exit 0 or 130 (README, "Command line"). The HTTP block
(curl on the fixed port 8080) is left to test_http.py."""

from __future__ import annotations

import os
import signal
import subprocess
import time
import uuid
from pathlib import Path

import pytest

from roq import limits
from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import PortBlocks, processes_with, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.timeout(360)]

README = Path(__file__).resolve().parents[2] / "README.md"
STOP_S = 1.0  # a client command, from Ctrl-C to its exit (README)
UP_STOP_S = limits.up_stop_s + 5.0  # `roq up`: its stop bound, and the exit on a loaded machine
LONG_WAIT = "--timeout"  # a foreground command with it waits: a user presses Ctrl-C


def tour_lines() -> list[str]:
    """The command lines of the tour's code blocks that run roq (not the HTTP block)."""
    section = README.read_text().split("## A two-minute tour", 1)[1].split("\n## ", 1)[0]
    blocks = section.split("```")[1::2]
    lines = [line for block in blocks if "curl " not in block for line in block.splitlines()]
    return [line for line in lines if line.strip() and not line.lstrip().startswith("#")]


class Tour:
    def __init__(self, tmp: Path, base: int):
        self.tmp = tmp
        bin_dir = tmp / "bin"
        bin_dir.mkdir()
        (bin_dir / "roq").write_text(f'#!/bin/sh\nexec {" ".join(roq_command())} "$@"\n')
        (bin_dir / "roq").chmod(0o755)
        self.env = {k: v for k, v in child_environment().items() if not k.startswith("ROQ_")}
        self.env["PATH"] = f"{bin_dir}:{self.env.get('PATH', '')}"
        self.env["ROQ_GCM"] = f"127.0.0.1:{base}"
        self.background: list[tuple[str, subprocess.Popen[bytes], Path]] = []
        self.stops: list[tuple[str, int, float]] = []  # (line, exit code, seconds to stop)

    def start(self, command: str, name: str) -> tuple[subprocess.Popen[bytes], Path]:
        """`command` by bash, which execs it: the signal reaches roq itself. Its output (what
        the command does not redirect) and its stderr go to a file, read while it runs."""
        err = self.tmp / f"{name}-{uuid.uuid4().hex[:6]}.err"
        with err.open("wb") as sink:
            process = subprocess.Popen(
                ["bash", "-c", f"exec {command}" if "|" not in command else command],
                cwd=self.tmp, env=self.env, stdin=subprocess.DEVNULL, stdout=sink,
                stderr=subprocess.STDOUT, start_new_session=True,
            )  # fmt: skip
        return process, err

    def interrupt(self, line: str, process: subprocess.Popen[bytes], err: Path) -> None:
        """Ctrl-C: stopped within STOP_S with exit 0 or 130."""
        started = time.monotonic()
        process.send_signal(signal.SIGINT)
        try:
            code = process.wait(timeout=30)
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait(10)
        took = time.monotonic() - started
        self.stops.append((line, code, took))
        assert code in (0, 130) and took < STOP_S, (line, code, f"{took:.2f} s", _text(err))

    def run(self, line: str) -> subprocess.CompletedProcess[str]:
        command, _, comment = (part.strip() for part in line.partition("#"))
        if command.endswith("&"):
            process, err = self.start(command.rstrip("& "), "background")
            # each says on stderr once it is in (subscribed, consuming, a worker)
            wait_for(lambda: _text(err) or process.poll() is not None, 60, f"{line!r} started")
            self.background.append((line, process, err))
            return subprocess.CompletedProcess(command, 0, "", "")
        if command.startswith("wc "):  # the background reader has all it waits for
            _, reader, err = self.background[0]
            assert reader.wait(timeout=60) == 0, _text(err)
        if LONG_WAIT in command:
            process, err = self.start(command, "foreground")
            wait_for(lambda: "subscribed" in _text(err), 60, f"{line!r} subscribed")
            self.interrupt(line, process, err)
            return subprocess.CompletedProcess(command, 0, "", "")
        done = subprocess.run(["bash", "-c", command], cwd=self.tmp, env=self.env, text=True,
                              capture_output=True, timeout=120, check=False)  # fmt: skip
        assert done.returncode == 0, (line, done.stdout[-2000:], done.stderr[-2000:])
        if command.startswith("wc "):
            assert done.stdout.split() == comment.split()[:2], (line, done.stdout)
        if comment.startswith("request/response: prints "):
            assert done.stdout.strip() == comment.split()[2], (line, done.stdout)
        return done

    def stop_background(self) -> None:
        for line, process, err in self.background:
            if process.poll() is None:
                self.interrupt(line, process, err)
            else:
                assert process.returncode == 0, (line, _text(err))


def _text(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""


def test_the_readme_tour_runs_as_written_and_every_command_stops_on_ctrl_c(
    tmp_path: Path, port_blocks: PortBlocks
):
    lines = tour_lines()
    assert "roq queue create q1" in lines[0], lines  # the tour it was written against
    commands = [line.partition("#")[0].strip() for line in lines]
    assert any(c.endswith("&") and c.startswith("roq work") for c in commands), commands
    base = port_blocks.take(2000)  # --port-base: base .. base + 1000 + its exchanges' ports
    tour = Tour(tmp_path, base)
    up, up_err = tour.start(f"roq up --port-base {base}", "up")
    began = time.monotonic()
    try:
        wait_for(lambda: "roq is up" in _text(up_err) or up.poll() is not None, 90, "roq up")
        assert up.poll() is None, _text(up_err)
        # what roq up tells the user to type for its clients, as the README says too
        assert f"export ROQ_GCM=127.0.0.1:{base}\n" in _text(up_err), _text(up_err)
        for line in lines:
            tour.run(line)
        tour.stop_background()
    finally:
        for _, process, _ in tour.background:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
        stopping = time.monotonic()
        up.send_signal(signal.SIGINT)  # Ctrl-C in the `make run` terminal
        try:
            code = up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            code = up.wait(10)
        up_took = time.monotonic() - stopping
        for pid in processes_with(str(tmp_path / "roq-data")):  # its ZooKeeper: own session
            os.kill(pid, signal.SIGKILL)
    print(f"tour: {time.monotonic() - began:.1f} s; stops: "
          f"{[(line.split('#')[0].strip(), c, round(t, 2)) for line, c, t in tour.stops]}; "
          f"roq up stopped in {up_took:.1f} s")  # fmt: skip
    assert code == 0 and up_took < UP_STOP_S, (code, up_took, _text(up_err)[-3000:])
    assert len(tour.stops) >= 2  # at least the `--exec` worker and the service worker
