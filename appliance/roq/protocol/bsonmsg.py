"""BSON control messages: decode with bounds, validate fields, build replies.

Every control channel carries one BSON document per frame with an int `CMD` field; every reply
carries `RESULT` (see `commands.Result`). Decoding checks the frame count and size before
`bson.decode` runs, so garbage costs little and never raises anything but `ProtocolError`.

The `field_*` helpers read one field of a decoded document for the message schemas
(`roq.protocol.messages`): a field is required unless the schema gives it a `default`, and a
missing or ill-typed field raises `DecodeError` naming it (with `prefix`, its place in a
sub-document: `Exchange.Front`, `Top[3].Bytes`). `Reply` is the envelope every reply shares.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final, Self, TypeGuard, TypeVar

import bson
from bson.errors import BSONError

from roq import limits
from roq.errors import DecodeError, FrameTooLarge
from roq.protocol.commands import Reason, Result
from roq.protocol.endpoints import ENDPOINT_CHARS_MAX, check_endpoint

Document = dict[str, Any]
T = TypeVar("T")

# BSON's int64, a fact of the format rather than a bound (limits.py holds those): a larger
# integer cannot go back on the wire, and a log offset never exceeds it.
INT64_MAX: Final = 2**63 - 1


class Required:
    """The `default` of a field that has none: it must be present."""


REQUIRED: Final = Required()


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


def command(doc: Mapping[str, Any]) -> int:
    """The `CMD` of a document (`decode` has checked it is an integer)."""
    return field_int(doc, "CMD", lo=-(2**31), hi=2**31 - 1)


def decode_reply(frame: bytes) -> Document:
    try:
        doc: Document = bson.decode(bytes(frame))
    except (BSONError, ValueError, TypeError, IndexError, OverflowError) as error:
        raise DecodeError(f"reply is not a BSON document: {error}") from None
    if not isinstance(doc.get("RESULT"), int):
        raise DecodeError("reply has no integer RESULT field")
    return doc


def is_text(value: object) -> TypeGuard[str]:
    """A plain str: BSON's Code (JavaScript, with or without a scope) decodes to a subclass of
    str that cannot be hashed, so a Code sent as a queue name passed `isinstance` and broke the
    first set or dict it met (a GCM answered `internal`, issue 31 finding 8)."""
    return type(value) is str


def _missing(name: str, prefix: str, default: T | Required) -> T:
    if isinstance(default, Required):
        raise DecodeError(f"the {prefix}{name} field is not present")
    return default


def field_str(
    doc: Mapping[str, Any],
    name: str,
    *,
    max_chars: int = limits.message_str_chars_max,
    empty_ok: bool = False,
    default: str | Required = REQUIRED,
    prefix: str = "",
) -> str:
    """A string field, non-empty unless `empty_ok`; DecodeError names the field otherwise."""
    value = doc.get(name)  # BSON null counts as absent
    if value is None:
        return _missing(name, prefix, default)
    if not is_text(value) or not (value or empty_ok):
        raise DecodeError(
            f"the {prefix}{name} field must be a {'' if empty_ok else 'non-empty '}string"
        )
    if len(value) > max_chars:
        raise DecodeError(f"the {prefix}{name} field is longer than {max_chars} characters")
    return value


def field_endpoint(
    doc: Mapping[str, Any],
    name: str,
    *,
    room: int = 0,
    empty_ok: bool = False,
    default: str | Required = REQUIRED,
    prefix: str = "",
) -> str:
    """An endpoint field, `tcp://<address or host name>:<port>` (`endpoints.parse_endpoint`;
    `room`: ports the block starting there needs above it); "" only if `empty_ok`."""
    value = field_str(
        doc, name, max_chars=ENDPOINT_CHARS_MAX, empty_ok=empty_ok, default=default, prefix=prefix
    )
    if not value and empty_ok:
        return value
    try:
        return check_endpoint(value, room=room)
    except DecodeError as error:
        raise DecodeError(f"the {prefix}{name} field: {error}") from None


def field_int(
    doc: Mapping[str, Any],
    name: str,
    *,
    lo: int = 0,
    hi: int = INT64_MAX,
    default: int | Required = REQUIRED,
    prefix: str = "",
) -> int:
    """An integer field within [lo, hi]: by default a count or offset, 0 ≤ n < 2**63."""
    value = doc.get(name)  # BSON null counts as absent
    if value is None:
        return _missing(name, prefix, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise DecodeError(f"the {prefix}{name} field must be an integer")
    if not lo <= value <= hi:
        raise DecodeError(f"the {prefix}{name} field must be from {lo} to {hi}, not {value}")
    return value


def field_float(
    doc: Mapping[str, Any],
    name: str,
    *,
    lo: float = -math.inf,
    default: float | Required = REQUIRED,
    prefix: str = "",
) -> float:
    """A finite number (an integer is taken too: BSON keeps 2.0 and 2 apart, senders may not)."""
    value = doc.get(name)  # BSON null counts as absent
    if value is None:
        return _missing(name, prefix, default)
    if not isinstance(value, int | float) or isinstance(value, bool):
        raise DecodeError(f"the {prefix}{name} field must be a number")
    number = float(value)
    if not math.isfinite(number) or number < lo:
        raise DecodeError(f"the {prefix}{name} field must be a finite number of at least {lo}")
    return number


def field_bool(
    doc: Mapping[str, Any], name: str, *, default: bool | Required = REQUIRED, prefix: str = ""
) -> bool:
    value = doc.get(name)  # BSON null counts as absent
    if value is None:
        return _missing(name, prefix, default)
    if not isinstance(value, bool):
        raise DecodeError(f"the {prefix}{name} field must be true or false")
    return value


def field_doc(doc: Mapping[str, Any], name: str, *, prefix: str = "") -> Mapping[str, Any]:
    """A required sub-document."""
    value = doc.get(name)  # BSON null counts as absent
    if value is None:
        return _missing(name, prefix, REQUIRED)
    if not isinstance(value, Mapping):
        raise DecodeError(f"the {prefix}{name} field must be a document")
    return value


def field_list(
    doc: Mapping[str, Any],
    name: str,
    *,
    max_items: int = limits.message_list_items_max,
    default: list[Any] | Required = REQUIRED,
    prefix: str = "",
) -> list[Any]:
    value = doc.get(name)  # BSON null counts as absent
    if value is None:
        return _missing(name, prefix, default)
    if not isinstance(value, list):
        raise DecodeError(f"the {prefix}{name} field must be a list")
    if len(value) > max_items:
        raise DecodeError(f"the {prefix}{name} field has more than {max_items} items")
    return value


def field_docs(
    doc: Mapping[str, Any],
    name: str,
    item: Callable[[Mapping[str, Any], str], T],
    *,
    max_items: int = limits.message_list_items_max,
    prefix: str = "",
) -> tuple[T, ...]:
    """A required list of sub-documents, each decoded by `item(sub, its prefix)`."""
    found = []
    for index, entry in enumerate(field_list(doc, name, max_items=max_items, prefix=prefix)):
        where = f"{prefix}{name}[{index}]"
        if not isinstance(entry, Mapping):
            raise DecodeError(f"the {where} field must be a document")
        found.append(item(entry, f"{where}."))
    return tuple(found)


def field_strs(
    doc: Mapping[str, Any],
    name: str,
    *,
    max_items: int = limits.message_list_items_max,
    max_chars: int = limits.message_str_chars_max,
    empty_ok: bool = False,
    prefix: str = "",
) -> tuple[str, ...]:
    """A required list of strings."""
    values = field_list(doc, name, max_items=max_items, prefix=prefix)
    as_doc = {f"[{i}]": value for i, value in enumerate(values)}
    where = f"{prefix}{name}"
    return tuple(
        field_str(as_doc, f"[{i}]", max_chars=max_chars, empty_ok=empty_ok, prefix=where)
        for i in range(len(values))
    )


def ok(comment: str = "SUCCESS", **fields: Any) -> Document:
    return {"RESULT": int(Result.OK), "COMMENT": comment, **fields}


def fail(reason: Reason, comment: str, **fields: Any) -> Document:
    return {"RESULT": int(Result.FAIL), "COMMENT": comment, "ERROR": str(reason), **fields}


def lead_lost(leader: str = "") -> Document:
    return {"RESULT": int(Result.LEAD_LOST), "COMMENT": "not the leader", "LEADER": leader}


@dataclass(frozen=True)
class Reply:
    """The envelope of every reply: `RESULT`, `COMMENT`, and `ERROR` (FAIL) or `LEADER`
    (LEAD_LOST). A command's own reply fields are read by its schema's `decode`."""

    result: int
    comment: str = ""
    error: str = ""  # a `Reason` on FAIL
    leader: str = ""  # the leader's admin endpoint on LEAD_LOST ("" if none is known)

    @property
    def ok(self) -> bool:
        return self.result == Result.OK

    def encode(self) -> Document:
        doc: Document = {"RESULT": self.result, "COMMENT": self.comment}
        if self.result == Result.FAIL:
            doc["ERROR"] = self.error
        elif self.result == Result.LEAD_LOST:
            doc["LEADER"] = self.leader
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        result = field_int(doc, "RESULT", lo=-(2**31), hi=2**31 - 1)
        comment = field_str(doc, "COMMENT", empty_ok=True, max_chars=limits.reply_comment_chars_max)
        if result == Result.FAIL:
            return cls(result, comment, error=field_str(doc, "ERROR", max_chars=64))
        if result == Result.LEAD_LOST:
            return cls(result, comment, leader=field_endpoint(doc, "LEADER", empty_ok=True))
        return cls(result, comment)
