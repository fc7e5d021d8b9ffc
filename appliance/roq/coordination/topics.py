"""The HTTP gateway's durable state in ZooKeeper: its topics and its subscribers' positions.

    <ns>/http/topics/t<topic>                 {"topic", "owner", "head"[, "principal"]}
    <ns>/http/topics/t<topic>/s<subscriber>   {"next"[, "principal"]}

Names are percent-encoded (any character of a topic or subscriber name is allowed, and a znode
name may hold no "/") behind a one-letter prefix (so "." and ".." are names like any other):
coordination/paths.py builds both paths.
`head` is the index of the newest message published to the topic (message indexes are 1-based,
0: none yet); `next` is the index a subscriber gets next. Both change by compare-and-set at the
version read, so gateways sharing the ZooKeeper hand out each index once and never lose an
acknowledgement. The messages themselves are in roq's logs (roq/http/).

A topic's subscriber count is its znode's `numChildren` and the topic count is the root's: no
counter to keep right. Two gateways registering at the same instant may pass `maxTopics` by
the number of registrations in flight (ZooKeeper has no conditional create).

`principal` is whose owner or subscriber the record is (issue 31, finding 3), as the monitors'
store keeps it (monitor/topics.py): another principal's request is TopicForbidden (403) unless
it may act on any (`Caller.override`); a record without one is claimed by its first user.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any
from urllib.parse import unquote

from kazoo.exceptions import BadVersionError, KazooException, NodeExistsError, NoNodeError

from roq import limits
from roq.coordination.paths import Paths
from roq.errors import CoordinationError, TopicForbidden, TopicRefused
from roq.protocol.messages.topics import NOBODY, Caller, quota_refusal

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Topic:
    name: str
    owner: str
    head: int  # the newest message's index; 0: none yet
    subscribers: int
    version: int
    principal: str = ""  # whose owner it is ("": nobody's yet)


class TopicStore:
    """Blocking: the gateway calls it from its worker threads, never from its event loop."""

    def __init__(self, client: Any, paths: Paths):
        self.client = client
        self.paths = paths
        self.root = paths.http_topics

    def ensure_root(self) -> None:
        with _translated("create the topics root"):
            self.client.ensure_path(self.root)

    def _topic_path(self, topic: str) -> str:
        return self.paths.http_topic(topic)

    def _subscriber_path(self, topic: str, subscriber: str) -> str:
        return self.paths.http_subscriber(topic, subscriber)

    def count(self) -> int:
        with _translated("count topics"):
            stat = self.client.exists(self.root)
        return int(stat.numChildren) if stat is not None else 0

    def register(
        self, topic: str, owner: str, max_topics: int, caller: Caller = NOBODY, quota: int = 0
    ) -> None:
        """Register the topic as the caller's; `quota`: the most its principal may hold (0: no
        bound), counted in `<ns>/http/principals/<name>` (checked before, counted after: two
        registrations at once may pass it by one, as maxTopics)."""
        if self.count() >= max_topics:
            raise TopicRefused(f"too many topics: the limit is {max_topics}")
        principal = caller.principal
        if quota and principal and self._held_by(principal)[0] >= quota:
            raise TopicForbidden(quota_refusal(principal, quota))
        record = _held({"topic": topic, "owner": owner, "head": 0}, principal)
        data = json.dumps(record).encode()
        try:
            with _translated(f"register topic {topic!r}"):
                self.client.create(self._topic_path(topic), data)
        except NodeExistsError:
            raise TopicRefused(f"topic {topic!r} is taken") from None
        if principal:
            self._count_for(principal)

    def _held_by(self, principal: str) -> tuple[int, int]:
        """(the topics `principal` registered, its counter's version; -1: none yet)."""
        try:
            with _translated(f"read the topic count of principal {principal}"):
                data, stat = self.client.get(self.paths.http_principal(principal))
        except NoNodeError:
            return 0, -1
        return int(json.loads(data.decode())["topics"]), stat.version

    def _count_for(self, principal: str) -> None:
        path = self.paths.http_principal(principal)
        for _ in range(limits.http_cas_attempts_max):
            held, version = self._held_by(principal)
            data = json.dumps({"topics": held + 1}).encode()
            try:
                with _translated(f"count a topic of principal {principal}"):
                    if version < 0:
                        self.client.create(path, data, makepath=True)
                    else:
                        self.client.set(path, data, version)
                return
            except (NodeExistsError, BadVersionError):
                continue  # another registration counted meanwhile
        raise CoordinationError(f"principal {principal}: topic count: writers raced")

    def get(self, topic: str) -> Topic:
        """The topic, or TopicRefused if it is not registered."""
        try:
            with _translated(f"read topic {topic!r}"):
                data, stat = self.client.get(self._topic_path(topic))
        except NoNodeError:
            raise TopicRefused(f"unknown topic {topic!r}") from None
        doc = json.loads(data.decode())
        owner, head, principal = str(doc["owner"]), int(doc["head"]), str(doc.get("principal", ""))
        return Topic(topic, owner, head, stat.numChildren, stat.version, principal)

    def advance_head(self, topic: str, owner: str, count: int, caller: Caller = NOBODY) -> int:
        """Take `count` indexes for the owner's messages; the first of them."""
        for _ in range(limits.http_cas_attempts_max):
            current = self.get(topic)
            if current.owner != owner:
                raise TopicRefused(f"{owner!r} is not the owner of topic {topic!r}")
            principal = _uses(caller, current.principal, f"owner {owner!r} of topic {topic!r}")
            data = _held({"topic": topic, "owner": owner, "head": current.head + count}, principal)
            try:
                with _translated(f"advance topic {topic!r}"):
                    self.client.set(
                        self._topic_path(topic), json.dumps(data).encode(), current.version
                    )
            except BadVersionError:
                continue  # another gateway took indexes meanwhile: read again
            return current.head + 1
        raise CoordinationError(f"topic {topic!r}: {limits.http_cas_attempts_max} writers raced")

    def subscribe(
        self, topic: str, subscriber: str, max_subscribers: int, caller: Caller = NOBODY
    ) -> int:
        """Start (or restart) the subscriber after the topic's head; the index it gets next."""
        current = self.get(topic)
        path = self._subscriber_path(topic, subscriber)
        following = current.head + 1
        data = json.dumps(_held({"next": following}, caller.principal)).encode()
        with _translated(f"subscribe {subscriber!r} to {topic!r}"):
            if self.client.exists(path) is not None:  # again: its principal's alone
                _, _, principal = self._follower_of(topic, subscriber, caller)
                again = json.dumps(_held({"next": following}, principal)).encode()
                self.client.set(path, again)
                return following
            if current.subscribers >= max_subscribers:
                raise TopicRefused(f"topic {topic!r} has {max_subscribers} subscribers: the limit")
            try:
                self.client.create(path, data)
            except NodeExistsError:  # subscribed through another gateway meanwhile
                self.client.set(path, data)
        return current.head + 1

    def position(
        self, topic: str, subscriber: str, caller: Caller = NOBODY
    ) -> tuple[int, int, int]:
        """(the subscriber's next index, the version of its znode, the topic's head)."""
        head = self.get(topic).head
        following, version, _ = self._follower_of(topic, subscriber, caller)
        return following, version, head

    def _follower_of(self, topic: str, subscriber: str, caller: Caller) -> tuple[int, int, str]:
        """(the subscriber's next index, its znode's version, its principal), claimed by the
        caller if it was nobody's; TopicForbidden if it is another principal's."""
        path = self._subscriber_path(topic, subscriber)
        for _ in range(limits.http_cas_attempts_max):
            try:
                with _translated(f"read subscriber {subscriber!r} of {topic!r}"):
                    data, stat = self.client.get(path)
            except NoNodeError:
                raise TopicRefused(f"{subscriber!r} is not subscribed to topic {topic!r}") from None
            doc = json.loads(data.decode())
            following, held = int(doc["next"]), str(doc.get("principal", ""))
            principal = _uses(caller, held, f"subscriber {subscriber!r} of topic {topic!r}")
            if principal == held:
                return following, stat.version, principal
            try:  # claimed now
                with _translated(f"claim subscriber {subscriber!r} of {topic!r}"):
                    claimed = json.dumps(_held({"next": following}, principal)).encode()
                    stat = self.client.set(path, claimed, stat.version)
                return following, stat.version, principal
            except BadVersionError:
                continue  # changed meanwhile: read it again
        raise CoordinationError(f"subscriber {subscriber!r} of {topic!r}: writers raced")

    def ack(self, topic: str, subscriber: str, index: int, caller: Caller = NOBODY) -> int:
        """Acknowledge message `index`, which must be the subscriber's next; the new next."""
        head = self.get(topic).head
        following, version, principal = self._follower_of(topic, subscriber, caller)
        if index != following:
            raise TopicRefused(f"message {index} is not the next of {subscriber!r} ({following})")
        if index > head:
            raise TopicRefused(f"message {index} of topic {topic!r} is not published yet")
        data = json.dumps(_held({"next": index + 1}, principal)).encode()
        try:
            with _translated(f"acknowledge for {subscriber!r} on {topic!r}"):
                self.client.set(self._subscriber_path(topic, subscriber), data, version)
        except BadVersionError:
            raise TopicRefused(f"message {index} was acknowledged concurrently") from None
        return index + 1

    # --- migration to the state log (docs/http.md, "Migration") ------------------------------
    def exported(self) -> Iterator[tuple[Topic, list[tuple[str, int, str]]]]:
        """Every topic kept here, with its subscribers' (name, next index, principal); one topic
        read at a time (a topic deleted meanwhile is skipped)."""
        with _translated("list topics"):
            names = self.client.get_children(self.root) if self.client.exists(self.root) else []
        for name in names:
            topic = unquote(name[1:])
            try:
                current = self.get(topic)
                with _translated(f"list the subscribers of {topic!r}"):
                    children = self.client.get_children(self._topic_path(topic))
                followers = [self._follower(topic, unquote(child[1:])) for child in children]
            except (TopicRefused, NoNodeError):
                continue
            yield current, followers

    def _follower(self, topic: str, subscriber: str) -> tuple[str, int, str]:
        with _translated(f"read subscriber {subscriber!r} of {topic!r}"):
            data, _ = self.client.get(self._subscriber_path(topic, subscriber))
        doc = json.loads(data.decode())
        return subscriber, int(doc["next"]), str(doc.get("principal", ""))

    def delete(self, topic: str) -> None:
        """The topic's znode and its subscribers' (once they are kept elsewhere)."""
        with _translated(f"delete topic {topic!r}"):
            self.client.delete(self._topic_path(topic), recursive=True)


def _held(record: dict[str, Any], principal: str) -> dict[str, Any]:
    """`record` with its principal, when it has one."""
    return {**record, "principal": principal} if principal else record


def _uses(caller: Caller, held: str, what: str) -> str:
    """The record's principal once `caller` used it; TopicForbidden if another's."""
    principal = caller.uses(held)
    if principal is None:
        raise TopicForbidden(f"{what} belongs to another principal")
    return principal


@contextmanager
def _translated(what: str) -> Iterator[None]:
    """Every ZooKeeper failure but the expected ones leaves as CoordinationError (HTTP 503)."""
    try:
        yield
    except (NodeExistsError, NoNodeError, BadVersionError):
        raise
    except KazooException as error:
        raise CoordinationError(f"ZooKeeper: cannot {what}: {error!r}") from None
