"""Frames of the data plane: publisher → exchange, exchange → publisher, exchange → subscriber.

A publisher's DEALER talks to the exchange's ROUTER (front port F). Every message it sends is
`[kind, ...]`, where kind is one byte:

    b"B" [batch]            a record batch, fire and forget (acks=none)
    b"A" [token] [batch]    a record batch to confirm once appended (acks=leader); token: 8 B LE
    b"C" [token] [batch]    a record batch to confirm once every in-sync replica has it (acks=all)
    b"D" [token]            drain: answered once everything sent before it has been handled

and the exchange answers on the same connection:

    b"a" [token] [offset]   batch `token` accepted at log offset `offset` (8 bytes LE)
    b"n" [token] [reason]   batch `token` refused; reason is UTF-8 text
    b"d" [token] [run]      drain `token` done: every earlier batch was forwarded; `run` (8 B,
                            random per exchange process) tells a restarted exchange at the same
                            address from the process the publisher's earlier batches went to
    b"e" [reason]           an unconfirmed batch was refused (the publisher logs it)

Subscribers receive `[key][batch]` from the exchange's PUB socket (back port F+1), so ZeroMQ's
prefix filtering on the first frame does the key routing. The batch bytes are the same
everywhere (`roq.log.format`): the exchange never re-encodes a message.

Every number is range-checked where it is decoded here, before anything acts on it: an offset
must lie below `limits.log_offset_max`, a timestamp below 2**63 (BSON's int64), a read's size
is clamped to `READ_BYTES_MAX`. A number out of range is a `DecodeError` naming it.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from roq import limits
from roq.errors import DecodeError

BATCH = b"B"
CONFIRMED_BATCH = b"A"
COMMITTED_BATCH = b"C"
DRAIN = b"D"

ACK = b"a"
NACK = b"n"
DRAINED = b"d"
REFUSED = b"e"

TOKEN = struct.Struct("<Q")
OFFSET = struct.Struct("<Q")


@dataclass(frozen=True, slots=True)
class Inbound:
    """One publisher message as the exchange sees it (without the ROUTER's identity frame)."""

    kind: bytes
    token: bytes  # b"" for BATCH
    batch: memoryview | None  # None for DRAIN


def parse_inbound(frames: Sequence[memoryview | bytes]) -> Inbound:
    """Check the frame count and kind; the batch itself is checked by `format.check_batch`."""
    if not frames:
        raise DecodeError("empty message")
    kind = bytes(frames[0])
    expected = {BATCH: 2, CONFIRMED_BATCH: 3, COMMITTED_BATCH: 3, DRAIN: 2}.get(kind)
    if expected is None:
        raise DecodeError(f"unknown frame kind {kind[:8]!r}")
    if len(frames) != expected:
        raise DecodeError(f"kind {kind!r} takes {expected} frames, got {len(frames)}")
    if kind == BATCH:
        return Inbound(kind, b"", memoryview(frames[1]))
    token = bytes(frames[1])
    if len(token) != TOKEN.size:
        raise DecodeError(f"token must be {TOKEN.size} bytes, got {len(token)}")
    if kind == DRAIN:
        return Inbound(kind, token, None)
    return Inbound(kind, token, memoryview(frames[2]))


def ack(token: bytes, offset: int) -> list[bytes]:
    return [ACK, token, OFFSET.pack(offset)]


def nack(token: bytes, reason: str) -> list[bytes]:
    return [NACK, token, reason.encode()[:512]]


def drained(token: bytes, run: bytes) -> list[bytes]:
    return [DRAINED, token, run]


RUN_BYTES = 8  # an exchange process's run id (`drained`)


def refused(reason: str) -> list[bytes]:
    return [REFUSED, reason.encode()[:512]]


# --- replay (exchange port F+3, ROUTER; the client is a DEALER) -------------------------------
# Requests:  b"R" [offset 8 LE] [max_bytes 4 LE]    read whole batches from `offset`
#            b"T" [timestamp_us 8 LE]               the offset of the first batch at or after T
#            b"P"                                   the log's start and end offsets
# Each may end with one more frame, [leader id]: the request is then answered from this
# exchange's copy of that leader's log (replication.py), which has the leader's offsets. This is
# how a subscriber replays the log of an exchange that is dead.
# Reply:     b"r" [status 1] [next_offset 8] [start 8] [end 8] [data]
#            status: b"B" batches in data, b"N" no message yet (offset == end),
#                    b"E" evicted (next_offset = start), b"X" error (data = UTF-8 reason)
#            With b"B", next_offset = offset + len(data) unless the log is damaged past the
#            data: then next_offset is where sound batches resume (the reader skips the rest).
READ = b"R"
SEEK_TIME = b"T"
POSITION = b"P"
READ_REPLY = b"r"
READ_BATCHES, READ_NOTHING_YET, READ_EVICTED, READ_ERROR = b"B", b"N", b"E", b"X"
# One read answers at most this much (and at least one batch). A reader has one read in flight
# and the exchange takes up to 4 MiB of publishers' batches per loop turn: smaller reads would
# let a subscriber behind a flat-out publisher fall further behind (docs/benchmarks.md §5).
READ_BYTES_MAX = 4 * 1024 * 1024
_READ = struct.Struct("<QI")
_REPLY = struct.Struct("<QQQ")


@dataclass(frozen=True, slots=True)
class ReadRequest:
    kind: bytes
    offset: int = 0
    max_bytes: int = 0
    timestamp_us: int = 0
    leader: str = ""  # read this exchange's copy of another exchange's log


_ARGUMENT_BYTES = {POSITION: None, READ: _READ.size, SEEK_TIME: OFFSET.size}
LEADER_ID_BYTES_MAX = 200


def parse_read_request(frames: Sequence[bytes]) -> ReadRequest:
    if not frames:
        raise DecodeError("empty replay request")
    kind = bytes(frames[0])
    if kind not in _ARGUMENT_BYTES:
        raise DecodeError(f"unknown replay request kind {kind[:8]!r}")
    size = _ARGUMENT_BYTES[kind]
    fixed = 1 if size is None else 2
    if len(frames) not in (fixed, fixed + 1) or (size is not None and len(frames[1]) != size):
        raise DecodeError(f"malformed replay request of kind {kind!r} with {len(frames)} frames")
    leader = _leader(frames[fixed]) if len(frames) > fixed else ""
    if kind == READ:
        offset, max_bytes = _READ.unpack(frames[1])
        check_offset(offset, "read offset")
        return ReadRequest(kind, offset, min(max(max_bytes, 1), READ_BYTES_MAX), leader=leader)
    if kind == SEEK_TIME:
        timestamp_us = OFFSET.unpack(frames[1])[0]
        if timestamp_us > limits.int64_max:
            raise DecodeError(f"timestamp {timestamp_us} µs is past 2**63")
        return ReadRequest(kind, timestamp_us=timestamp_us, leader=leader)
    return ReadRequest(kind, leader=leader)


def check_offset(offset: int, what: str = "offset") -> int:
    """`offset` if a log can hold it (0 <= offset < limits.log_offset_max), else DecodeError."""
    if not 0 <= offset < limits.log_offset_max:
        raise DecodeError(f"{what} {offset} is beyond any log (not below {limits.log_offset_max})")
    return offset


def decode_offset(frame: bytes | memoryview, what: str = "offset") -> int:
    """An 8-byte little-endian log offset frame, size and range checked."""
    if len(frame) != OFFSET.size:
        raise DecodeError(f"{what} must be {OFFSET.size} bytes, got {len(frame)}")
    return check_offset(OFFSET.unpack(frame)[0], what)


def _leader(frame: bytes) -> str:
    if not 0 < len(frame) <= LEADER_ID_BYTES_MAX:
        raise DecodeError(f"leader id must be 1 to {LEADER_ID_BYTES_MAX} bytes, got {len(frame)}")
    return bytes(frame).decode(errors="replace")


def _with_leader(frames: list[bytes], leader: str) -> list[bytes]:
    return [*frames, leader.encode()] if leader else frames


def read_request(offset: int, max_bytes: int = READ_BYTES_MAX, leader: str = "") -> list[bytes]:
    return _with_leader([READ, _READ.pack(offset, max_bytes)], leader)


def seek_request(timestamp_us: int, leader: str = "") -> list[bytes]:
    return _with_leader([SEEK_TIME, OFFSET.pack(timestamp_us)], leader)


def position_request(leader: str = "") -> list[bytes]:
    return _with_leader([POSITION], leader)


def read_reply(status: bytes, next_offset: int, start: int, end: int, data: bytes) -> list[bytes]:
    return [READ_REPLY, status, _REPLY.pack(next_offset, start, end), data]


@dataclass(frozen=True, slots=True)
class ReadReply:
    status: bytes
    next_offset: int
    start: int
    end: int
    data: bytes


def parse_read_reply(frames: Sequence[bytes]) -> ReadReply:
    if len(frames) != 4 or frames[0] != READ_REPLY or len(frames[2]) != _REPLY.size:
        raise DecodeError(f"malformed replay reply ({len(frames)} frames)")
    next_offset, start, end = _REPLY.unpack(frames[2])
    for value, what in ((next_offset, "next offset"), (start, "log start"), (end, "log end")):
        check_offset(value, what)
    return ReadReply(bytes(frames[1]), next_offset, start, end, bytes(frames[3]))
