"""Fencing's lease (system/lease.py, host/fencing.py): what the host writes, what a child reads,
and that the host renews only on the session whose assignments it checked (a real ZooKeeper)."""

from __future__ import annotations

import logging
import os
import struct
import time
from pathlib import Path

import pytest

from roq import limits
from roq.coordination import session
from roq.host.fencing import LeaseKeeper, lease_path, lease_seconds
from roq.system.lease import Fence, LeaseReader, LeaseWriter


def test_a_child_reads_what_the_host_grants_and_a_revoked_lease_is_expired(tmp_path: Path) -> None:
    path = tmp_path / "run" / "h1.lease"
    reader = LeaseReader(str(path))
    assert reader.read() == 0.0  # no file yet: expired
    writer = LeaseWriter(path)
    assert reader.read() == 0.0  # created expired
    until = time.monotonic() + 2.0
    writer.grant(until)
    assert reader.read() == until
    writer.grant(0.0)
    assert reader.read() == 0.0
    writer.close()
    reader.close()


def test_a_torn_or_short_lease_file_keeps_the_last_good_value(tmp_path: Path) -> None:
    path = tmp_path / "h1.lease"
    writer = LeaseWriter(path)
    writer.grant(100.0)
    reader = LeaseReader(str(path))
    assert reader.read() == 100.0
    os.pwrite(os.open(path, os.O_WRONLY), struct.pack("<dd", 200.0, 100.0), 0)  # half written
    assert reader.read() == 100.0
    os.truncate(path, 3)  # garbage: never a longer lease
    assert reader.read() == 100.0
    writer.grant(300.0)
    assert reader.read() == 300.0


def test_a_fence_logs_once_when_it_closes_and_once_when_it_opens(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    path = tmp_path / "h1.lease"
    writer = LeaseWriter(path)
    fence = Fence(str(path), "monitor q1")
    now = time.monotonic()
    writer.grant(now + 10)
    assert fence.acting(now) and fence.acting(now + 1)
    assert not fence.acting(now + 10)  # the lease ends at exactly lease_until
    assert not fence.acting(now + 11)
    writer.grant(now + 20)
    assert fence.acting(now + 12) and fence.acting(now + 13)
    lines = [r.getMessage() for r in caplog.records if "monitor q1" in r.getMessage()]
    assert len(lines) == 2, lines
    assert "fenced" in lines[0] and "renewed" in lines[1]
    assert fence.times_fenced == 1
    assert Fence("", "by hand").acting(now)  # no host, no lease: always acts


def test_the_lease_is_shorter_than_the_session() -> None:
    assert 0 < limits.host_lease_session_share < 1
    assert lease_seconds(4_000) < 4.0
    assert lease_path("/var/lib/roq", "h/1").parent == Path("/var/lib/roq")


def test_the_host_renews_only_on_the_confirmed_session(tmp_path: Path, zookeeper: str) -> None:
    zk = session.connect(zookeeper, 4_000)
    keeper = LeaseKeeper(zk, tmp_path / "h1.lease", lease_seconds(4_000), "h1")
    reader = LeaseReader(str(keeper.path))
    try:
        assert not keeper.renew()  # nothing confirmed yet: the lease stays expired
        assert reader.read() == 0.0
        before = time.monotonic()
        assert keeper.confirm()
        granted = reader.read()
        assert before + keeper.lease_s <= granted <= time.monotonic() + keeper.lease_s
        keeper.suspend()  # the session expired (kazoo's LOST)
        assert not keeper.renew()
        assert reader.read() == granted
        keeper._confirmed = (session.session_id(zk) or 0) + 1  # a session that is not this one
        assert not keeper.renew()
        assert keeper.confirm()  # the host checked its assignments on this session
        assert reader.read() > granted
    finally:
        session.close(zk)
    assert not keeper.renew()  # no session: no renewal
    keeper.stop()
    assert reader.read() == 0.0  # a stopping host revokes the lease
