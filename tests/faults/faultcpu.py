"""CPU saturation of one machine of `faultnet` (issue 30 item 6): its roq processes and a few
busy loops in one CPU cgroup (v1, `cpu` controller) whose quota is a small share of a core.

A namespace shares the host's two cores with the other machines, so busy loops alone do not
starve roq there: the kernel's fair scheduler wakes a sleeping thread ahead of the loops. A
quota does what an overloaded machine does: the group runs until the loops (and roq) have
spent it, then nothing in it runs until the next period, so every roq process of the machine
is frozen for most of each period, and runs late in bursts. ZooKeeper's server is left out:
the test is about roq's failure detection, not the ensemble's (its session must stay alive).
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from faultnet import Machine

CPU_ROOT = Path("/sys/fs/cgroup/cpu")
PERIOD_US = 1_000_000  # the longest period v1 allows: freezes of most of a second
QUOTA_US = 50_000  # 5 % of one core for the machine's roq processes and the loops together
BUSY_LOOPS = 2
ZOOKEEPER_MAIN = b"QuorumPeerMain"


class CpuLimitUnavailable(RuntimeError):
    """No writable cgroup v1 `cpu` hierarchy on this machine."""


@dataclass
class Saturation:
    machine: Machine
    group: Path = field(init=False)
    loops: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.group = CPU_ROOT / f"roq-sat-{os.getpid()}-{self.machine.name}"

    def start(self) -> list[int]:
        """Limit the machine's roq processes and start the busy loops inside the limit; the pids
        moved (processes a roq process starts later inherit the group)."""
        unavailable = why_unavailable()
        if unavailable:
            raise CpuLimitUnavailable(unavailable)
        self.group.mkdir()
        (self.group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (self.group / "cpu.cfs_quota_us").write_text(str(QUOTA_US))
        for _ in range(BUSY_LOOPS):
            loop = [*self.machine.exec_prefix(), sys.executable, "-c", "while 1: pass"]
            self.loops.append(subprocess.Popen(loop, stdin=subprocess.DEVNULL))
        moved = [pid for pid in self.machine.pids() if not _is_zookeeper(pid)]
        for pid in moved:
            _move(pid, self.group)
        return moved

    def throttled(self) -> tuple[int, int]:
        """(periods in which the quota ran out and the group was frozen, periods), so far."""
        stat = dict(
            line.split(" ", 1) for line in (self.group / "cpu.stat").read_text().splitlines()
        )
        return int(stat.get("nr_throttled", 0)), int(stat.get("nr_periods", 0))

    def stop(self) -> None:
        """Loops killed, every process back in the root group, the group removed: each step is
        attempted whatever the one before did."""
        for loop in self.loops:
            with contextlib.suppress(ProcessLookupError):
                loop.send_signal(signal.SIGKILL)
            with contextlib.suppress(subprocess.TimeoutExpired):
                loop.wait(timeout=10)
        with contextlib.suppress(OSError):
            for pid in (self.group / "cgroup.procs").read_text().split():
                _move(int(pid), CPU_ROOT)
        with contextlib.suppress(OSError):
            self.group.rmdir()


def why_unavailable() -> str:
    """Why no CPU quota can be set here ("" when one can): cgroup v2 only, or no root."""
    if not (CPU_ROOT / "cgroup.procs").exists():
        return f"{CPU_ROOT} is not a cgroup v1 cpu hierarchy"
    if not os.access(CPU_ROOT, os.W_OK):
        return f"{CPU_ROOT} is not writable (root needed)"
    return ""


def _move(pid: int, group: Path) -> None:
    with contextlib.suppress(ProcessLookupError, OSError):  # it exited meanwhile
        (group / "cgroup.procs").write_text(str(pid))


def _is_zookeeper(pid: int) -> bool:
    try:
        return ZOOKEEPER_MAIN in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
