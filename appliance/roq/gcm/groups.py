"""Admin commands 2020–2022 (consumer groups): the GCM passes them on to the queue's monitor,
which holds the groups (monitor/groups.py), and returns its answer. The GCM keeps no group
state of its own: it only knows where each queue's monitor is."""

from __future__ import annotations

from typing import Any

from roq import limits
from roq.client.locate import MonitorAddress
from roq.errors import RoqError
from roq.protocol import bsonmsg
from roq.protocol.bsonmsg import Document
from roq.protocol.commands import AdminCommand, Reason
from roq.protocol.messages.groups import GroupDelete, GroupInfo
from roq.protocol.ports import MonitorPort
from roq.transport.rpc import Requester


def forward(context: Any, monitor: str, request: Document) -> Document:
    """Ask the monitor at `monitor` (its base endpoint, from the queue's record)."""
    if request["CMD"] == AdminCommand.DELETE_GROUP:
        ask: GroupInfo | GroupDelete = GroupDelete(GroupDelete.decode(request).group)
    else:
        info = GroupInfo.decode(request)
        if request["CMD"] == AdminCommand.GET_GROUP and not info.group:
            return bsonmsg.fail(Reason.BAD_REQUEST, "2021 needs a Group")
        ask = GroupInfo(info.group)
    requester = Requester(
        context, MonitorAddress(monitor).at(MonitorPort.PLACEMENT), limits.request_timeout_ms
    )
    try:
        return requester.request(ask.encode())
    except RoqError as error:
        return bsonmsg.fail(Reason.BUSY, f"the queue's monitor did not answer: {error}")
    finally:
        requester.close()
