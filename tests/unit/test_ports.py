"""The port map (protocol/ports.py): RoQ's offsets are kept, blocks do not overlap, and one
endpoint of a block gives every other."""

from __future__ import annotations

import pytest

from roq.client.locate import MonitorAddress
from roq.protocol import ports
from roq.protocol.ports import ExchangePort, GcmPort, MonitorPort, StatPort


def test_roq_offsets_are_kept():
    assert (GcmPort.TOPOLOGY, GcmPort.ADMIN, GcmPort.BROADCAST) == (0, 3, 5)
    assert [int(p) for p in MonitorPort] == [0, 1, 2, 3, 4, 5]
    assert (MonitorPort.PLACEMENT, MonitorPort.RULES, MonitorPort.CONTROL) == (1, 4, 5)
    assert (StatPort.IN, StatPort.KPI) == (0, 1)
    assert (ExchangePort.FRONT, ExchangePort.BACK, ExchangePort.CONTROL, ExchangePort.LOG) == (
        0, 1, 2, 3,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("offsets", "width"),
    [
        (GcmPort, ports.GCM_WIDTH),
        (MonitorPort, ports.MONITOR_WIDTH),
        (StatPort, ports.STAT_WIDTH),
        (ExchangePort, ports.EXCHANGE_WIDTH),
    ],
)
def test_every_offset_lies_inside_its_block(offsets, width):
    assert all(0 <= offset < width for offset in offsets)


def test_host_blocks_sit_side_by_side_without_overlap():
    for role, width in ports.HOST_BLOCK_WIDTH.items():
        blocks = [ports.host_block(role, 6000, slot) for slot in range(4)]
        assert [len(block) for block in blocks] == [width] * 4
        assert [p for block in blocks for p in block] == list(range(6000, 6000 + 4 * width))


def test_endpoints_from_a_base():
    assert ports.port_at(5000, GcmPort.ADMIN) == 5003
    assert ports.endpoint_at("10.0.0.1", 6000, ExchangePort.BACK) == "tcp://10.0.0.1:6001"


def test_sibling_derives_one_endpoint_of_a_block_from_another():
    back = "tcp://10.0.0.1:6005"
    assert ports.sibling(back, ExchangePort.BACK, ExchangePort.LOG) == "tcp://10.0.0.1:6007"
    assert ports.sibling(back, ExchangePort.BACK, ExchangePort.FRONT) == "tcp://10.0.0.1:6004"
    assert ports.sibling("tcp://h:5801", StatPort.KPI, StatPort.IN) == "tcp://h:5800"
    with pytest.raises(TypeError, match="different blocks"):
        ports.sibling(back, ExchangePort.BACK, MonitorPort.RULES)  # type: ignore[type-var]
    with pytest.raises(ValueError, match="PORT"):
        ports.sibling("tcp://h", ExchangePort.BACK, ExchangePort.LOG)


def test_a_monitor_address_gives_the_monitor_and_stat_endpoints():
    monitor = MonitorAddress("tcp://10.0.0.1:5500", "tcp://10.0.0.1:5801")
    assert monitor.at(MonitorPort.PLACEMENT) == "tcp://10.0.0.1:5501"
    assert monitor.at(MonitorPort.CONTROL) == "tcp://10.0.0.1:5505"
    assert monitor.stat_in == "tcp://10.0.0.1:5800"
    assert MonitorAddress("tcp://10.0.0.1:5500").stat_in == ""
