"""The gateway's memory bound (http/index.py `Held`, `http.cache.bytes`): the index keeps every
message's place, holds the text and meta of the most recently used within the bound, and a
snapshot saves those not held by their place alone (snapshot.py LOGGED), so that neither the
gateway's memory nor its snapshot grows with maxTopics x maxQueueSize x maxMsgSize."""

from __future__ import annotations

from pathlib import Path

from roq.http import snapshot
from roq.http.index import ENTRY_BYTES, Held, TopicIndex
from roq.log.format import encode_meta

META = encode_meta({"k": "v"}, None, 1_700_000_060_000_000, None)


def _message(n: int) -> str:
    return f"m{n:04d}" + "x" * 995  # 1,000 characters


def test_the_index_holds_at_most_its_bound_and_keeps_every_place() -> None:
    index = TopicIndex(1000, 10_000)
    index.add((f"t{n % 3}", n, _message(n), "x1", n * 1024, b"") for n in range(1, 301))
    assert index.count == 300  # every place kept
    assert 0 < index.held.bytes <= 10_000
    assert index.held.evictions == 300 - len(index.held.entries)
    assert index.lookup("t1", 1) is None  # the oldest: not held ...
    assert index.place("t1", 1) == ("x1", 1024, False)  # ... but kept, where it is
    assert index.lookup("t0", 300) == (_message(300), "x1", 300 * 1024, b"")  # the newest held


def test_a_message_read_back_is_held_again_and_the_least_recently_used_goes() -> None:
    index = TopicIndex(1000, 3 * (ENTRY_BYTES + 1100))
    index.add(("t", n, _message(n), "x1", n, b"") for n in range(1, 5))
    assert [key[1] for key in index.held.entries] == [2, 3, 4]
    place = index.place("t", 1)
    assert place is not None
    assert index.refill("t", 1, place, _message(1), META) == (_message(1), "x1", 1, META)
    assert [key[1] for key in index.held.entries] == [3, 4, 1]
    assert index.lookup("t", 3) is not None  # used: 4 goes next
    index.add([("t", 5, _message(5), "x1", 5, b"")])
    assert [key[1] for key in index.held.entries] == [1, 3, 5]


def test_eviction_from_the_topic_lets_go_of_its_text() -> None:
    index = TopicIndex(2, 1 << 20)
    index.add(("t", n, _message(n), "x1", n, b"") for n in range(1, 11))
    assert index.count == 2 and len(index.held.entries) == 2
    assert index.held.bytes == sum(Held.size(*held) for held in index.held.entries.values())


def test_a_withheld_message_read_back_stays_withheld() -> None:
    index = TopicIndex(10, 0)  # nothing held
    index.add([("t", 1, "gone", "x1", 0, META)])
    assert index.held.bytes == 0 and index.lookup("t", 1) is None
    assert index.withhold("t", 1) and not index.withhold("t", 1)
    place = index.place("t", 1)
    assert place == ("x1", 0, True)
    assert index.refill("t", 1, place, "gone", META) == (None, "x1", 0, META)


def test_a_snapshot_saves_a_message_not_held_by_its_place(tmp_path: Path) -> None:
    index = TopicIndex(100, 2 * (ENTRY_BYTES + 1100))
    index.add(("t", n, _message(n), "x1", n * 10, b"") for n in range(1, 11))
    exported = index.export(["t"])
    assert [kept[0] is None for _, kept in exported["t"]] == [True] * 8 + [False] * 2
    path = tmp_path / "http-0"
    saved = snapshot.Snapshot("http-0", "1a", {"exchanges": {"x1": 200}}, exported)
    snapshot.write(path, saved)
    assert path.stat().st_size < 2 * 1100 + 10 * 50  # the texts not held are not in it
    restored = snapshot.read(path, "http-0", "1a")
    assert restored == saved
    again = TopicIndex(100, 1 << 20)
    again.add((topic, n, text, origin, offset, meta)
              for topic, kept in restored.topics.items()
              for n, (text, origin, offset, meta) in kept)  # fmt: skip
    assert again.count == 10 and len(again.held.entries) == 2
    assert snapshot.floors(saved) == {"x1": 10}  # retention still stops at the oldest kept
