"""Admin commands 2020–2023 (consumer groups): the GCM passes them on to the queue's monitor,
which holds the groups (monitor/groups.py), and returns its answer. The GCM keeps no group
state of its own: it only knows where each queue's monitor is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from roq import limits
from roq.client.locate import MonitorAddress
from roq.errors import RoqError
from roq.protocol.bsonmsg import Document
from roq.protocol.commands import Reason
from roq.protocol.dispatch import Encodable, Refused
from roq.protocol.messages.deadletters import DeadLetters
from roq.protocol.messages.groups import GroupDelete, GroupInfo
from roq.protocol.ports import MonitorPort
from roq.transport.rpc import Requester


@dataclass(frozen=True)
class Relayed:
    """The monitor's reply, passed on as it came (the GCM reads none of its fields)."""

    reply: Document

    def encode(self) -> Document:
        return self.reply


def forward(context: Any, monitor: str, ask: GroupInfo | GroupDelete | DeadLetters) -> Encodable:
    """Ask the monitor at `monitor` (its base endpoint, from the queue's record) the monitor's
    form of the request (25 or 26, without `QName`)."""
    requester = Requester(
        context, MonitorAddress(monitor).at(MonitorPort.PLACEMENT), limits.request_timeout_ms
    )
    try:
        return Relayed(requester.request(ask.encode()))
    except RoqError as error:
        return Refused(Reason.BUSY, f"the queue's monitor did not answer: {error}")
    finally:
        requester.close()
