"""How many exchanges a host runs: `exchange.max.perhost`, or derived from the machine when it is
0 (the default). A fixed default was either too small for a large machine (RoQ's 3 were used up by
the README's tour) or too large for a small one; the machine's cores and memory say which."""

from __future__ import annotations

from dataclasses import dataclass

from roq import limits
from roq.system import procstat


@dataclass(frozen=True)
class Capacity:
    exchanges: int
    why: str  # how the number came about, for the host's log and its no_capacity refusals


def derive(cores: int, memory_bytes: int, memory_log_bytes: int) -> Capacity:
    """min(cores x per-core, memory / (memory log + per-exchange overhead)), within the floor
    and the ceiling. Unknown memory (0) leaves the cores alone to decide."""
    by_cores = cores * limits.host_exchanges_per_core
    budget = memory_log_bytes + limits.host_exchange_memory_bytes
    by_memory = memory_bytes // budget if memory_bytes > 0 else by_cores
    exchanges = min(by_cores, by_memory)
    exchanges = max(limits.host_exchanges_floor, min(limits.host_exchanges_ceiling, exchanges))
    gib, mib = 2**30, 2**20
    why = (
        f"derived from this machine: min({cores} cores x {limits.host_exchanges_per_core}, "
        f"{memory_bytes / gib:.1f} GiB / {budget // mib} MiB per exchange), at least "
        f"{limits.host_exchanges_floor}"
    )
    return Capacity(exchanges, why)


def of_host(configured: int, memory_log_bytes: int) -> Capacity:
    """The host's limit: `configured` when set (> 0), else derived from this machine."""
    if configured > 0:
        return Capacity(configured, "as configured")
    return derive(procstat.machine_cores(), procstat.machine_memory_bytes(), memory_log_bytes)
