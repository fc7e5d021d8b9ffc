"""The gateway's snapshot file (roq/http/snapshot.py): what is written is read back whole, and a
file that is torn, damaged, of another queue or of a recreated queue is refused, naming the file
and the byte, never half-used."""

from __future__ import annotations

from pathlib import Path

import pytest

from roq.http import snapshot
from roq.http.snapshot import Snapshot, Unreadable
from roq.log.format import encode_meta

META = encode_meta({"content-type": "text/plain"}, bytes(range(16)), 1_700_000_060_000_000, None)
RESUME = {"queue": "http-0", "exchanges": {"x1": 4096}, "streams": [["ab", "6d71", 7]]}


def _saved(tmp_path: Path) -> tuple[Path, Snapshot]:
    topics = {
        "news": [(1, ("first", "x1", 0, b"")), (2, ("second ☃", "x2", 512, b""))],
        "t/" + "é" * 300: [(9, ("", "x1", 4000, b"")), (10, ("x" * 70_000, "x1", 4096, b""))],
        "empty-named-message": [(1, ("", "x2", 2**40, b""))],
        "meta": [
            (3, ("with meta", "x1", 64, META)),
            (4, ("", "x2", 128, META)),
            (5, ("m", "x1", 9, b"")),
        ],
    }
    saved = Snapshot("http-0", "1a2b", RESUME, topics)
    path = tmp_path / ".http-8080" / "http-0"
    snapshot.write(path, saved)
    return path, saved


def test_a_snapshot_is_read_back_as_written(tmp_path: Path) -> None:
    path, saved = _saved(tmp_path)
    assert snapshot.read(path, "http-0", "1a2b") == saved
    assert not path.with_name("http-0.tmp").exists()  # written aside, renamed whole


def test_no_file_is_no_snapshot(tmp_path: Path) -> None:
    assert snapshot.read(tmp_path / "http-0", "http-0", "1a2b") is None


def test_a_recreated_queue_or_another_queue_does_not_take_the_snapshot(tmp_path: Path) -> None:
    path, _ = _saved(tmp_path)
    with pytest.raises(Unreadable, match="deleted and created again"):
        snapshot.read(path, "http-0", "ffff")
    with pytest.raises(Unreadable, match="not of http-1"):
        snapshot.read(path, "http-1", "1a2b")


@pytest.mark.parametrize("cut", [1, 9, 200, -1])
def test_a_torn_snapshot_is_refused(tmp_path: Path, cut: int) -> None:
    path, _ = _saved(tmp_path)
    data = path.read_bytes()
    path.write_bytes(data[:cut] if cut > 0 else data[:-1])
    with pytest.raises(Unreadable, match=str(path)):
        snapshot.read(path, "http-0", "1a2b")


def test_a_flipped_byte_anywhere_is_refused_naming_its_frame(tmp_path: Path) -> None:
    path, _ = _saved(tmp_path)
    data = path.read_bytes()
    for at in (0, 5, 8, 20, len(data) // 2, len(data) - 3):
        damaged = bytearray(data)
        damaged[at] ^= 0x40
        path.write_bytes(bytes(damaged))
        with pytest.raises(Unreadable, match=r"byte \d+|torn|past the end"):
            snapshot.read(path, "http-0", "1a2b")


def test_a_snapshot_without_its_end_frame_is_torn(tmp_path: Path) -> None:
    path, _ = _saved(tmp_path)
    data = path.read_bytes()
    end = snapshot.FRAME.size + snapshot.INDEX.size  # the last frame
    path.write_bytes(data[:-end])
    with pytest.raises(Unreadable, match="before its end frame"):
        snapshot.read(path, "http-0", "1a2b")


def test_a_file_that_is_not_a_snapshot_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "http-0"
    path.write_bytes(b"\x00" * 3)
    with pytest.raises(Unreadable, match="torn frame header"):
        snapshot.read(path, "http-0", "1a2b")
    path.write_bytes(b"not a snapshot at all, just text written here by someone")
    with pytest.raises(Unreadable):
        snapshot.read(path, "http-0", "1a2b")


def test_floors_are_the_read_position_or_the_oldest_kept_message_of_each_exchange() -> None:
    topics = {
        "a": [(5, ("m", "x1", 300, b"")), (6, ("m", "x1", 900, b""))],
        "b": [(2, ("m", "x2", 50, b"")), (3, ("m", "x1", 1000, b""))],
        "c": [(1, ("m", "x9", 7, b""))],  # an exchange the read has no position in: no floor
    }
    resume = {"exchanges": {"x1": 4096, "x2": 40, "x3": 800}}
    saved = Snapshot("http-0", "1", resume, topics)
    assert snapshot.floors(saved) == {"x1": 300, "x2": 40, "x3": 800}


def test_a_message_without_meta_is_saved_as_before_meta_and_a_bad_meta_is_refused(
    tmp_path: Path,
) -> None:
    path = tmp_path / "http-0"
    plain = {"a": [(1, ("m", "x1", 0, b""))]}
    snapshot.write(path, Snapshot("http-0", "1", RESUME, plain))
    assert snapshot.META not in {kind for _, kind, _ in snapshot._frames(path, path.read_bytes())}
    snapshot.write(path, Snapshot("http-0", "1", RESUME, {"a": [(1, ("m", "x1", 0, b"\x08"))]}))
    with pytest.raises(Unreadable, match="unsound meta"):
        snapshot.read(path, "http-0", "1")
