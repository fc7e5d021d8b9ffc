"""The replica side of replication (`ReplicaStore`), without sockets: a write frame carries
several whole batches, and a frame with one bad batch changes nothing."""

from __future__ import annotations

import struct
from pathlib import Path

import pytest
from logutil import batch, seqs

from roq.errors import CorruptRecord, InvalidOffset
from roq.log import LogSettings, ReadStatus, segment_name
from roq.replication import OK, RESTART, WRITE, WRITTEN, ReplicaStore

LEADER = b"127.0.0.1-6000-aaaaaa"


def _write(store: ReplicaStore, offset: int, batches: bytes) -> list[bytes]:
    return store.handle([WRITE, LEADER, struct.pack("<Q", offset), batches])


def test_a_frame_of_several_batches_lands_whole_and_in_order(tmp_path: Path) -> None:
    store = ReplicaStore(tmp_path, "q", "127.0.0.1-6004-bbbbbb", LogSettings(memory_bytes=0))
    first, second = batch(0) + batch(3), batch(6, records=5)
    reply = _write(store, 0, first)
    assert reply[:3] == [WRITTEN, LEADER, OK]
    reply = _write(store, len(first), second)
    end = struct.unpack("<Q", reply[3])[0]
    assert reply[2] == OK and end == len(first) + len(second)
    copy = store.logs[LEADER.decode()]
    assert seqs(bytes(copy.read(0, 1 << 20).data)) == list(range(11))
    store.close()


def test_a_frame_with_a_corrupt_batch_writes_none_of_it(tmp_path: Path) -> None:
    store = ReplicaStore(tmp_path, "q", "127.0.0.1-6004-bbbbbb", LogSettings(memory_bytes=0))
    good = batch(0)
    bad = bytearray(batch(3))
    bad[-1] ^= 0xFF  # a payload byte: the CRC no longer matches
    with pytest.raises(CorruptRecord):
        _write(store, 0, good + bytes(bad))
    assert store.logs[LEADER.decode()].end_offset == 0
    store.close()


def test_restart_empties_the_copy_and_goes_on_at_the_leaders_start(tmp_path: Path) -> None:
    store = ReplicaStore(tmp_path, "q", "127.0.0.1-6004-bbbbbb", LogSettings(memory_bytes=4096))
    old = batch(0) + batch(3)
    _write(store, 0, old)
    start = 10_000  # where retention left the leader's log: far past the copy's end
    reply = store.handle([RESTART, LEADER, struct.pack("<Q", start)])
    assert reply[2] == OK and struct.unpack("<Q", reply[3])[0] == start
    again = store.handle([RESTART, LEADER, struct.pack("<Q", start)])  # repeated: no change
    assert again == reply
    new = batch(100, records=2)
    assert _write(store, start, new)[2] == OK
    copy = store.logs[LEADER.decode()]
    assert (copy.start_offset, copy.end_offset) == (start, start + len(new))
    assert copy.read(0, 1 << 20).status is ReadStatus.EVICTED
    assert seqs(bytes(copy.read(start, 1 << 20).data)) == [100, 101]
    store.close()
    reopened = ReplicaStore(tmp_path, "q", "127.0.0.1-6004-bbbbbb", LogSettings(memory_bytes=0))
    assert reopened.ends() == {LEADER.decode(): start + len(new)}
    assert [p.name for p in sorted(copy.directory.glob("*.log"))] == [segment_name(start)]
    reopened.close()


def test_restart_at_or_below_the_end_is_refused_by_the_log(tmp_path: Path) -> None:
    store = ReplicaStore(tmp_path, "q", "127.0.0.1-6004-bbbbbb", LogSettings(memory_bytes=0))
    _write(store, 0, batch(0))
    copy = store.logs[LEADER.decode()]
    with pytest.raises(InvalidOffset):
        copy.restart_at(copy.end_offset)
    store.close()
