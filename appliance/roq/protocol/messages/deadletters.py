"""Redrive and purge of a group's dead letters (`roq group dlq redrive|purge`): admin 2023 on the
GCM, passed on as 27 to the queue's monitor, which keeps the group's delivery state
(monitor/deadletters.py). docs/protocol.md, "Consumer groups".

A letter is named by its id on the dead-letter queue, `<publisher id hex>:<key digest>:<seq>` of
its record there (unique per letter), and carries where its message is in the source queue:
`Exchange`, the batch's `Offset` and the message's `Record` (its position in the batch), as the
consumer wrote them into the letter (client/consumer.py `_publish_dead`).
"""

from __future__ import annotations

import enum
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from roq import limits
from roq.errors import DecodeError
from roq.protocol import bsonmsg
from roq.protocol.bsonmsg import Document, field_docs, field_int, field_str, field_strs
from roq.protocol.commands import AdminCommand, MonitorCommand
from roq.protocol.messages.groups import check_group_name
from roq.protocol.names import check_queue_name

_ID_CHARS = limits.work_dlq_letter_id_chars_max
_STEP = limits.work_dlq_step_max


class Action(enum.StrEnum):
    REDRIVE = "redrive"  # deliver the letters to the group again, and remove them
    PURGE = "purge"  # remove them
    CHECK = "check"  # which of them are removed already (changes nothing)


def letter_id(producer_id: bytes, key: bytes, seq: int) -> str:
    """A letter's id: its record's stream on the dead-letter queue (publisher and routing key:
    sequence numbers are per stream, the key as a 64-bit digest) and sequence number."""
    digest = hashlib.blake2b(key, digest_size=8).hexdigest()
    return f"{producer_id.hex()}:{digest}:{seq}"


@dataclass(frozen=True)
class Letter:
    id: str
    exchange: str = ""  # where its message is in the source queue (redrive only)
    offset: int = 0
    record: int = 0

    def encode(self) -> Document:
        return {"Id": self.id, "Exchange": self.exchange, "Offset": self.offset,
                "Record": self.record}  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any], prefix: str = "") -> Self:
        return cls(
            field_str(doc, "Id", max_chars=_ID_CHARS, prefix=prefix),
            field_str(doc, "Exchange", empty_ok=True, default="", prefix=prefix,
                      max_chars=limits.producer_id_chars_max * 4),
            field_int(doc, "Offset", default=0, prefix=prefix),
            field_int(doc, "Record", default=0, hi=limits.work_slot_messages_max - 1,
                      prefix=prefix),
        )  # fmt: skip


@dataclass(frozen=True)
class DeadLetters:
    """27 (monitor) or 2023 (admin, with `QName`): one step of a redrive or purge, at most
    `limits.work_dlq_step_max` letters, or a check of which are removed."""

    group: str
    action: Action
    letters: tuple[Letter, ...]
    queue: str = ""  # QName, admin only

    def encode(self) -> Document:
        doc: Document = {"CMD": int(MonitorCommand.GROUP_DEAD_LETTERS), "Group": self.group,
                         "Action": str(self.action),
                         "Letters": [x.encode() for x in self.letters]}  # fmt: skip
        if self.queue:
            doc.update(CMD=int(AdminCommand.GROUP_DEAD_LETTERS), QName=self.queue)
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        queue = field_str(doc, "QName", default="")
        return cls(_group(doc), _action(doc), field_docs(doc, "Letters", Letter.decode,
                   max_items=_STEP), check_queue_name(queue) if queue else "")  # fmt: skip

    @classmethod
    def decode_admin(cls, doc: Mapping[str, Any]) -> Self:
        """2023 on the GCM's admin API, where `QName` is required."""
        check_queue_name(field_str(doc, "QName"))
        return cls.decode(doc)


def _group(doc: Mapping[str, Any]) -> str:
    return check_group_name(field_str(doc, "Group", max_chars=limits.work_group_name_chars_max))


def _action(doc: Mapping[str, Any]) -> Action:
    text = field_str(doc, "Action", max_chars=16)
    try:
        return Action(text)
    except ValueError:
        raise DecodeError(f"the Action field must be one of {[str(a) for a in Action]}, "
                          f"not {text!r}") from None  # fmt: skip


@dataclass(frozen=True)
class DeadLettersDone:
    """The reply to 27 and 2023, once the step is stored (one commit). `Done`: redriven or
    purged now; `Already`: removed before (a step run again); `Merged`: a second letter of a
    message with a redrive pending (dead-lettered twice): removed, delivered once; `Removed`:
    for a check, the ids of those removed already."""

    done: int = 0
    already: int = 0
    merged: int = 0
    removed: tuple[str, ...] = ()

    def encode(self) -> Document:
        return bsonmsg.ok(Done=self.done, Already=self.already, Merged=self.merged,
                          Removed=list(self.removed))  # fmt: skip

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        return cls(field_int(doc, "Done", hi=_STEP), field_int(doc, "Already", hi=_STEP),
                   field_int(doc, "Merged", hi=_STEP),
                   field_strs(doc, "Removed", max_items=_STEP, max_chars=_ID_CHARS))  # fmt: skip
