"""What a process reports about itself and its machine: CPU share, resident memory, load.

Read from /proc (Linux) and `os.times`; nothing here blocks or allocates much, so the exchange
can call it once per statistics period from its main loop.
"""

from __future__ import annotations

import os
import resource
import time

_PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    """Current resident set size (ru_maxrss would be the peak, which hides a shrinking heap)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE_BYTES
    except (OSError, ValueError, IndexError):
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def tree_rss_bytes(pid: int) -> int:
    """The resident memory (VmRSS) of process `pid` and of all its descendants, from /proc; 0
    for a process gone. Children are found through /proc/PID/task/TID/children."""
    total, seen, todo = 0, set(), [pid]
    while todo:
        current = todo.pop()
        if current in seen:
            continue
        seen.add(current)
        total += _vm_rss_bytes(current)
        todo.extend(_children(current))
    return total


def _vm_rss_bytes(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status", "rb") as status:
            for line in status:
                if line.startswith(b"VmRSS:"):
                    return int(line.split()[1]) * 1024  # in kB
    except (OSError, ValueError, IndexError):
        pass
    return 0  # gone, or a zombie (no VmRSS)


def _children(pid: int) -> list[int]:
    found: list[int] = []
    try:
        for task in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{task}/children", "rb") as children:
                found.extend(int(child) for child in children.read().split())
    except (OSError, ValueError):
        pass
    return found


def machine_cores() -> int:
    """The cores this process may run on (its CPU affinity, which taskset and cpusets narrow),
    at least 1."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def machine_memory_bytes() -> int:
    """The machine's memory (MemTotal of /proc/meminfo); 0 when it cannot be read."""
    try:
        with open("/proc/meminfo", "rb") as meminfo:
            for line in meminfo:
                if line.startswith(b"MemTotal:"):
                    return int(line.split()[1]) * 1024  # in kB
    except (OSError, ValueError, IndexError):
        pass
    return 0


def load_average() -> float:
    try:
        return os.getloadavg()[0]
    except OSError:
        return 0.0


class CpuMeter:
    """Fraction of one core this process used since the previous `sample()`."""

    def __init__(self) -> None:
        self._cpu = self._process_seconds()
        self._wall = time.monotonic()

    @staticmethod
    def _process_seconds() -> float:
        times = os.times()
        return times.user + times.system

    def sample(self) -> float:
        cpu, wall = self._process_seconds(), time.monotonic()
        elapsed = wall - self._wall
        share = (cpu - self._cpu) / elapsed if elapsed > 0 else 0.0
        self._cpu, self._wall = cpu, wall
        return round(share, 4)
