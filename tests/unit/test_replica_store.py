"""Replication's two sides: the replica's `ReplicaStore` without sockets (a write frame carries
several whole batches, and a frame with one bad batch changes nothing), and a leader's
`Replicator` against it over real inproc sockets (a copy that fell behind retention)."""

from __future__ import annotations

import logging
import struct
from pathlib import Path
from typing import Any

import pytest
from logutil import batch, seqs, torn

from roq.errors import CorruptRecord, DecodeError, InvalidOffset
from roq.log import Log, LogSettings, ReadStatus, Retention, segment_name
from roq.replication import (
    OK,
    PROBE,
    REPLICA_LAG_S,
    RESTART,
    WRITE,
    WRITTEN,
    ReplicaStore,
    Replicator,
)
from roq.testing.cluster import wait_for
from roq.transport import Kind, new_context, wait_readable

LEADER = b"127.0.0.1-6000-aaaaaa"


def _assigned(store: ReplicaStore) -> ReplicaStore:
    """A store the monitor has told to copy LEADER's and fz-1's logs."""
    store.accept((LEADER.decode(), "fz-1"))
    return store


def _write(store: ReplicaStore, offset: int, batches: bytes) -> list[bytes]:
    return store.handle([WRITE, LEADER, struct.pack("<Q", offset), batches])


def test_a_frame_of_several_batches_lands_whole_and_in_order(tmp_path: Path) -> None:
    store = _assigned(
        ReplicaStore(tmp_path, "q", "127.0.0.1-6004-bbbbbb", LogSettings(memory_bytes=0))
    )
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
    store = _assigned(
        ReplicaStore(tmp_path, "q", "127.0.0.1-6004-bbbbbb", LogSettings(memory_bytes=0))
    )
    good = batch(0)
    bad = bytearray(batch(3))
    bad[-1] ^= 0xFF  # a payload byte: the CRC no longer matches
    with pytest.raises(CorruptRecord):
        _write(store, 0, good + bytes(bad))
    assert LEADER.decode() not in store.logs  # checked before the copy is even opened
    store.close()


@pytest.mark.parametrize("offset", [2**63 + 5, 2**60, 2**64 - 1])
def test_a_restart_beyond_any_log_is_refused_before_a_copy_is_made(
    tmp_path: Path, offset: int
) -> None:
    store = _assigned(
        ReplicaStore(tmp_path, "q", "127.0.0.1-6004-bbbbbb", LogSettings(memory_bytes=0))
    )
    with pytest.raises(DecodeError, match="beyond any log"):
        store.handle([RESTART, b"fz-1", struct.pack("<Q", offset)])
    with pytest.raises(DecodeError, match="beyond any log"):
        _write(store, offset, batch(0))
    assert store.ends() == {} and not list(tmp_path.rglob("fz-1@*"))
    store.close()


def test_a_write_with_torn_records_is_refused_before_a_copy_is_made(tmp_path: Path) -> None:
    store = _assigned(
        ReplicaStore(tmp_path, "q", "127.0.0.1-6004-bbbbbb", LogSettings(memory_bytes=0))
    )
    with pytest.raises(CorruptRecord, match="record 1 of batch"):
        _write(store, 0, batch(0) + torn(batch(3)))
    assert store.ends() == {}
    store.close()


def test_a_copy_beyond_any_log_on_disk_is_quarantined_at_start(tmp_path: Path, caplog) -> None:
    """What a RESTART at 2**63 + 5 left behind before it was refused: the exchange reported
    that end in BSON and died, on every restart. Now the copy is set aside, the others open."""
    own = "127.0.0.1-6004-bbbbbb"
    good = _assigned(ReplicaStore(tmp_path, "q", own, LogSettings(memory_bytes=0)))
    _write(good, 0, batch(0))
    good.close()
    bad = tmp_path / "_replicas" / "q" / f"fz-1@{own}"
    bad.mkdir()
    (bad / segment_name(2**63 + 5)).touch()
    with caplog.at_level(logging.ERROR, logger="roq.replication"):
        store = _assigned(ReplicaStore(tmp_path, "q", own, LogSettings(memory_bytes=0)))
    assert store.ends() == {LEADER.decode(): len(batch(0))}
    assert not bad.exists() and len(list(bad.parent.glob(f"fz-1@{own}.quarantined-*"))) == 1
    assert "quarantined" in caplog.text and "fz-1" in caplog.text
    with pytest.raises(InvalidOffset, match="no copy"):
        store.copy("fz-1")  # a read of the set-aside copy
    assert store.handle([PROBE, b"fz-1"])[2] == OK  # a live leader starts a new copy
    assert store.ends()["fz-1"] == 0
    store.close()


def test_restart_empties_the_copy_and_goes_on_at_the_leaders_start(tmp_path: Path) -> None:
    store = _assigned(
        ReplicaStore(tmp_path, "q", "127.0.0.1-6004-bbbbbb", LogSettings(memory_bytes=4096))
    )
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
    reopened = _assigned(
        ReplicaStore(tmp_path, "q", "127.0.0.1-6004-bbbbbb", LogSettings(memory_bytes=0))
    )
    assert reopened.ends() == {LEADER.decode(): start + len(new)}
    assert [p.name for p in sorted(copy.directory.glob("*.log"))] == [segment_name(start)]
    reopened.close()


def test_restart_at_or_below_the_end_is_refused_by_the_log(tmp_path: Path) -> None:
    store = _assigned(
        ReplicaStore(tmp_path, "q", "127.0.0.1-6004-bbbbbb", LogSettings(memory_bytes=0))
    )
    _write(store, 0, batch(0))
    copy = store.logs[LEADER.decode()]
    with pytest.raises(InvalidOffset):
        copy.restart_at(copy.end_offset)
    store.close()


def _serve(router: Any, store: ReplicaStore, most: int = 1000) -> int:
    """Answer what reached the replica's socket, as its log server does; how many."""
    answered = 0
    while answered < most and wait_readable(router, 20):
        peer, *body = router.recv_multipart()
        router.send_multipart([peer, *store.handle(body)])
        answered += 1
    return answered


def _turn(replicator: Replicator) -> None:
    """The leader's replication step of one loop turn."""
    for sock in replicator.sockets():
        if wait_readable(sock, 20):
            replicator.on_answer(sock)
    replicator.backfill()


class _Pair:
    """A leader's Replicator (of `leader`) and one ReplicaStore over real inproc sockets,
    served by hand (`_serve`, `_turn`); the replica is assigned at once."""

    def __init__(
        self, tmp_path: Path, leader: Log, lag_s: float = REPLICA_LAG_S, min_copies: int = 1,
        prune: bool = False, copy_file_size: int = 64 << 20,
    ) -> None:  # fmt: skip
        self.context = new_context()
        self.router = self.context.socket(Kind.ROUTER)
        self.router.bind("inproc://replica")
        self.leader = leader
        settings = LogSettings(max_file_size=copy_file_size, memory_bytes=0)
        self.store = ReplicaStore(tmp_path / "copies", "q", "r1", settings)
        self.store.accept(("l1",))
        self.replicator = Replicator(
            self.context, "l1", leader, "leader l1", lag_s=lag_s, min_copies=min_copies,
            prune=prune,
        )  # fmt: skip
        self.replicator.assign([("r1", "inproc://replica")])

    def in_sync(self) -> bool:
        return self.replicator.status()[0].in_sync

    def __enter__(self) -> _Pair:
        return self

    def __exit__(self, *exc: object) -> None:
        self.replicator.close()
        self.router.close(0)
        self.store.close()
        self.leader.close()
        self.context.term()


def _long_log(tmp_path: Path, batches: int) -> Log:
    """`batches` batches of 10 records of 1000 bytes (~10 KB each) in 1 MiB segments."""
    leader = Log(tmp_path / "leader", 1 << 20, memory_bytes=0)
    for seq in range(0, 10 * batches, 10):
        leader.append(batch(seq, records=10, size=1000))
    return leader


def test_a_copy_behind_retention_restarts_and_is_out_of_sync_until_it_caught_up(
    tmp_path: Path,
) -> None:
    """The leader's retention (8 KiB of 4 KiB segments) outruns a replica that is not served
    for a while."""
    leader = Log(tmp_path / "leader", 4096, retention=Retention(bytes=8192), memory_bytes=0)
    with _Pair(tmp_path, leader) as pair:
        router, store, replicator = pair.router, pair.store, pair.replicator
        for seq in range(0, 30, 3):
            leader.append(batch(seq))
        for _ in range(50):
            _serve(router, store)
            _turn(replicator)
            if pair.in_sync() and replicator.committed() == leader.end_offset:
                break
        assert replicator.committed() == leader.end_offset > 0
        held_before = leader.end_offset
        for seq in range(30, 630, 3):  # one burst, no replication step: retention outruns it
            leader.append(batch(seq))
        assert leader.start_offset > held_before
        _turn(replicator)  # reads an evicted offset: sends the restart, then the log after it
        assert _serve(router, store, most=1) == 1  # the restart only
        _turn(replicator)  # its answer: the copy now starts (and ends) at the leader's start
        [link] = replicator.status()
        assert link.acked == leader.start_offset < leader.end_offset
        assert not link.in_sync, "a copy with a hole must not count as in sync"
        for _ in range(50):
            _serve(router, store)
            _turn(replicator)
            if pair.in_sync():
                break
        copy = store.logs["l1"]
        assert pair.in_sync() and copy.end_offset == leader.end_offset
        assert copy.start_offset > held_before  # started again: nothing below is claimed
        tail = copy.read(copy.start_offset, 1 << 20)
        assert bytes(tail.data) == bytes(leader.read(copy.start_offset, 1 << 20).data)


def test_a_new_replica_is_out_of_sync_until_its_backfill_reaches_the_end(tmp_path: Path) -> None:
    """acks=all must not wait for a back-fill: until the copy holds the log as it stood a lag
    ago, the committed offset is the leader's own end."""
    # ~3 MiB: three 1 MiB back-fill frames
    with _Pair(tmp_path, _long_log(tmp_path, batches=300), lag_s=60.0) as pair:
        end = pair.leader.end_offset
        assert _serve(pair.router, pair.store, most=1) == 1  # the probe: an empty copy
        _turn(pair.replicator)  # its answer, then the back-fill's frames go out
        assert not pair.in_sync() and pair.replicator.committed() == end
        assert _serve(pair.router, pair.store, most=1) == 1
        _turn(pair.replicator)
        [link] = pair.replicator.status()
        assert 0 < link.acked < end, "one frame of the back-fill landed"
        assert not pair.in_sync() and pair.replicator.committed() == end
        while _serve(pair.router, pair.store):
            _turn(pair.replicator)
        assert pair.in_sync() and pair.store.logs["l1"].end_offset == end
        assert pair.replicator.committed() == end and not pair.replicator.under_replicated


def test_a_replica_that_falls_a_lag_behind_drops_out_and_acks_all_goes_on(
    tmp_path: Path,
) -> None:
    """An in-sync replica is waited for (committed stays at its end) for at most the lag; then
    it is out of sync and committed moves on to the leader's end; it is back once it answers."""
    with _Pair(tmp_path, _long_log(tmp_path, batches=3), lag_s=0.3) as pair:
        while _serve(pair.router, pair.store):
            _turn(pair.replicator)
        before = pair.leader.end_offset
        assert pair.in_sync() and pair.replicator.committed() == before
        pair.leader.append(batch(1000, records=10, size=1000))
        _turn(pair.replicator)  # sent, not answered: the replica stalls
        assert pair.replicator.committed() == before, "an in-sync replica is waited for"
        # the exchange's loop turns, each asking for the committed offset
        end = pair.leader.end_offset
        wait_for(
            lambda: pair.replicator.committed() == end, 5, "the stalled replica left behind", 0.02
        )
        assert pair.replicator.committed() == pair.leader.end_offset > before
        assert not pair.in_sync() and pair.replicator.under_replicated
        while _serve(pair.router, pair.store):
            _turn(pair.replicator)
        assert pair.in_sync() and pair.replicator.committed() == pair.leader.end_offset


def test_below_min_insync_copies_nothing_more_is_committed_until_a_copy_is_back(
    tmp_path: Path,
) -> None:
    """min.insync.copies=2: when the only replica stalls past the lag, committed holds where
    it was (min.insync.copies=1 moved it on to the leader's end, the test above), and moves
    again once the replica has caught up; it never moves back."""
    with _Pair(tmp_path, _long_log(tmp_path, batches=3), lag_s=0.3, min_copies=2) as pair:
        while _serve(pair.router, pair.store):
            _turn(pair.replicator)
        before = pair.leader.end_offset
        assert pair.replicator.committed() == before and not pair.replicator.below_min_copies
        pair.leader.append(batch(1000, records=10, size=1000))
        _turn(pair.replicator)  # sent, not answered: the replica stalls
        wait_for(lambda: not pair.in_sync(), 5, "the stalled replica out of sync", 0.02)
        assert pair.replicator.committed() == before < pair.leader.end_offset
        assert pair.replicator.below_min_copies and pair.replicator.copies_in_sync == 1
        while _serve(pair.router, pair.store):
            _turn(pair.replicator)
        assert pair.in_sync() and pair.replicator.committed() == pair.leader.end_offset
        assert not pair.replicator.below_min_copies


def test_an_assignment_of_nobody_commits_nothing_below_min_insync_copies(tmp_path: Path) -> None:
    """A queue with one live exchange, min.insync.copies=2: the leader is alone, and acks=all
    confirms nothing (with 1, the test below, it confirms on the leader)."""
    context = new_context()
    leader = _long_log(tmp_path, batches=3)
    replicator = Replicator(context, "l1", leader, "leader l1", min_copies=2)
    try:
        replicator.assign([])
        assert replicator.committed() == 0 < leader.end_offset
        assert replicator.below_min_copies
    finally:
        replicator.close()
        leader.close()
        context.term()


def test_acks_all_confirms_nothing_before_the_monitor_says_who_copies_the_log(
    tmp_path: Path,
) -> None:
    """A fresh or restarted leader does not know its replicas until the monitor's REPLICAS:
    committed stays at 0 meanwhile (bounded), and an assignment of nobody (a queue with one
    live exchange) is the word that the leader is alone."""
    context = new_context()
    leader = _long_log(tmp_path, batches=3)
    replicator = Replicator(context, "l1", leader, "leader l1")
    try:
        assert replicator.committed() == 0 < leader.end_offset
        replicator.assign([])
        assert replicator.committed() == leader.end_offset
    finally:
        replicator.close()
        leader.close()
        context.term()


def test_a_newly_assigned_replica_is_waited_for_until_its_first_answer(tmp_path: Path) -> None:
    """Its empty copy of a log that was empty a lag ago is in sync at its first answer: acks=all
    must not confirm on the leader alone in the meantime. A replica that never answers is
    waited for at most the lag."""
    with _Pair(tmp_path, _long_log(tmp_path, batches=0), lag_s=0.3) as pair:
        pair.leader.append(batch(0, records=10, size=1000))
        assert pair.replicator.committed() == 0, "not answered yet: waited for"
        while _serve(pair.router, pair.store):
            _turn(pair.replicator)
        assert pair.in_sync() and pair.replicator.committed() == pair.leader.end_offset
    with _Pair(tmp_path / "silent", _long_log(tmp_path / "silent", batches=1), lag_s=0.3) as pair:
        assert pair.replicator.committed() == 0
        # nobody serves the replica's socket: past lag_s it is left behind
        end = pair.leader.end_offset
        wait_for(
            lambda: pair.replicator.committed() == end, 5, "the silent replica left behind", 0.02
        )


def test_a_pruning_leaders_copy_follows_its_start_and_keeps_the_rest(tmp_path: Path) -> None:
    """A compacted log (the monitor's state log) drops its head segments: with `prune`, its
    copy drops the same whole segments once it holds the new start, and keeps every byte
    from there, in sync."""
    leader = Log(tmp_path / "leader", 4096, memory_bytes=0)
    with _Pair(tmp_path, leader, prune=True, copy_file_size=4096) as pair:
        router, store, replicator = pair.router, pair.store, pair.replicator
        for seq in range(0, 60, 10):  # ~10 KB each: a segment each, on both sides
            leader.append(batch(seq, records=10, size=1000))
        leader.roll()
        cut = leader.end_offset
        leader.append(batch(60, records=10, size=1000))
        for _ in range(50):
            _serve(router, store)
            _turn(replicator)
            if pair.in_sync() and store.logs["l1"].end_offset == leader.end_offset:
                break
        copy = store.logs["l1"]
        assert copy.start_offset == 0 and len(copy.segments) > 1
        assert leader.drop_before(cut) > 0 and leader.start_offset == cut
        for _ in range(5):
            _turn(replicator)
            _serve(router, store)
        assert copy.start_offset == cut and copy.end_offset == leader.end_offset
        assert bytes(copy.read(cut, 1 << 20).data) == bytes(leader.read(cut, 1 << 20).data)
        assert pair.in_sync()


def test_older_state_logs_copies_go_once_a_newer_epoch_holds_them(tmp_path: Path) -> None:
    """DropStateBefore 3: the copies of state.1 and state.2 go (state.2 only once no longer
    assigned); state.3's and an exchange's log's copies stay, and so does what is on disk."""
    own = "127.0.0.1-6004-bbbbbb"
    store = ReplicaStore(tmp_path, "q", own, LogSettings(memory_bytes=0))
    leaders = ("state.1", "state.2", "state.3", LEADER.decode())
    store.accept(leaders)
    for leader in leaders:
        assert store.handle([WRITE, leader.encode(), struct.pack("<Q", 0), batch(0)])[2] == OK
    store.accept(("state.2", "state.3", LEADER.decode()))
    store.drop_state_before(3)
    assert sorted(store.logs) == sorted(["state.2", "state.3", LEADER.decode()])
    store.accept(("state.3", LEADER.decode()))
    store.drop_state_before(3)
    assert sorted(store.logs) == sorted(["state.3", LEADER.decode()])
    store.close()
    reopened = ReplicaStore(tmp_path, "q", own, LogSettings(memory_bytes=0))
    assert sorted(reopened.logs) == sorted(["state.3", LEADER.decode()])  # deleted on disk
    reopened.close()
