"""The gateway's index of places, packed (http/index.py `Places`, issue 34): a kept message's
place costs a few bytes (`limits.http_place_bytes_max` at most), whatever the order messages
come in, and the index answers as it did when each place was a tuple in a dict; a snapshot
carries its messages in columns (snapshot.py `Messages`) and reads what the previous version
wrote."""

from __future__ import annotations

import base64
import tracemalloc
from pathlib import Path

import pytest

from roq import limits
from roq.http import snapshot
from roq.http.index import Places, TopicIndex
from roq.log.format import encode_meta

META = encode_meta({"k": "v"}, None, 1_700_000_060_000_000, None)


def _fill(index: TopicIndex, topic: str, indexes: range | list[int], origin: str = "x1") -> None:
    index.add((topic, n, f"m{n}", origin, n * 100, b"") for n in indexes)


def _kept(index: TopicIndex, topic: str) -> list[int]:
    return list(index.messages[topic].indexes())


def test_places_are_appended_and_looked_up_holes_included() -> None:
    index = TopicIndex(100, 1 << 20)
    _fill(index, "t", [1, 2, 3, 5, 8])  # 4, 6, 7: publishes that failed (or not read yet)
    assert index.count == 5 and len(index.messages["t"]) == 5
    assert _kept(index, "t") == [1, 2, 3, 5, 8]
    assert index.place("t", 5) == ("x1", 500, False)
    assert index.place("t", 4) is None and index.place("t", 9) is None
    assert index.place("t", 0) is None and index.place("other", 1) is None
    assert index.lookup("t", 8) == ("m8", "x1", 800, b"")
    _fill(index, "t", [4], origin="x2")  # a hole filled later
    assert index.place("t", 4) == ("x2", 400, False) and index.count == 6
    _fill(index, "t", [4], origin="x3")  # read again (another copy): its place moves, no count
    assert index.place("t", 4) == ("x3", 400, False) and index.count == 6


def test_eviction_from_the_head_keeps_the_newest_and_bounds_the_arrays() -> None:
    index = TopicIndex(100, 1 << 20)
    _fill(index, "t", range(1, 10_001))
    places = index.messages["t"]
    assert index.count == 100 and _kept(index, "t") == list(range(9_901, 10_001))
    assert index.place("t", 9_900) is None and index.lookup("t", 9_900) is None
    assert len(index.held.entries) == 100  # an evicted message's text goes with its place
    # evicted places are let go of lazily, at most a sixteenth of the arrays
    assert len(places.tags) == len(places.offsets) <= 100 + 16
    _fill(index, "t", [9_900])  # older than the newest maxQueueSize: already evicted
    assert index.place("t", 9_900) is None and index.count == 100


def test_a_jump_past_the_whole_queue_evicts_everything_and_allocates_no_gap() -> None:
    index = TopicIndex(10, 1 << 20)
    _fill(index, "t", range(1, 11))
    _fill(index, "t", [1_000_000_000])
    assert _kept(index, "t") == [1_000_000_000] and index.count == 1
    assert len(index.messages["t"].tags) <= 10  # no billion holes
    assert len(index.held.entries) == 1


def test_an_older_message_after_newer_ones_is_kept_in_order() -> None:
    """Racing gateways: the logs may bring a topic's messages out of index order."""
    index = TopicIndex(10, 1 << 20)
    _fill(index, "t", [20, 25])
    _fill(index, "t", [17, 16])  # older, within the newest 10: kept
    _fill(index, "t", [15])  # at the floor (25 - 10): evicted already
    assert _kept(index, "t") == [16, 17, 20, 25] and index.count == 4
    assert index.place("t", 16) == ("x1", 1600, False)
    _fill(index, "t", [30])  # the floor moves to 20
    assert _kept(index, "t") == [25, 30] and index.count == 2


def test_a_withheld_message_stays_withheld_when_read_again_and_in_a_snapshot() -> None:
    index = TopicIndex(10, 1 << 20)
    index.add([("t", 1, "gone", "x1", 0, META), ("t", 2, "kept", "x1", 7, b"")])
    assert index.withhold("t", 1) and not index.withhold("t", 1)
    assert not index.withhold("t", 3) and not index.withhold("u", 1)
    assert index.place("t", 1) == ("x1", 0, True) and index.place("t", 2) == ("x1", 7, False)
    index.add([("t", 1, "gone", "x2", 5, META)])  # read again
    assert index.lookup("t", 1) == (None, "x2", 5, META)
    assert index.export(["t"])["t"] == [(1, ("", "x2", 5, META)), (2, ("kept", "x1", 7, b""))]


def test_an_offset_past_4_gib_widens_the_topics_offsets() -> None:
    index = TopicIndex(10, 0)
    index.add([("t", 1, None, "x1", 4096, b""), ("u", 1, None, "x1", 4096, b"")])
    assert index.messages["t"].offsets.typecode == "I"
    index.add([("t", 2, None, "x1", 2**40 + 3, b"")])
    assert index.messages["t"].offsets.typecode == "Q"
    assert index.messages["u"].offsets.typecode == "I"  # per topic
    assert index.place("t", 1) == ("x1", 4096, False)
    assert index.place("t", 2) == ("x1", 2**40 + 3, False)


def test_exchange_numbers_no_place_names_are_reused_and_past_them_a_message_is_not_kept(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(limits, "http_index_exchanges_max", 2)
    index = TopicIndex(2, 1 << 20)
    _fill(index, "t", [1], origin="a")
    _fill(index, "t", [2], origin="b")
    _fill(index, "t", [3], origin="c")  # 1 evicted: a's number is free again
    assert index.place("t", 3) == ("c", 300, False) and index.place("t", 2) == ("b", 200, False)
    assert sorted(index.exchanges) == ["b", "c"]
    _fill(index, "u", [1], origin="d")  # b and c are in use: not kept, counted
    assert index.place("u", 1) is None and index.unplaced == 1
    assert index.count == 2


def test_a_full_topic_costs_at_most_its_bound_per_place() -> None:
    index = TopicIndex(10_000, 0)  # nothing held: places alone
    tracemalloc.start()
    index.add(("t", n, None, f"x{n % 4}", 2**33 + n * 4096, b"") for n in range(1, 25_001))
    traced = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert index.count == 10_000
    assert index.place_bytes() <= limits.http_place_bytes_max * 10_000
    assert traced <= limits.http_place_bytes_max * 10_000 + 4096  # the index's own dicts
    # the bound's own arithmetic: 2 + 8 bytes, a 16th evicted, array's slack of a 16th
    assert limits.http_place_bytes_max >= 10 * 16 / 15 * 17 / 16
    assert isinstance(index.messages["t"], Places)


def test_a_snapshot_in_columns_is_the_list_it_was_and_round_trips(tmp_path: Path) -> None:
    index = TopicIndex(1_000, 3_000)
    index.add(("t", n, f"m{n}", f"x{n % 3}", n * 64, META if n % 2 else b"") for n in range(1, 51))
    exported = index.export(["t", "absent"])
    assert list(exported) == ["t"] and len(exported["t"]) == 50
    as_list = list(exported["t"])
    assert exported["t"] == as_list and as_list == exported["t"]
    assert exported["t"][-1] == as_list[-1] and exported["t"][2:4] == as_list[2:4]
    path = tmp_path / "http-0"
    saved = snapshot.Snapshot("http-0", "1a", {"exchanges": {"x0": 0}}, exported)
    snapshot.write(path, saved)
    restored = snapshot.read(path, "http-0", "1a")
    assert restored == saved and restored.messages == 50


# written by the previous version of snapshot.py (lists of tuples, 27 Nov 2026, b14e696): news 1
# LOGGED, 2 with meta at offset 2**40, 3 withheld (""), with meta; t 7
PREVIOUS = (
    "AAAAfBXbh2IBeyJ2ZXJzaW9uIjogMSwgInF1ZXVlIjogImh0dHAtMCIsICJpZGVudGl0eSI6ICIxYSIsICJyZXN1bWUi"
    "OiB7ImV4Y2hhbmdlcyI6IHsieDEiOiA4MCwgIngyIjogOX19LCAiZXhjaGFuZ2VzIjogWyJ4MSIsICJ4MiJdfQAAAASA"
    "deIxAm5ld3MAAAAShlodvAYAAAAAAAAAAQAAAAAAAAAAAAAAAAAYNLtyEwMAAAAAAAAAAgAAAQAAAAAAAAFzZWNvbmQA"
    "AAAPRXuJfQUKAQEBAADHsRskCgYAa3YAAAASlKvYtQMAAAAAAAAAAwAAAAAAAABGAAAAAAAPRXuJfQUKAQEBAADHsRsk"
    "CgYAa3YAAAABJIfFWAJ0AAAAF4JDCYIDAAAAAAAAAAcAAAAAAAAACQABc2V2ZW4AAAAIvIiBuwQAAAAAAAAABA=="
)


def test_a_snapshot_the_previous_version_wrote_is_read_into_the_packed_index(
    tmp_path: Path,
) -> None:
    path = tmp_path / "http-0"
    path.write_bytes(base64.b64decode(PREVIOUS))
    found = snapshot.read(path, "http-0", "1a")
    assert found is not None
    assert found.topics == {
        "news": [
            (1, (None, "x1", 0, b"")),
            (2, ("second", "x2", 2**40, META)),
            (3, ("", "x1", 70, META)),
        ],
        "t": [(7, ("seven", "x2", 9, b""))],
    }
    index = TopicIndex(100, 1 << 20)
    index.add(
        (topic, n, text, origin, offset, meta)
        for topic, kept in found.topics.items()
        for n, (text, origin, offset, meta) in kept
    )
    assert index.count == 4 and index.lookup("news", 1) is None
    assert index.place("news", 1) == ("x1", 0, False)
    assert index.lookup("news", 2) == ("second", "x2", 2**40, META)
    assert snapshot.floors(found) == {"x1": 0, "x2": 9}
