"""The gateway's snapshot of one queue: the messages its topics keep, and where its log read was.

Without it a gateway rebuilt its index by reading its queues' logs from the beginning, so its
start took as long as the history behind it. With it, a gateway starts from the last snapshot
(taken every `limits.http_snapshot_interval_s` while the index changes, and when it stops) and
reads only what the log holds after it: its start follows the live messages, not the history.

A snapshot is consistent by construction: the index and the position it records are both
changed only on the event loop, in one call per delivered batch (gateway.py `_apply`), so the
messages saved are at least those before the position. Messages after it may be saved too
(the topics are copied in slices between loop turns); reading them again from the log files
them under the same indexes, which changes nothing.

    file  = frame*                       one file per queue, `<directory>/.http-<port>/<queue>`
    frame = length (4, big-endian) | crc32 of kind+body (4) | kind (1) | body
    kinds: HEAD (JSON: version, queue, the queue's identity, the Subscriber's resume state,
                 the exchange ids the messages were read from),
           TOPIC (its name, UTF-8),
           MESSAGE (index, 8 bytes | its batch's log offset, 8 | its exchange's number in the
                    head's list, 2 | the message, UTF-8),
           META (the meta of the MESSAGE before it, as records.py carries it; only for a
                 message with meta, so a snapshot without any is what it was before meta),
           LOGGED (index, 8 | offset, 8 | exchange number, 2: a message the index keeps but
                   does not hold in memory, past `http.cache.bytes`: read back from the log
                   when a get asks; an older gateway refuses the file and reads the log),
           END (the count of messages, 8)

Written to a temporary file, fsynced, renamed over the old one, and the directory fsynced: a
crash leaves the old snapshot or the new one. A file that is torn, fails a CRC, or belongs to
another incarnation of the queue (deleted and created again) is reported, naming the file and
the byte where it went wrong, and ignored: the gateway then reads the log from the beginning,
as without a snapshot. Nothing is lost either way: the log is the record, the snapshot a cache.
"""

from __future__ import annotations

import json
import logging
import os
import struct
import zlib
from array import array
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO, overload

from roq import limits
from roq.errors import CorruptRecord
from roq.log.format import decode_meta
from roq.log.log import sync_directory

log = logging.getLogger(__name__)

VERSION = 1
FRAME = struct.Struct(">IIB")
INDEX = struct.Struct(">Q")
MESSAGE_HEAD = struct.Struct(">QQH")  # index, offset, exchange number
HEAD, TOPIC, MESSAGE, END, META, LOGGED = 1, 2, 3, 4, 5, 6

# topic -> (index, (message, exchange id, log offset, meta)), oldest first (index.py's `export`:
# a message not held has its text None, saved as LOGGED; an expired one withheld has "" and is
# withheld again)
Kept = tuple[str | None, str, int, bytes]
Topics = Mapping[str, Sequence[tuple[int, Kept]]]


class Messages(Sequence[tuple[int, Kept]]):
    """One topic's messages as a snapshot carries them (index.py's `export`, `read`), in
    columns: 18 bytes per message (index, log offset, exchange number) and the texts and metas
    of those that have them, so that a snapshot of millions of places is no list of tuples
    (issue 34: ~190 bytes each, per snapshot, beside the index's own)."""

    __slots__ = ("_exchanges", "_held", "_indexes", "_numbers", "_offsets", "_origins")

    def __init__(self) -> None:
        self._indexes = array("Q")
        self._offsets = array("Q")
        self._origins = array("H")
        self._exchanges: list[str] = []
        self._numbers: dict[str, int] = {}
        self._held: dict[int, tuple[str | None, bytes]] = {}  # by position

    def append(self, index: int, kept: Kept) -> None:
        text, origin, offset, meta = kept
        number = self._numbers.get(origin)
        if number is None:
            if len(self._exchanges) > 0xFFFF:
                raise ValueError("more than 65,536 exchanges in one topic's messages")
            number = self._numbers[origin] = len(self._exchanges)
            self._exchanges.append(origin)
        if text is not None or meta:
            self._held[len(self._indexes)] = (text, meta)
        self._indexes.append(index)
        self._offsets.append(offset)
        self._origins.append(number)

    def set_meta(self, at: int, meta: bytes) -> None:
        self._held[at % len(self)] = (self[at][1][0], meta)

    def __len__(self) -> int:
        return len(self._indexes)

    @overload
    def __getitem__(self, at: int) -> tuple[int, Kept]: ...
    @overload
    def __getitem__(self, at: slice) -> list[tuple[int, Kept]]: ...
    def __getitem__(self, at: int | slice) -> tuple[int, Kept] | list[tuple[int, Kept]]:
        if isinstance(at, slice):
            return [self[n] for n in range(*at.indices(len(self)))]
        at = range(len(self))[at]  # IndexError past either end
        text, meta = self._held.get(at, (None, b""))
        origin = self._exchanges[self._origins[at]]
        return self._indexes[at], (text, origin, self._offsets[at], meta)

    def __iter__(self) -> Iterator[tuple[int, Kept]]:
        return (self[at] for at in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]


@dataclass(frozen=True, slots=True)
class Snapshot:
    queue: str
    identity: str  # the queue's incarnation (its znode's creation zxid): a recreated queue differs
    resume: dict[str, Any]  # the log Subscriber's resume state (client/subscriber.py)
    topics: Topics

    @property
    def messages(self) -> int:
        return sum(len(kept) for kept in self.topics.values())


class Unreadable(ValueError):
    """A snapshot file that cannot be used, and why (with the byte offset)."""


def directory(log_root: str, port: int) -> Path:
    """One directory per gateway of a machine (each has its own port), beside the logs."""
    return Path(log_root) / f".http-{port}"


def write(path: Path, snapshot: Snapshot) -> None:
    """Replace the snapshot at `path` with this one, atomically and durably."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temporary = path.with_name(path.name + ".tmp")
    origins: dict[str, int] = {}
    for kept in snapshot.topics.values():
        for _, (_, origin, _, _) in kept:
            origins.setdefault(origin, len(origins))
    if len(origins) > 0xFFFF:
        raise ValueError(f"{len(origins)} exchanges: a snapshot numbers at most 65,535")
    head = {
        "version": VERSION,
        "queue": snapshot.queue,
        "identity": snapshot.identity,
        "resume": snapshot.resume,
        "exchanges": list(origins),
    }
    with open(temporary, "wb", buffering=limits.http_snapshot_buffer_bytes) as out:
        _frame(out, HEAD, json.dumps(head).encode())
        count = 0
        for topic, kept in snapshot.topics.items():
            _frame(out, TOPIC, topic.encode())
            for index, (message, origin, offset, meta) in kept:
                where = MESSAGE_HEAD.pack(index, offset, origins[origin])
                if message is None:
                    _frame(out, LOGGED, where)
                    count += 1
                    continue
                _frame(out, MESSAGE, where + message.encode())
                if meta:
                    _frame(out, META, meta)
                count += 1
        _frame(out, END, INDEX.pack(count))
        out.flush()
        os.fsync(out.fileno())
    os.replace(temporary, path)
    sync_directory(path.parent, f"the gateway's snapshot of {snapshot.queue}")


def read(path: Path, queue: str, identity: str) -> Snapshot | None:
    """The snapshot at `path`; None when there is none. Unreadable (naming the byte) when it is
    damaged, torn, of another queue or of another incarnation of this one."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as error:
        raise Unreadable(f"{path}: cannot read it: {error.strerror}") from None
    frames = _frames(path, data)
    head = _head(path, next(frames, None), queue, identity)
    origins = head["exchanges"]
    topics: dict[str, Messages] = {}
    kept: Messages | None = None
    for at, kind, body in frames:
        if kind == TOPIC:
            kept = topics.setdefault(_text(path, at, body), Messages())
        elif kind in (MESSAGE, LOGGED) and kept is not None and len(body) >= MESSAGE_HEAD.size:
            index, offset, origin = MESSAGE_HEAD.unpack_from(body)
            if origin >= len(origins):
                raise Unreadable(f"{path}: byte {at}: exchange number {origin} is not in its head")
            text = body[MESSAGE_HEAD.size :]
            message = _text(path, at, text) if kind == MESSAGE else None
            if kind == LOGGED and text:
                raise Unreadable(f"{path}: byte {at}: a logged message with a text")
            kept.append(index, (message, origins[origin], offset, b""))
        elif kind == META and kept and kept[-1][1][0] is not None and not kept[-1][1][3]:
            kept.set_meta(-1, _checked_meta(path, at, body))
        elif kind == END and len(body) == INDEX.size:
            snapshot = Snapshot(queue, identity, head["resume"], topics)
            if INDEX.unpack(body)[0] != snapshot.messages:
                raise Unreadable(f"{path}: byte {at}: its end counts other messages than it holds")
            return snapshot
        else:
            raise Unreadable(f"{path}: byte {at}: an unexpected frame (kind {kind})")
    raise Unreadable(f"{path}: it ends before its end frame (torn)")


def _head(path: Path, first: tuple[int, int, bytes] | None, queue: str, identity: str) -> Any:
    if first is None or first[1] != HEAD:
        raise Unreadable(f"{path}: byte 0: no head frame")
    try:
        head = json.loads(first[2])
        found = (head["version"], head["queue"], head["identity"], dict(head["resume"]))
        if not all(isinstance(origin, str) for origin in head["exchanges"]):
            raise TypeError("an exchange id that is not a string")
    except (ValueError, KeyError, TypeError) as error:
        raise Unreadable(f"{path}: byte 0: its head is not a snapshot's ({error})") from None
    if found[0] != VERSION:
        raise Unreadable(f"{path}: version {found[0]}, this gateway reads {VERSION}")
    if found[1] != queue or found[2] != identity:
        raise Unreadable(
            f"{path}: of queue {found[1]} (incarnation {found[2]}), not of {queue} ({identity}):"
            " the queue was deleted and created again"
        )
    return head


def _frames(path: Path, data: bytes) -> Iterator[tuple[int, int, bytes]]:
    at = 0
    while at < len(data):
        if at + FRAME.size > len(data):
            raise Unreadable(f"{path}: byte {at}: a torn frame header")
        length, crc, kind = FRAME.unpack_from(data, at)
        start, end = at + FRAME.size, at + FRAME.size + length
        if end > len(data):
            raise Unreadable(f"{path}: byte {at}: a frame of {length} bytes runs past the end")
        body = data[start:end]
        if zlib.crc32(body, zlib.crc32(bytes([kind]))) != crc:
            raise Unreadable(f"{path}: byte {at}: a frame fails its CRC")
        yield at, kind, body
        at = end


def _checked_meta(path: Path, at: int, meta: bytes) -> bytes:
    """A message's meta, checked as the log checks a record's."""
    try:
        decode_meta(meta)
    except CorruptRecord as error:
        raise Unreadable(f"{path}: byte {at}: unsound meta ({error})") from None
    return meta


def _text(path: Path, at: int, body: bytes) -> str:
    try:
        return body.decode()
    except UnicodeDecodeError:
        raise Unreadable(f"{path}: byte {at}: text that is not UTF-8") from None


def _frame(out: BinaryIO, kind: int, body: bytes) -> None:
    out.write(FRAME.pack(len(body), zlib.crc32(body, zlib.crc32(bytes([kind]))), kind))
    out.write(body)


def floors(saved: Snapshot) -> dict[str, int]:
    """Per exchange the log offset before which the gateway needs nothing: where its read of
    that exchange's log is, or the oldest message a topic keeps from it, if older. Only the
    exchanges the read has a position in (the others are not known to be read at all)."""
    position = saved.resume.get("exchanges", {})
    found = {exchange_id: int(offset) for exchange_id, offset in position.items()}
    for kept in saved.topics.values():
        for _, (_, origin, offset, _) in kept:
            if origin in found and offset < found[origin]:
                found[origin] = offset
    return found
