"""Who may make which admin request (docs/security.md §5): the admin API's authorizer.

Reading the cluster's shape (status, lists, rules, whether a queue exists) is open to every
principal; finding a queue's monitor (2000) needs publish, subscribe, consume or admin on it,
since publishers, subscribers and consumers ask it (the one the asker names in `Need`, or
admin, when it names one: a refusal then names it); everything that changes the cluster needs
admin on the queue it names (on every queue, "", when it names none).

A principal creates queues up to its quota (`queues.per.principal`, issue 31, finding 7): the
queues under its admin grants are counted, those it made and any another made there, so a
tenant granted admin on `teamA.` holds at most that many `teamA.*` queues; a principal holding
admin on every queue (the operator) has none."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from roq.protocol import bsonmsg
from roq.protocol.commands import AdminCommand, Reason
from roq.protocol.messages.admin import PERMISSION_NAMES
from roq.protocol.principals import Permission, Principal, missing_all, refusal

_READ_ONLY = {
    AdminCommand.INIT_REQ,
    AdminCommand.LIST_QUEUES,
    AdminCommand.GET_STATUS,
    AdminCommand.QUEUE_EXISTS,
    AdminCommand.GET_AUTOSCALING_RULE,
    AdminCommand.GET_CLOUD_PROPERTIES,
}
_LOCATE = (Permission.PUBLISH, Permission.SUBSCRIBE, Permission.CONSUME, Permission.ADMIN)


_CREATE = {AdminCommand.CREATE_QUEUE, AdminCommand.CREATE_QUEUE_AUTOMATICALLY}


@dataclass(frozen=True)
class Quota:
    """How many queues one principal may administer, and the cluster's queues (read only for a
    creation by a principal held to it)."""

    most: int
    queues: Callable[[], list[str]]


def authorize(
    principal: Principal | None, request: dict[str, Any], quota: Quota | None = None
) -> dict[str, Any] | None:
    command = request.get("CMD")
    queue = request.get("QName")
    queue = queue if bsonmsg.is_text(queue) else ""
    if command in _READ_ONLY and principal is not None:
        return None
    needs = _locating(request) if command == AdminCommand.GET_HOST_BY_QNAME else (Permission.ADMIN,)
    why = refusal(principal, needs, queue)
    if why is not None and principal is not None and needs is _LOCATE:
        why = missing_all(principal.name, needs, queue)  # the asker did not say what for
    if why is None and command in _CREATE and principal is not None and quota is not None:
        why = _over_quota(principal, quota)
    if why is not None and command == AdminCommand.GROUP_DEAD_LETTERS:
        why = f"{why} (needed to redrive or purge dead letters of group {request.get('Group')!r})"
    return None if why is None else bsonmsg.fail(Reason.FORBIDDEN, why)


def _over_quota(principal: Principal, quota: Quota) -> str | None:
    if principal.allows(Permission.ADMIN, ""):  # on every queue: the operator
        return None
    held = sum(1 for name in quota.queues() if principal.allows(Permission.ADMIN, name))
    if held < quota.most:
        return None
    return (f"principal {principal.name} administers {held} queues: its quota "
            f"(queues.per.principal = {quota.most})")  # fmt: skip


def _locating(request: dict[str, Any]) -> tuple[Permission, ...]:
    """What finding a monitor needs: the permission the asker said it wants it for (`Need`; a
    refusal then names that one, not `admin`) or admin; without `Need`, any of the four. A
    `Need` that is no permission is the decoder's bad_request, so it counts as absent here."""
    need = request.get("Need")
    if bsonmsg.is_text(need) and need in PERMISSION_NAMES:
        return (Permission(need), Permission.ADMIN)
    return _LOCATE
