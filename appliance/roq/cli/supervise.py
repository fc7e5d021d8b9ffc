"""`roq serve --memory-max MB`: JLupin's MEMORY_ERRORS (isRestartOnError, howManyTimes,
percentageGrowth; seed 003) for a request worker. The `roq serve` the operator started becomes a
supervisor: it runs the worker as a child `roq serve` (the same command line, told by
`ROQ_SERVE_SUPERVISED` that it is the worker) and reads the resident memory of the child and of
the --exec commands it runs (/proc). Past the threshold, the child is told to drain (SIGUSR1: it
takes no more requests, finishes and stores the running ones, leaves its group, exits 0) and is
started again with the threshold raised by the growth; past the restarts allowed, the supervisor
drains it and exits 1 naming the worker, and the unit's supervisor (systemd) decides."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

import typer

from roq import limits
from roq.system.procstat import tree_rss_bytes
from roq.system.spawn import child_environment, roq_command

SUPERVISED = "ROQ_SERVE_SUPERVISED"  # set in the worker child's environment
_WORKER_LINE = re.compile(rb"^roq serve: (worker \S+ of \S+)")
EXIT_MEMORY = 1  # past the restarts allowed


@dataclass(frozen=True)
class MemoryRule:
    """The threshold (MB), its growth at each restart (%) and the restarts allowed."""

    max_mb: float
    growth_pct: float = limits.serve_memory_growth_pct
    restarts: int = limits.serve_memory_restarts


def supervised() -> bool:
    """Whether this `roq serve` is the worker child of a supervising one."""
    return os.environ.get(SUPERVISED) == "1"


def drain_on_usr1() -> threading.Event:
    """Set by SIGUSR1: the supervisor asks its worker to finish what it runs and exit."""
    drain = threading.Event()
    signal.signal(signal.SIGUSR1, lambda _signum, _frame: drain.set())
    return drain


class _Child:
    """One worker child: its process, and its name as its stderr says (passed on as it is)."""

    def __init__(self) -> None:
        env = {**child_environment(), SUPERVISED: "1"}
        self.process = subprocess.Popen(roq_command(*sys.argv[1:]), env=env,
                                        stderr=subprocess.PIPE)  # fmt: skip
        self.name = f"worker process {self.process.pid}"  # until it says its name
        self._relay = threading.Thread(
            target=self._pass_stderr, name="roq-serve-stderr", daemon=True
        )
        self._relay.start()

    def _pass_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in iter(lambda: self.process.stderr.readline(  # type: ignore[union-attr]
                limits.serve_stderr_line_bytes_max), b""):  # fmt: skip
            found = _WORKER_LINE.match(line)
            if found:
                self.name = found.group(1).decode(errors="replace")
            sys.stderr.buffer.write(line)
            sys.stderr.buffer.flush()

    def rss_mb(self) -> float:
        return tree_rss_bytes(self.process.pid) / (1024 * 1024)

    def drain(self, stop: threading.Event) -> int:
        """SIGUSR1, then its exit code once it finished its running requests (SIGTERM passed
        on if we are stopped meanwhile; killed past the longest run and a margin)."""
        self.signal(signal.SIGUSR1)
        return self.wait(stop, limits.work_exec_timeout_s + limits.serve_drain_margin_s)

    def wait(self, stop: threading.Event, bound_s: float) -> int:
        deadline, told = time.monotonic() + bound_s, False
        while self.process.poll() is None:
            if stop.is_set() and not told:
                self.signal(signal.SIGTERM)
                told = True
            if time.monotonic() > deadline:
                self.signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.process.wait(limits.work_cli_stop_check_s)
        self._relay.join(limits.work_cli_stop_check_s)
        return self.process.returncode

    def signal(self, signum: int) -> None:
        with contextlib.suppress(ProcessLookupError):
            self.process.send_signal(signum)


def supervise(rule: MemoryRule, stop: threading.Event) -> int:
    """Run the worker child until it ends or we are stopped, restarting it past its memory
    threshold as `rule` says; the exit code."""
    threshold, restarts = rule.max_mb, 0
    while True:
        child = _Child()
        used = _watch(child, threshold, stop)
        if used is None:  # it ended (its --count, --timeout, an error) or we were stopped
            return child.wait(stop, limits.work_exec_timeout_s + limits.serve_drain_margin_s)
        if restarts >= rule.restarts:
            _say(f"{child.name}: memory {used:.0f} MB past its threshold {threshold:.0f} MB "
                 f"after {restarts} restarts (--memory-restarts): it finishes its running "
                 "requests and stops")  # fmt: skip
            child.drain(stop)
            return EXIT_MEMORY
        restarts += 1
        grown = threshold * (1 + rule.growth_pct / 100)
        _say(f"{child.name}: memory {used:.0f} MB past its threshold {threshold:.0f} MB "
             f"(--memory-max): it finishes its running requests and restarts (restart "
             f"{restarts} of {rule.restarts}; threshold now {grown:.0f} MB)")  # fmt: skip
        child.drain(stop)
        threshold = grown
        if stop.is_set():
            return 0


def _watch(child: _Child, threshold_mb: float, stop: threading.Event) -> float | None:
    """The child's memory once past `threshold_mb`; None once it ended or we were stopped."""
    while child.process.poll() is None and not stop.is_set():
        used = child.rss_mb()
        if used > threshold_mb:
            return used
        stop.wait(limits.serve_memory_check_s)
    return None


def _say(text: str) -> None:
    typer.echo(f"roq serve: {text}", err=True)
