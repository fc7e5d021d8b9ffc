"""BSON control messages: decode with bounds, validate fields, build replies.

Every control channel carries one BSON document per frame with an int `CMD` field; every reply
carries `RESULT` (see `commands.Result`). Decoding checks the frame count and size before
`bson.decode` runs, so garbage costs little and never raises anything but `ProtocolError`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import bson
from bson.errors import BSONError

from roq import limits
from roq.errors import DecodeError, FrameTooLarge
from roq.protocol.commands import Reason, Result

Document = dict[str, Any]


def encode(doc: Mapping[str, Any]) -> bytes:
    return bytes(bson.encode(dict(doc)))


def decode(frames: Sequence[bytes], max_bytes: int = limits.admin_frame_bytes_max) -> Document:
    """One frame holding one BSON document with an integer `CMD`."""
    if len(frames) != 1:
        raise DecodeError(f"expected 1 frame, got {len(frames)}")
    frame = frames[0]
    if len(frame) > max_bytes:
        raise FrameTooLarge(f"frame of {len(frame)} bytes exceeds the {max_bytes}-byte bound")
    try:
        doc: Document = bson.decode(bytes(frame))
    except (BSONError, ValueError, TypeError, IndexError, OverflowError) as error:
        raise DecodeError(f"not a BSON document ({len(frame)} bytes): {error}") from None
    command = doc.get("CMD")
    if not isinstance(command, int) or isinstance(command, bool):
        raise DecodeError("the CMD field is missing or not an integer")
    return doc


def decode_reply(frame: bytes) -> Document:
    try:
        doc: Document = bson.decode(bytes(frame))
    except (BSONError, ValueError, TypeError, IndexError, OverflowError) as error:
        raise DecodeError(f"reply is not a BSON document: {error}") from None
    if not isinstance(doc.get("RESULT"), int):
        raise DecodeError("reply has no integer RESULT field")
    return doc


def field_str(doc: Mapping[str, Any], name: str, *, max_chars: int = 1024) -> str:
    """A required, non-empty string field; DecodeError names the field otherwise."""
    value = doc.get(name)
    if value is None:
        raise DecodeError(f"the {name} field is not present")
    if not isinstance(value, str) or not value:
        raise DecodeError(f"the {name} field must be a non-empty string")
    if len(value) > max_chars:
        raise DecodeError(f"the {name} field is longer than {max_chars} characters")
    return value


def field_int(doc: Mapping[str, Any], name: str) -> int:
    value = doc.get(name)
    if value is None:
        raise DecodeError(f"the {name} field is not present")
    if not isinstance(value, int) or isinstance(value, bool):
        raise DecodeError(f"the {name} field must be an integer")
    return value


def ok(comment: str = "SUCCESS", **fields: Any) -> Document:
    return {"RESULT": int(Result.OK), "COMMENT": comment, **fields}


def fail(reason: Reason, comment: str, **fields: Any) -> Document:
    return {"RESULT": int(Result.FAIL), "COMMENT": comment, "ERROR": str(reason), **fields}


def lead_lost(leader: str = "") -> Document:
    return {"RESULT": int(Result.LEAD_LOST), "COMMENT": "not the leader", "LEADER": leader}
