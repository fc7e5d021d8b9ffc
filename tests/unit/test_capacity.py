"""A host's exchange limit follows its machine when exchange.max.perhost is 0 (issue 32 item 4:
the fixed default was used up by the README's tour)."""

from __future__ import annotations

import pytest

from roq import limits
from roq.host import capacity
from roq.system import procstat

GIB = 2**30
MEMORY_LOG = 64 * 2**20  # log.memory.bytes' default


@pytest.mark.parametrize(
    ("cores", "memory", "expected"),
    [
        (2, 24 * GIB, 16),  # cores decide: 2 x 8
        (16, 8 * GIB, 42),  # memory decides: 8 GiB / 192 MiB
        (1, 1 * GIB, 8),  # a small machine keeps the floor (the old fixed default)
        (512, 4096 * GIB, 1000),  # the key's bound
        (4, 0, 32),  # memory unknown: the cores alone
    ],
)
def test_the_derived_limit_is_the_smaller_of_cores_and_memory_within_floor_and_ceiling(
    cores: int, memory: int, expected: int
):
    found = capacity.derive(cores, memory, MEMORY_LOG)
    assert found.exchanges == expected
    assert f"{cores} cores" in found.why and "192 MiB per exchange" in found.why


def test_a_larger_memory_log_takes_more_memory_per_exchange():
    assert capacity.derive(64, 8 * GIB, 0).exchanges == 64  # 8 GiB / 128 MiB
    assert capacity.derive(64, 8 * GIB, 384 * 2**20).exchanges == 16  # 8 GiB / 512 MiB


def test_a_configured_limit_wins_and_0_reads_this_machine():
    assert capacity.of_host(3, MEMORY_LOG) == capacity.Capacity(3, "as configured")
    here = capacity.of_host(0, MEMORY_LOG)
    assert here == capacity.derive(
        procstat.machine_cores(), procstat.machine_memory_bytes(), MEMORY_LOG
    )
    assert limits.host_exchanges_floor <= here.exchanges <= limits.host_exchanges_ceiling
    assert procstat.machine_memory_bytes() > 0  # Linux: MemTotal is there
