"""Frames of the data plane: publisher → exchange, exchange → publisher, exchange → subscriber.

A publisher's DEALER talks to the exchange's ROUTER (front port F). Every message it sends is
`[kind, ...]`, where kind is one byte:

    b"B" [batch]            a record batch, fire and forget (acks=none)
    b"A" [token] [batch]    a record batch the publisher wants confirmed; token is 8 bytes LE
    b"D" [token]            drain: answered once everything sent before it has been handled

and the exchange answers on the same connection:

    b"a" [token] [offset]   batch `token` accepted at log offset `offset` (8 bytes LE)
    b"n" [token] [reason]   batch `token` refused; reason is UTF-8 text
    b"d" [token]            drain `token` done: every earlier batch was forwarded
    b"e" [reason]           an unconfirmed batch was refused (the publisher logs it)

Subscribers receive `[key][batch]` from the exchange's PUB socket (back port F+1), so ZeroMQ's
prefix filtering on the first frame does the key routing. The batch bytes are the same
everywhere (`roq.log.format`): the exchange never re-encodes a message.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass

from roq.errors import DecodeError

BATCH = b"B"
CONFIRMED_BATCH = b"A"
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
    expected = {BATCH: 2, CONFIRMED_BATCH: 3, DRAIN: 2}.get(kind)
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


def drained(token: bytes) -> list[bytes]:
    return [DRAINED, token]


def refused(reason: str) -> list[bytes]:
    return [REFUSED, reason.encode()[:512]]
