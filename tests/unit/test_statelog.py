"""The state log on real files: versions, tombstones, compare-and-set, replay on open, compaction
without rewriting offsets (whole, or in slices between appends), real damage on disk, restore
from a copy's bytes, and a random sequence of changes, compactions, compaction slices and
reopens against a dict."""

from __future__ import annotations

import logging
import tempfile
from pathlib import Path

import bson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from logutil import torn

from roq import limits
from roq.errors import ConfigError, InvalidChange, LogError, StateConflict
from roq.log import FlushPolicy, Log, LogSettings, ReadStatus, Retention
from roq.log import format as fmt
from roq.log.statelog import (
    CHANGES,
    SNAPSHOT,
    Change,
    StateLog,
    StateRecord,
    decode_record,
    encode_record,
    restore,
)

PID = bytes(range(16))
OTHER = bytes(range(16, 32))
# Small segments, so that a few changes span several of them; no memory log, so that every
# read is a disk read; `os`, so that the tests do not wait for fdatasync.
SMALL = LogSettings(max_file_size=2048, flush=FlushPolicy("os"), memory_bytes=0)

State = dict[str, tuple[bytes, int]]


def open_state(path: Path, settings: LogSettings = SMALL, producer_id: bytes = PID) -> StateLog:
    return StateLog.open(path, settings, producer_id)


def put(state: StateLog, key: str, value: bytes | None, expect: int | None = None) -> int:
    return state.append([Change(key, value, expect)])


def contents(state: StateLog) -> State:
    """Every live key's (value, version)."""
    out: State = {}
    live = state.keys()
    for key in live:
        got = state.get(key)
        assert got is not None
        out[key] = got
    return out


def raw(log: Log, max_bytes: int = 100_000) -> list[tuple[int, bytes]]:
    """(offset, chunk of whole batches) of every read from the log's start to its end."""
    chunks, offset = [], log.start_offset
    while True:
        result = log.read(offset, max_bytes)
        if result.status is not ReadStatus.BATCHES:
            return chunks
        chunks.append((offset, result.data))
        offset = result.next_offset


def batches(log: Log) -> list[tuple[fmt.BatchHeader, list[StateRecord | None]]]:
    """Each batch's header and its records, decoded."""
    out = []
    for _, data in raw(log):
        for at, header in fmt.iter_batches(data):
            records = [decode_record(r.payload) for r in fmt.iter_records(data, at)]
            out.append((header, records))
    return out


def files_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in path.glob("*.log"))


def fill(state: StateLog, keys: int, rounds: int, size: int = 40) -> None:
    """`rounds` writes of each of `keys` keys, one append per key and round."""
    for round_ in range(rounds):
        for i in range(keys):
            put(state, f"key/{i:03d}", f"{i}:{round_}".encode().ljust(size, b"."))


def segment_at(log: Log, offset: int) -> tuple[Path, int]:
    """The file holding the batch at `offset`, and the batch's position in it."""
    segment = next(s for s in log.segments if s.base <= offset < s.end)
    return segment.path, offset - segment.base


# --- writing and reading -----------------------------------------------------------------------
def test_writes_are_read_back_with_versions_counted_per_key(tmp_path):
    with open_state(tmp_path) as state:
        first = put(state, "task/1", b"one")
        assert state.get("task/1") == (b"one", 1)
        second = put(state, "task/1", b"uno")
        put(state, "task/2", b"two")
        put(state, "group/a", b"slots")
        assert second > first
        assert state.get("task/1") == (b"uno", 2)
        assert state.get("task/2") == (b"two", 1)
        assert state.get("task/3") is None
        assert state.keys() == ["group/a", "task/1", "task/2"]
        assert state.keys("task/") == ["task/1", "task/2"]
        assert len(state) == 3
        entry = state.entry("task/1")
        assert entry is not None and entry.offset == second
        sizes = [state.entry(key) for key in ("task/1", "task/2", "group/a")]
        assert state.live_bytes == sum(entry.size for entry in sizes if entry)
        assert state.end_offset > second


def test_one_append_is_one_batch_of_bson_records_with_sequences_that_do_not_overlap(tmp_path):
    with open_state(tmp_path) as state:
        offset = state.append([Change("a", b"1"), Change("b", b"2"), Change("a", b"3")])
        state.append([Change("c", b"4")])
        assert state.get("a") == (b"3", 2)  # a later change of a turn sees the earlier one
        (h1, r1), (h2, r2) = batches(state.log)
        assert h1.base_offset == offset and h1.key == CHANGES and h1.producer_id == PID
        assert (h1.first_seq, h1.count, h2.first_seq) == (0, 3, 3)
        assert r1 == [
            StateRecord("a", 1, b"1"),
            StateRecord("b", 1, b"2"),
            StateRecord("a", 2, b"3"),
        ]
        assert r2 == [StateRecord("c", 1, b"4")]
        data = raw(state.log)[0][1]
        payload = next(fmt.iter_records(data, 0)).payload
        assert bson.decode(payload) == {"k": "a", "n": 1, "v": b"1"}


def test_a_tombstone_deletes_and_a_later_write_goes_on_from_its_version(tmp_path):
    with open_state(tmp_path) as state:
        put(state, "k", b"v")
        put(state, "k", b"w")
        put(state, "k", None)
        assert state.get("k") is None and state.keys() == [] and len(state) == 0
        assert state.live_bytes == 0
        tomb = batches(state.log)[-1][1][0]
        assert tomb == StateRecord("k", 3, None)
        assert "v" not in bson.decode(encode_record(StateRecord("k", 3, None)))
        put(state, "k", b"again", expect=0)  # absent: a claim may take it
        assert state.get("k") == (b"again", 4)  # never 1 or 2 again: a stale version cannot match


def test_a_failed_expectation_writes_nothing_of_the_turn(tmp_path):
    with open_state(tmp_path) as state:
        put(state, "a", b"1")
        end, before = state.end_offset, contents(state)
        turn = [Change("b", b"2", expect=0), Change("a", b"x", expect=2)]
        with pytest.raises(StateConflict) as caught:
            state.append(turn)
        assert (caught.value.key, caught.value.expected, caught.value.found) == ("a", 2, 1)
        assert str(caught.value) == "state key 'a': expected version 2, found version 1"
        assert state.end_offset == end and contents(state) == before
        # expectations see the earlier changes of the same turn
        state.append([Change("a", b"x", expect=1), Change("a", b"y", expect=2)])
        assert state.get("a") == (b"y", 3)
        with pytest.raises(StateConflict, match="found no such key"):
            state.append([Change("a", None, expect=3), Change("a", b"z", expect=3)])


def test_exactly_one_of_concurrent_claims_of_one_id_wins(tmp_path):
    with open_state(tmp_path) as state:
        # Two submissions of task 7 both read "absent" and both try to claim it.
        claims = [Change("task/7", b"from A", expect=0), Change("task/7", b"from B", expect=0)]
        won, lost = [], []
        for claim in claims:
            try:
                state.append([claim])
                won.append(claim)
            except StateConflict as conflict:
                assert (conflict.expected, conflict.found) == (0, 1)
                lost.append(claim)
        assert won == claims[:1] and lost == claims[1:]
        assert state.get("task/7") == (b"from A", 1)
        # both in one turn: the second fails, so neither is written
        with pytest.raises(StateConflict):
            state.append([Change("task/8", b"A", expect=0), Change("task/8", b"B", expect=0)])
        assert state.get("task/8") is None


def test_bounds_refuse_a_change_naming_the_bound_and_write_nothing(tmp_path):
    with open_state(tmp_path, LogSettings(flush=FlushPolicy("os"), memory_bytes=0)) as state:
        end = state.end_offset
        key_max, value_max = limits.state_key_chars_max, limits.state_value_bytes_max
        refusals = {
            "state_key_chars_max": [Change("k" * (key_max + 1), b"v"), Change("", b"v")],
            "state_value_bytes_max": [Change("k", bytes(value_max + 1))],
            "batch_bytes_max": [Change(f"k{i}", bytes(value_max)) for i in range(4)],
            "not valid UTF-8": [Change("\udc80", b"v")],
            "a value is bytes": [Change("k", "text")],  # type: ignore[arg-type]
            "expected version": [Change("k", b"v", expect=-1)],
            "at least one change": [],
        }
        for bound, changes in refusals.items():
            with pytest.raises(InvalidChange, match=bound):
                state.append(changes)
        assert state.end_offset == end and len(state) == 0
        widest = "é" * key_max  # the largest key and value fit one batch
        state.append([Change(widest, bytes(value_max))])
        assert state.get(widest) == (bytes(value_max), 1)


def test_a_state_log_refuses_retention_and_a_malformed_producer_id(tmp_path):
    with pytest.raises(ConfigError, match="retention"):
        StateLog.open(tmp_path, LogSettings(retention=Retention(bytes=1000)), PID)
    with pytest.raises(ValueError, match="16 bytes"):
        StateLog.open(tmp_path, SMALL, b"short")


def test_flush_makes_appends_durable(tmp_path):
    interval = LogSettings(flush=FlushPolicy("interval", 60_000), memory_bytes=0)
    with open_state(tmp_path / "interval", interval) as state:
        put(state, "k", b"v")
        assert state.durable_offset < state.end_offset
        state.flush()
        assert state.durable_offset == state.end_offset
    every = LogSettings(flush=FlushPolicy("every-batch"), memory_bytes=0)
    with open_state(tmp_path / "every", every) as state:
        put(state, "k", b"v")
        assert state.durable_offset == state.end_offset


# --- replay ----------------------------------------------------------------------------------
def test_reopening_rebuilds_the_same_state_versions_and_offsets(tmp_path):
    with open_state(tmp_path) as state:
        fill(state, keys=10, rounds=5)
        put(state, "key/003", None)
        state.append([Change("key/004", None), Change("extra", b"x")])
        before, live, end = contents(state), state.live_bytes, state.end_offset
        entries = {key: state.entry(key) for key in before}
        assert len(state.log.segments) > 3
    with open_state(tmp_path) as state:
        assert contents(state) == before and state.live_bytes == live
        assert {key: state.entry(key) for key in before} == entries
        assert (state.end_offset, state.corrupt_batches, state.corrupt_records) == (end, 0, 0)
        put(state, "key/003", b"back")
        assert state.get("key/003") == (b"back", 7)  # 5 writes and a tombstone before
        header = batches(state.log)[-1][0]
        assert header.first_seq == 5 * 10 + 1 + 2  # this producer's sequence goes on
    with open_state(tmp_path, producer_id=OTHER) as state:
        put(state, "k", b"v")
        assert batches(state.log)[-1][0].first_seq == 0  # another writer's starts afresh


# --- compaction --------------------------------------------------------------------------------
def test_compaction_keeps_state_and_versions_shrinks_the_files_and_offsets_only_grow(tmp_path):
    with open_state(tmp_path) as state:
        fill(state, keys=8, rounds=12)
        put(state, "key/000", None)
        put(state, "gone", b"soon")
        put(state, "gone", None)  # version 2
        before, live, end = contents(state), state.live_bytes, state.end_offset
        size = files_bytes(tmp_path)
        start = state.compact()
        assert start == end and state.start_offset == start  # the snapshot starts the log
        assert contents(state) == before and state.live_bytes == live
        assert files_bytes(tmp_path) < size / 5
        assert all(entry.offset >= start for entry in map(state.entry, before) if entry)
        snapshot = batches(state.log)
        assert {header.key for header, _ in snapshot} == {SNAPSHOT}
        assert snapshot[0][1][0] == StateRecord("", 13, None)  # the floor: key/000's tombstone
        offset = put(state, "key/001", b"later")
        assert offset >= state.start_offset and state.get("key/001") == (b"later", 13)
        put(state, "gone", b"again")
        assert state.get("gone") == (b"again", 14)  # above every dropped tombstone: the floor
        after = contents(state)
    with open_state(tmp_path) as state:
        assert contents(state) == after and state.start_offset == start
        assert state.corrupt_batches == 0


def test_maybe_compact_runs_past_its_bounds_and_not_again_at_once(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "state_compact_min_bytes", 4096)
    with open_state(tmp_path) as state:
        fill(state, keys=20, rounds=1)
        assert not state.maybe_compact()  # the log holds nothing superseded
        fill(state, keys=20, rounds=3)
        assert state.should_compact() and state.maybe_compact()
        assert not state.should_compact() and not state.maybe_compact()
        assert state.end_offset - state.start_offset < 1.2 * state.live_bytes


def test_a_snapshot_packs_records_in_bounded_batches(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "state_snapshot_batch_bytes", 1000)
    with open_state(tmp_path) as state:
        fill(state, keys=30, rounds=1, size=100)
        put(state, "huge", bytes(3000))  # larger than the bound: a batch of its own
        before = contents(state)
        state.compact()
        headers = [header for header, _ in batches(state.log)]
        assert len(headers) > 3
        assert all(h.size <= 1000 for h in headers if h.count > 1)
        assert contents(state) == before


def test_compaction_runs_in_slices_while_appends_go_on(tmp_path, monkeypatch):
    """26 Nov: compacting 300,000 keys in one go kept the monitor from answering for 9 s. Now
    each maybe_compact() restates at most state_compact_keys_per_turn keys, and what is
    appended between slices (a change of a key not restated yet, of one restated already, a
    delete, a new key, a delete and create again) is kept, before and after a reopen; the
    segments before the snapshot go only at its end."""
    monkeypatch.setattr(limits, "state_compact_min_bytes", 4096)
    monkeypatch.setattr(limits, "state_compact_keys_per_turn", 4)
    with open_state(tmp_path) as state:
        fill(state, keys=20, rounds=4)
        first = state.start_offset
        assert not state.maybe_compact()  # begun, 4 of 20 keys restated
        assert state.start_offset == first  # nothing dropped yet
        put(state, "key/019", b"changed before its slice")
        put(state, "key/000", b"changed after its slice")
        put(state, "key/010", None)  # deleted before its slice
        put(state, "key/001", None)  # deleted after its slice
        put(state, "new/1", b"created meanwhile")
        put(state, "key/002", None)
        put(state, "key/002", b"created again")
        expected = contents(state)
        calls = 1
        while calls < 10:
            calls += 1
            if state.maybe_compact():
                break
        assert calls == 5  # 20 keys, 4 a turn
        assert state.start_offset > first and contents(state) == expected
        assert not state.maybe_compact()  # nothing superseded is left to compact
        put(state, "key/010", b"back")  # above its tombstone's version, though it is dropped
        assert state.get("key/010")[1] > 4  # type: ignore[index]
        expected = contents(state)
    with open_state(tmp_path) as state:
        assert contents(state) == expected and state.corrupt_batches == 0


def test_a_crash_midway_through_a_sliced_compaction_loses_nothing(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "state_compact_min_bytes", 4096)
    monkeypatch.setattr(limits, "state_compact_keys_per_turn", 3)
    with open_state(tmp_path) as state:
        fill(state, keys=12, rounds=4)
        assert not state.maybe_compact() and not state.maybe_compact()
        put(state, "key/011", None)
        put(state, "key/000", b"after two slices")
        expected = contents(state)
    with open_state(tmp_path) as state:  # closed midway: a crash, to the log
        assert contents(state) == expected
        state.compact()
        assert contents(state) == expected
    with open_state(tmp_path) as state:
        assert contents(state) == expected


def test_a_crash_in_the_middle_of_a_snapshot_replays_to_the_same_state(tmp_path):
    with open_state(tmp_path) as state:
        fill(state, keys=6, rounds=4)
        put(state, "key/005", None)
        before = contents(state)
        # The first batch of a snapshot, then a crash before the rest and before the drop.
        state.log.roll()
        part = [StateRecord("", 4, None)] + [
            StateRecord(key, version, value) for key, (value, version) in list(before.items())[:2]
        ]
        payloads = [encode_record(record) for record in part]
        state.log.append(fmt.encode_batch(PID, 999, SNAPSHOT, payloads, [0] * len(payloads)))
    with open_state(tmp_path) as state:
        assert contents(state) == before and state.corrupt_batches == 0
        put(state, "key/005", b"back")
        assert state.get("key/005") == (b"back", 6)  # past the tombstone (5) and the floor (4)
        put(state, "key/000", b"new")
        after = contents(state)
        state.compact()  # the next compaction drops the partial snapshot with the rest
        assert contents(state) == after
    with open_state(tmp_path) as state:
        assert contents(state) == after


# --- damage ------------------------------------------------------------------------------------
def test_a_damaged_batch_in_the_middle_is_skipped_counted_and_later_ones_kept(tmp_path, caplog):
    with open_state(tmp_path) as state:
        offsets = {f"k{i:02d}": put(state, f"k{i:02d}", b"value %d" % i * 10) for i in range(40)}
        assert len(state.log.segments) > 3
        victim = "k05"
        path, position = segment_at(state.log, offsets[victim])
        assert path != state.log.segments[-1].path  # recovery cuts the last segment instead
        expected = contents(state)
        del expected[victim]
    with path.open("r+b") as file:  # flip two bytes of its value, inside the CRC
        file.seek(position + fmt.HEADER_BYTES + len(CHANGES) + fmt.RECORD_BYTES + 30)
        file.write(b"\xff\xfe")
    with caplog.at_level(logging.WARNING), open_state(tmp_path) as state:
        assert contents(state) == expected
        assert (state.corrupt_batches, state.corrupt_records) == (1, 0)
        assert state.log.recovered_bytes_dropped == 0
    warning = next(r.getMessage() for r in caplog.records if "skipped" in r.getMessage())
    assert str(tmp_path) in warning and f"offset {offsets[victim]}" in warning


def test_a_torn_tail_keeps_everything_before_it(tmp_path):
    with open_state(tmp_path) as state:
        fill(state, keys=5, rounds=3)
        expected = contents(state)
        last = put(state, "key/001", b"the last write, torn by a crash")
        path, position = segment_at(state.log, last)
        end = state.end_offset
    with path.open("r+b") as file:
        file.truncate(position + 30)
    with open_state(tmp_path) as state:
        assert contents(state) == expected and state.corrupt_batches == 0
        assert state.end_offset == last < end


def test_records_that_are_no_state_records_are_skipped_and_counted(tmp_path):
    good = encode_record(StateRecord("good", 1, b"kept"))
    wrong = [{"k": 5, "n": 1}, {"k": "x"}, {"k": "x", "n": 0}, {"k": "x", "n": 1, "v": "text"}]
    bad = [b"not bson", *map(bson.encode, wrong)]
    with open_state(tmp_path) as state:
        state.log.append(fmt.encode_batch(PID, 0, CHANGES, [bad[0], good, *bad[1:]], [0] * 6))
        state.log.append(fmt.encode_batch(PID, 6, b"not-state", [good], [0]))
        put(state, "after", b"x")
    with open_state(tmp_path) as state:
        assert contents(state) == {"good": (b"kept", 1), "after": (b"x", 1)}
        assert (state.corrupt_records, state.corrupt_batches) == (5, 1)


def test_a_batch_with_torn_records_but_a_sound_crc_is_skipped(tmp_path):
    with open_state(tmp_path) as state:
        put(state, "before", b"1")
        offset = state.append([Change("torn", b"2"), Change("torn2", b"3")])
        put(state, "after", b"4")
        path, position = segment_at(state.log, offset)
    data = path.read_bytes()
    path.write_bytes(torn(data, position))
    with open_state(tmp_path) as state:
        assert state.keys() == ["after", "before"] and state.corrupt_batches == 1


# --- restore from a copy -------------------------------------------------------------------
def test_restore_from_the_bytes_of_another_state_log_gives_the_same_state(tmp_path):
    with open_state(tmp_path / "old") as old:
        fill(old, keys=12, rounds=4)
        put(old, "key/002", None)
        old.compact()
        fill(old, keys=3, rounds=2)
        put(old, "key/001", None)
        expected = contents(old)
        chunks = [data for _, data in raw(old.log, max_bytes=200)]
    assert len(chunks) > 3
    with restore(tmp_path / "new", SMALL, OTHER, iter(chunks)) as new:
        assert contents(new) == expected
        assert new.start_offset == 0 and (new.corrupt_batches, new.corrupt_records) == (0, 0)
        assert {header.key for header, _ in batches(new.log)} == {SNAPSHOT}  # a snapshot
        assert {header.producer_id for header, _ in batches(new.log)} == {OTHER}
        put(new, "key/001", b"back")
        assert new.get("key/001") == (b"back", 8)  # past its tombstone (7) in the copy
    assert not (tmp_path / "new.restoring").exists()
    with open_state(tmp_path / "new", producer_id=OTHER) as reopened:
        assert reopened.get("key/001") == (b"back", 8)


def test_restore_skips_damaged_and_repeated_batches_of_the_copy(tmp_path):
    with open_state(tmp_path / "old") as old:
        for i in range(6):
            put(old, f"k{i}", f"v{i}".encode())
        put(old, "k1", b"newer")
        chunks = [data for _, data in raw(old.log, max_bytes=1)]  # one batch a chunk
        expected = contents(old)
    assert len(chunks) == 7
    damaged = bytearray(chunks[2])
    damaged[-1] ^= 0xFF
    # k0 handed twice, k2's batch damaged (reading goes on at the next batch of its chunk), and
    # k1's first batch again at the end: applied, it would bring back k1's older value.
    copy = [chunks[0], chunks[1], chunks[0], bytes(damaged) + chunks[3], *chunks[4:], chunks[1]]
    del expected["k2"]
    with restore(tmp_path / "new", SMALL, PID, copy) as new:
        assert contents(new) == expected and new.get("k1") == (b"newer", 2)
        assert new.corrupt_batches == 3


def test_restore_refuses_a_directory_that_holds_files(tmp_path):
    with open_state(tmp_path / "old") as old:
        put(old, "k", b"v")
    with pytest.raises(LogError, match="not empty"):
        restore(tmp_path / "old", SMALL, PID, [])
    (tmp_path / "empty").mkdir()
    with restore(tmp_path / "empty", SMALL, PID, []) as new:
        assert len(new) == 0


# --- a random history against a dict ---------------------------------------------------------
KEYS = ["a", "b", "c", "d/1", "d/2", "e/d/1"]
operations = st.lists(
    st.one_of(
        st.tuples(st.just("put"), st.sampled_from(KEYS), st.binary(max_size=300), st.booleans()),
        st.tuples(st.just("delete"), st.sampled_from(KEYS), st.just(b""), st.booleans()),
        st.tuples(st.just("stale"), st.sampled_from(KEYS), st.just(b"x"), st.just(False)),
        st.tuples(
            st.sampled_from(["compact", "reopen", "slice"]),
            st.just(""),
            st.just(b""),
            st.just(False),
        ),
    ),
    max_size=60,
)


HISTORY = LogSettings(max_file_size=1024, flush=FlushPolicy("os"), memory_bytes=0)


class Model:
    """A state log beside the dict it must equal, and the highest version each key had."""

    def __init__(self, directory: str):
        self.directory = directory
        self.state = StateLog.open(directory, HISTORY, PID)
        self.values: dict[str, bytes] = {}
        self.highest: dict[str, int] = {}

    def step(self, op: str, key: str, value: bytes, checked: bool) -> None:
        if op in ("compact", "reopen", "slice"):
            before = contents(self.state)
            if op == "compact":
                self.state.compact()
            elif op == "slice":  # two keys of a compaction, begun if none is under way
                if self.state._compaction is None:
                    self.state._compaction = self.state._begin_compaction()
                self.state._compact_slice(2)
            else:  # closed midway through a compaction: as a crash, to the log
                self.state.close()
                self.state = StateLog.open(self.directory, HISTORY, PID)
            assert contents(self.state) == before and self.state.corrupt_batches == 0
            return
        found = self.state.get(key)
        version = 0 if found is None else found[1]
        if op == "stale":
            stale = self.highest.get(key, 0) + 1 if found is None else version - 1
            with pytest.raises(StateConflict):
                put(self.state, key, value, expect=stale)
            return
        put(self.state, key, value if op == "put" else None, version if checked else None)
        written = batches(self.state.log)[-1][1][-1]
        assert written is not None and written.key == key
        assert written.version > self.highest.get(key, 0)  # a version is never used twice
        self.highest[key] = written.version
        if op == "put":
            self.values[key] = value
        else:
            self.values.pop(key, None)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(operations)
def test_any_history_of_changes_compactions_and_reopens_matches_a_dict(history):
    with tempfile.TemporaryDirectory() as directory:
        model = Model(directory)
        try:
            for step in history:
                model.step(*step)
                assert {k: v for k, (v, _) in contents(model.state).items()} == model.values
                for prefix in ("d/", "d/1", "a"):  # a prefix read sees what the dict holds
                    expected = sorted(k for k in model.values if k.startswith(prefix))
                    assert model.state.keys(prefix) == expected
        finally:
            model.state.close()
