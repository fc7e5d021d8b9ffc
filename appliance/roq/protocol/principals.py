"""Principals and their permissions (docs/security.md §5): pure data, no sockets, no ZooKeeper.

A principal is a name and a CURVE public key with grants: each grant gives permissions on every
queue whose name starts with its prefix ("" is every queue), or, when its prefix starts with
`topic:`, on every HTTP gateway topic whose name starts with the rest ("topic:" is every topic).
The two never overlap: a queue grant reaches no topic, a topic grant no queue (issue 31,
finding 4). Deny by default: what no grant gives is refused. The cluster's own processes hold
the cluster key, whose principal (`cluster`) may do everything; it is never stored, so it cannot
be revoked by mistake.

The gateway's own queues (`<http.queue.prefix>-N`, `http-0`…: every topic's messages) are the
cluster's: no grant gives publish, subscribe or consume on them, only `admin` (stop, start,
delete them); `reserve_gateway_queues` names their prefix at a daemon's start.

A principal may also hold HTTP bearer tokens (the gateway's callers, docs/http.md): only the
SHA-256 of each is stored, so the table, ZooKeeper and a host's principals file never hold a
token itself; `roq keys token` prints a new one once.

In ZooKeeper (coordination/principals.py) and in a host's principals file each principal is the
JSON object `{"name", "key", "grants": {prefix: [permission, ...]}, "tokens": [sha256 hex, ...]}`
("tokens" only when it has some) and `"format": 2`. A record without `format` was written before
topic grants existed, when a grant covered queues and topics alike: `decode` reads each of its
grants as both a queue grant and a topic grant (what it allowed before, but the gateway's
queues), and the next change of the record writes both out. `decode` refuses anything else with
a ValueError that names what is wrong, so bad input never reaches a decision.
"""

from __future__ import annotations

import dataclasses
import enum
import hashlib
import re
import secrets
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from roq import limits

NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")
NAME_CHARS_MAX = 64
Z85_KEY_CHARS = 40
CLUSTER = "cluster"
# says what a leaked secret is (secret scanners key on such prefixes); no secret itself
TOKEN_PREFIX = "roq_"  # noqa: S105
DIGEST = re.compile(r"^[0-9a-f]{64}$")  # SHA-256, lowercase hex
TOPIC = "topic:"  # a grant prefix that starts so is on HTTP topics, not queues (6 characters)
FORMAT = 2  # a record's format since topic grants; none: the format before (decode)
_gateway_queues = re.compile(r"^http-[0-9]+$")  # http.queue.prefix's default


def reserve_gateway_queues(prefix: str) -> None:
    """The HTTP gateway's queues are `<prefix>-N` (`http.queue.prefix`): the cluster's alone."""
    global _gateway_queues  # noqa: PLW0603 - one rule per process, set once at its start
    _gateway_queues = re.compile(rf"^{re.escape(prefix)}-[0-9]+$")


def gateway_queue(queue: str) -> bool:
    return bool(_gateway_queues.match(queue))


def is_topic_grant(prefix: str) -> bool:
    return prefix.startswith(TOPIC)


def grant_prefix(text: str) -> str:
    """A prefix as `roq keys` takes it: `*` is every queue (""), `topic:*` every topic."""
    return {"*": "", f"{TOPIC}*": TOPIC}.get(text, text)


class Permission(enum.StrEnum):
    PUBLISH = "publish"
    SUBSCRIBE = "subscribe"
    CONSUME = "consume"  # work queues
    ADMIN = "admin"


ALL = frozenset(Permission)


@dataclass(frozen=True)
class Principal:
    name: str
    key: str  # Z85 CURVE public key
    grants: Mapping[str, frozenset[Permission]] = field(default_factory=dict)
    superuser: bool = False  # the cluster's own processes
    tokens: tuple[str, ...] = ()  # SHA-256 hex digests of its HTTP bearer tokens, oldest first

    def allows(self, permission: Permission, queue: str) -> bool:
        """On a queue: by its queue grants; on the gateway's queues, admin at most."""
        if self.superuser:
            return True
        if permission != Permission.ADMIN and gateway_queue(queue):
            return False
        return any(
            permission in perms and not is_topic_grant(prefix) and queue.startswith(prefix)
            for prefix, perms in self.grants.items()
        )

    def allows_topic(self, permission: Permission, topic: str) -> bool:
        """On an HTTP gateway topic: by its `topic:` grants alone."""
        if self.superuser:
            return True
        return any(
            permission in perms and is_topic_grant(prefix) and topic.startswith(prefix[6:])
            for prefix, perms in self.grants.items()
        )

    def queue_grants(self) -> dict[str, frozenset[Permission]]:
        return {prefix: p for prefix, p in self.grants.items() if not is_topic_grant(prefix)}

    def encode(self) -> dict[str, Any]:
        grants = {prefix: sorted(p.value for p in perms) for prefix, perms in self.grants.items()}
        doc: dict[str, Any] = {"name": self.name, "key": self.key, "grants": grants}
        doc["format"] = FORMAT
        if self.tokens:
            doc["tokens"] = list(self.tokens)
        return doc

    def granted(self, prefix: str, permissions: Iterable[Permission]) -> Principal:
        """This principal with `permissions` added on `prefix`."""
        grants = dict(self.grants)
        grants[prefix] = grants.get(prefix, frozenset()) | frozenset(permissions)
        return dataclasses.replace(self, grants=grants)

    def revoked(self, prefix: str, permissions: Iterable[Permission]) -> Principal:
        """This principal with `permissions` taken away on `prefix` (an emptied grant goes)."""
        grants = dict(self.grants)
        left = grants.get(prefix, frozenset()) - frozenset(permissions)
        if left:
            grants[prefix] = left
        else:
            grants.pop(prefix, None)
        return dataclasses.replace(self, grants=grants)

    def with_token(self, digest: str) -> Principal:
        """This principal holding one more token (its digest); ValueError past the bound."""
        if len(self.tokens) >= limits.principal_tokens_max:
            raise ValueError(
                f"principal {self.name} holds {limits.principal_tokens_max} tokens already: "
                "drop them first (roq keys token NAME --revoke-all)"
            )
        return dataclasses.replace(self, tokens=(*self.tokens, check_digest(digest)))

    def without_tokens(self) -> Principal:
        return dataclasses.replace(self, tokens=())


def new_token() -> str:
    """A new bearer token: 256 random bits, URL-safe, with roq's prefix."""
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_digest(token: str) -> str:
    """What is stored of a token, and what a presented token is looked up by."""
    return hashlib.sha256(token.encode("utf-8", "surrogatepass")).hexdigest()


def check_digest(digest: Any) -> str:
    if not isinstance(digest, str) or not DIGEST.match(digest):
        raise ValueError(f"token digest {str(digest)[:80]!r} is not 64 lowercase hex digits")
    return digest


def missing(principal: str, permission: Permission, queue: str) -> str:
    """The refusal every enforcement point gives: it names what is missing."""
    return f"principal {principal} lacks permission '{permission}' on queue '{queue}'"


def missing_topic(principal: str, permission: Permission, topic: str) -> str:
    """The gateway's refusal: the grant it needs is `topic:<prefix>`."""
    return f"principal {principal} lacks permission '{permission}' on topic '{topic}'"


def reserved(queue: str) -> str:
    return (
        f"queue '{queue}' is the HTTP gateway's: only the cluster's own processes publish to, "
        "subscribe to or consume it (its topics are granted as topic:<prefix>)"
    )


def missing_all(principal: str, permissions: Iterable[Permission], queue: str) -> str:
    """The refusal of a request any of `permissions` allows, when the asker did not say which
    it wants (an older client's 2000): every one of them is missing."""
    names = [f"'{p}'" for p in permissions]
    listed = f"{', '.join(names[:-1])} or {names[-1]}" if len(names) > 1 else names[0]
    return f"principal {principal} lacks permission {listed} on queue '{queue}'"


def check_name(name: str) -> str:
    if not isinstance(name, str) or not NAME.match(name) or name == CLUSTER:
        raise ValueError(
            f"principal name {name!r}: 1 to 64 letters, digits, '.', '_' or '-' "
            f"(not '{CLUSTER}', the cluster's own)"
        )
    return name


def parse_permissions(names: Iterable[str]) -> frozenset[Permission]:
    found = set()
    for name in names:
        try:
            found.add(Permission(name))
        except ValueError:
            allowed = ", ".join(p.value for p in Permission)
            raise ValueError(f"unknown permission {name!r} (one of {allowed})") from None
    return frozenset(found)


def decode(doc: Any) -> Principal:
    """A principal from its JSON object; ValueError naming the fault."""
    if not isinstance(doc, dict):
        raise ValueError("a principal is a JSON object")
    name = check_name(doc.get("name"))  # type: ignore[arg-type]
    key = doc.get("key")
    if not isinstance(key, str) or len(key) != Z85_KEY_CHARS:
        raise ValueError(f"principal {name}: 'key' is not a 40-character Z85 key")
    grants = doc.get("grants", {})
    most = 2 * limits.principal_grants_max  # as many on topics as on queues
    if not isinstance(grants, dict) or len(grants) > most:
        raise ValueError(f"principal {name}: 'grants' is not a map of at most {most} prefixes")
    parsed: dict[str, frozenset[Permission]] = {}
    for prefix, perms in grants.items():
        longest = limits.queue_name_chars_max + (len(TOPIC) if is_topic_grant(prefix) else 0)
        if len(prefix) > longest or not isinstance(perms, list):
            raise ValueError(f"principal {name}: grant {prefix!r} is not prefix: [permissions]")
        parsed[prefix] = parse_permissions(perms)
    if doc.get("format") is None:
        parsed = _with_topic_grants(parsed)
    elif doc["format"] != FORMAT:
        raise ValueError(f"principal {name}: unknown record format {doc['format']!r}")
    return Principal(name, key, parsed, tokens=decode_tokens(name, doc.get("tokens", [])))


Grants = dict[str, frozenset[Permission]]


def _with_topic_grants(grants: Grants) -> Grants:
    """A record from before topic grants: each grant covered queues and topics alike, and
    still does, as a queue grant and the same `topic:` grant."""
    both = dict(grants)
    for prefix, perms in grants.items():
        if not is_topic_grant(prefix):
            both[TOPIC + prefix] = both.get(TOPIC + prefix, frozenset()) | perms
    return both


def decode_tokens(name: str, tokens: Any) -> tuple[str, ...]:
    """The `tokens` of principal `name`: a list of digests (a record written before tokens
    existed has none: decode passes an empty list); ValueError naming the fault."""
    if not isinstance(tokens, list) or len(tokens) > limits.principal_tokens_max:
        raise ValueError(f"principal {name}: 'tokens' is not a list of at most "
                         f"{limits.principal_tokens_max} digests")  # fmt: skip
    try:
        return tuple(check_digest(digest) for digest in tokens)
    except ValueError as error:
        raise ValueError(f"principal {name}: {error}") from None


def refusal(principal: Principal | None, needs: Iterable[Permission], queue: str) -> str | None:
    """None when `principal` holds one of `needs` on `queue`; else why not, naming the first:
    callers put the permission the request is for first (admin, which also allows, last)."""
    wanted = list(needs)
    if principal is None:
        return "this principal's key is no longer known to the cluster (revoked)"
    if any(principal.allows(permission, queue) for permission in wanted):
        return None
    if wanted[0] != Permission.ADMIN and gateway_queue(queue):
        return reserved(queue)
    return missing(principal.name, wanted[0], queue)


def topic_refusal(principal: Principal, permission: Permission, topic: str) -> str | None:
    """None when `principal` holds `permission` on HTTP topic `topic`; else why not."""
    if principal.allows_topic(permission, topic):
        return None
    return missing_topic(principal.name, permission, topic)
