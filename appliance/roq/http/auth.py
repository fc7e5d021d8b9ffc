"""Who calls the gateway, and what they may do (docs/http.md §Authentication, docs/security.md §5).

Every call carries `Authorization: Bearer <token>`. A token belongs to a principal of the
cluster's table, which keeps only its SHA-256 (`roq keys token NAME` prints a new one once).
This process follows the table in ZooKeeper (one data watch, as a GCM does) and keeps
digest -> principal, swapped whole at every change, so a revoked principal or token is refused
at its first request after the watch fired. The gateway never seeds the table: only a GCM or
host does, on a cluster's first start.

The resource is the topic, granted in a namespace of its own: a grant on `topic:news` covers
the topics `news…` and no queue, a queue grant no topic (the roq queues that carry the topics
are the cluster's, written with its key; no grant reaches them over ZeroMQ). Registering and
publishing need `publish`; subscribing, getting and acking need `subscribe`; `/metrics` any
valid token.

Owners and subscribers are the caller's (issue 31, finding 3): the monitor of a topic records
the principal that registered it, or subscribed a subscriber, and refuses another principal
that names them (403), unless that one holds `admin` on the topic (`names`).

With security off nothing is asked: every caller acts as the cluster, as on every other port.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from roq import limits
from roq.coordination.principals import PrincipalStore
from roq.protocol import principals
from roq.protocol.messages.topics import NOBODY, Caller
from roq.protocol.principals import Permission, Principal

log = logging.getLogger(__name__)

CHALLENGE = 'Bearer realm="roq"'  # RFC 6750 §3: what a 401 asks for
UNSECURED = Principal(principals.CLUSTER, "", superuser=True)


class Refused(Exception):
    """401 (no valid token) or 403 (a principal without the permission): `reason` says why,
    `challenge` is the WWW-Authenticate header's value."""

    def __init__(self, status: int, reason: str, error: str = ""):
        super().__init__(reason)
        self.status, self.reason = status, reason
        self.challenge = f'{CHALLENGE}, error="{error}"' if error else CHALLENGE


class Access:
    def __init__(self, secured: bool):
        self.secured = secured
        # replaced whole by kazoo's watch thread (`replace`), read by the request threads: one
        # reference, never changed in place
        self._by_digest: Mapping[str, Principal] = {}

    def follow(self, zk: Any, namespace: str) -> None:
        """Load the principal table now (kazoo's watch calls at once) and at every change."""
        if not self.secured:
            log.warning(
                "http: SECURITY IS OFF: no bearer token is asked; anyone who reaches http.port "
                "can register, publish and read every topic"
            )
            return
        PrincipalStore(zk, namespace).watch(self.replace)

    def replace(self, table: list[Principal]) -> None:
        self._by_digest = {digest: p for p in table for digest in p.tokens}
        log.info("http: %d principals hold %d tokens", len(table), len(self._by_digest))

    def caller(self, authorization: str | None) -> Principal:
        """The principal whose token the Authorization header carries; Refused (401) if none."""
        if not self.secured:
            return UNSECURED
        if authorization is None:
            raise Refused(401, "this call needs a bearer token: Authorization: Bearer <token>")
        scheme, _, token = authorization.strip().partition(" ")
        token = token.strip()
        if (
            scheme.lower() != "bearer"
            or not token
            or len(authorization) > limits.http_authorization_chars_max
        ):
            raise Refused(
                401, "the Authorization header is not 'Bearer <token>'", "invalid_request"
            )
        # a dictionary lookup of the token's SHA-256: what an attacker could time is the hash of
        # a guess, which tells nothing about a stored token, so no constant-time compare is needed
        principal = self._by_digest.get(principals.token_digest(token))
        if principal is None:
            raise Refused(401, "this token is not known to the cluster (revoked?)", "invalid_token")
        return principal

    @staticmethod
    def check_any(principal: Principal, permission: Permission) -> None:
        """Refused (403) unless `principal` holds `permission` on some topic: checked before the
        body (which names the topic) is read, so a token without the grant costs no body."""
        if principal.superuser or any(
            permission in held and principals.is_topic_grant(prefix)
            for prefix, held in principal.grants.items()
        ):
            return
        why = f"principal {principal.name} lacks permission '{permission}' on every topic"
        raise Refused(403, why, "insufficient_scope")

    @staticmethod
    def names(principal: Principal, topic: str) -> Caller:
        """Whose owners and subscribers a call's names are: its principal's own; any
        principal's for one holding admin on the topic; nobody's with security off."""
        if principal.superuser:
            return NOBODY
        return Caller(principal.name, principal.allows_topic(Permission.ADMIN, topic))

    @staticmethod
    def unbounded(principal: Principal) -> bool:
        """Held to no per-principal quota: the cluster (security off), and a principal holding
        admin on every topic (`topic:*`, the cluster's operator: the admin of admin.json)."""
        every = principal.grants.get(principals.TOPIC, frozenset())
        return principal.superuser or Permission.ADMIN in every

    @staticmethod
    def check(principal: Principal, permission: Permission, topic: str) -> None:
        """Refused (403) naming the missing permission unless `principal` holds it on `topic`."""
        why = principals.topic_refusal(principal, permission, topic)
        if why is not None:
            raise Refused(403, why, "insufficient_scope")
