"""Who may make which admin request (docs/security.md §5): the admin API's authorizer.

Reading the cluster's shape (status, lists, rules, whether a queue exists) is open to every
principal; finding a queue's monitor (2000) needs publish, subscribe or admin on it, since
publishers and subscribers ask it; everything that changes the cluster needs admin on the queue
it names (on every queue, "", when it names none)."""

from __future__ import annotations

from typing import Any

from roq.protocol import bsonmsg
from roq.protocol.commands import AdminCommand, Reason
from roq.protocol.principals import Permission, Principal, refusal

_READ_ONLY = {
    AdminCommand.INIT_REQ,
    AdminCommand.LIST_QUEUES,
    AdminCommand.GET_STATUS,
    AdminCommand.QUEUE_EXISTS,
    AdminCommand.GET_AUTOSCALING_RULE,
    AdminCommand.GET_CLOUD_PROPERTIES,
}
_LOCATE = (Permission.ADMIN, Permission.PUBLISH, Permission.SUBSCRIBE, Permission.CONSUME)


def authorize(principal: Principal | None, request: dict[str, Any]) -> dict[str, Any] | None:
    command = request.get("CMD")
    queue = request.get("QName")
    queue = queue if isinstance(queue, str) else ""
    if command in _READ_ONLY and principal is not None:
        return None
    needs = _LOCATE if command == AdminCommand.GET_HOST_BY_QNAME else (Permission.ADMIN,)
    why = refusal(principal, needs, queue)
    return None if why is None else bsonmsg.fail(Reason.FORBIDDEN, why)
