"""The HTTP gateway's topics as the monitors of their queues keep them (monitor/topics.py, in their
state logs): the gateway's store with `delivery.state=log`, the interface of the ZooKeeper store
it replaces (coordination/topics.py), so the gateway's calls are the same whichever keeps them.

Blocking; called from the gateway's worker threads, each with links of its own (a link is one
ZeroMQ socket, which one thread may use). A topic belongs to one queue (`queue_of`); the topic
count that `maxTopics` bounds is the sum of every queue's, read before a registration (two
gateways registering at the same instant may pass it by the registrations in flight, as
ZooKeeper's store could).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from roq import limits
from roq.client.locate import MonitorAddress
from roq.client.monitorlink import Locate, MonitorLink, MonitorRefused
from roq.errors import CoordinationError, RoqError, TopicForbidden, TopicRefused
from roq.protocol.commands import MonitorCommand, Reason
from roq.protocol.messages.topics import NOBODY, Caller, TopicAsk, TopicState, quota_refusal


class TopicClient:
    def __init__(self, queues: tuple[str, ...], queue_of: Callable[[str], str], locate: Locate):
        self.queues, self.queue_of, self._locate = queues, queue_of, locate
        self._local = threading.local()
        self._links: list[MonitorLink] = []  # every thread's, closed with the client
        self._found: dict[str, MonitorAddress] = {}  # queue → where its monitor was last found
        self._lock = threading.Lock()

    def _link(self, queue: str) -> MonitorLink:
        links: dict[str, MonitorLink] | None = getattr(self._local, "links", None)
        if links is None:
            links = self._local.links = {}
        link = links.get(queue)
        if link is None:
            with self._lock:  # where another thread's link found the monitor last
                known = self._found.get(queue)
            try:
                link = MonitorLink(queue, self._locate, limits.http_monitor_wait_s, known)
            except RoqError as error:
                raise CoordinationError(f"queue {queue}: no monitor found: {error}") from None
            links[queue] = link
            with self._lock:
                self._links.append(link)
        return link

    def _ask(self, queue: str, ask: TopicAsk) -> TopicState:
        """The monitor's answer; TopicRefused for a rule broken (400), CoordinationError when
        the monitor cannot answer (503)."""
        link = self._link(queue)
        try:
            return TopicState.decode(link.ask(ask.encode()))
        except MonitorRefused as refused:
            if refused.reason == Reason.CONFLICT:
                raise TopicRefused(refused.comment) from None
            if refused.reason == Reason.FORBIDDEN:
                raise TopicForbidden(refused.comment) from None
            raise CoordinationError(str(refused)) from None
        except CoordinationError:
            raise
        except RoqError as error:
            raise CoordinationError(str(error)) from None
        finally:
            with self._lock:
                self._found[queue] = link.monitor

    def _on(self, topic: str, command: MonitorCommand, name: str, **fields: Any) -> TopicState:
        return self._ask(self.queue_of(topic), TopicAsk(command, topic, name, **fields))

    # --- the store's interface (coordination/topics.py) --------------------------------------
    def ensure_root(self) -> None:
        """Nothing to create: a monitor's state log starts empty."""

    def count(self) -> int:
        return sum(self._count(queue) for queue in self.queues)

    def _count(self, queue: str) -> int:
        return self._ask(queue, TopicAsk(MonitorCommand.TOPIC_COUNT)).topics

    def register(
        self, topic: str, owner: str, max_topics: int, caller: Caller = NOBODY, quota: int = 0
    ) -> None:
        """Register the topic as the caller's. `quota`: the most topics its principal may hold
        in every queue together (0: no bound; `http.topics.per.principal`)."""
        home = self.queue_of(topic)
        counts = [self._counts(queue, caller) for queue in self.queues if queue != home]
        others, mine = sum(c.topics for c in counts), sum(c.mine for c in counts)
        if others >= max_topics:
            raise TopicRefused(f"too many topics: the limit is {max_topics}")
        if quota and caller.principal and mine >= quota:
            raise TopicForbidden(quota_refusal(caller.principal, quota))
        try:
            self._on(topic, MonitorCommand.TOPIC_REGISTER, owner, limit=max_topics - others,
                     caller=caller, quota=quota - mine if quota else 0)  # fmt: skip
        except TopicRefused as refused:
            if str(refused).startswith("too many topics"):
                raise TopicRefused(f"too many topics: the limit is {max_topics}") from None
            if isinstance(refused, TopicForbidden) and "its quota of topics" in str(refused):
                raise TopicForbidden(quota_refusal(caller.principal, quota)) from None
            raise

    def _counts(self, queue: str, caller: Caller) -> TopicState:
        """This queue's topics, and how many of them the caller's principal registered."""
        return self._ask(queue, TopicAsk(MonitorCommand.TOPIC_COUNT, caller=caller))

    def advance_head(self, topic: str, owner: str, count: int, caller: Caller = NOBODY) -> int:
        """Take `count` indexes for the owner's messages; the first of them."""
        return self._on(
            topic, MonitorCommand.TOPIC_PUBLISH, owner, count=count, caller=caller
        ).first

    def subscribe(
        self, topic: str, subscriber: str, max_subscribers: int, caller: Caller = NOBODY
    ) -> int:
        """Start (or restart) the subscriber after the topic's head; the index it gets next."""
        command = MonitorCommand.TOPIC_SUBSCRIBE
        return self._on(topic, command, subscriber, limit=max_subscribers, caller=caller).next

    def position(
        self, topic: str, subscriber: str, caller: Caller = NOBODY
    ) -> tuple[int, int, int]:
        """(the subscriber's next index, 0 (no version here), the topic's head)."""
        state = self._on(topic, MonitorCommand.TOPIC_POSITION, subscriber, caller=caller)
        return state.next, 0, state.head

    def ack(self, topic: str, subscriber: str, index: int, caller: Caller = NOBODY) -> int:
        """Acknowledge message `index`, which must be the subscriber's next; the new next."""
        return self._on(topic, MonitorCommand.TOPIC_ACK, subscriber, index=index,
                        caller=caller).next  # fmt: skip

    def import_topic(
        self, topic: str, owner: str, head: int, followers: list[tuple[str, int, str]],
        principal: str = "",
    ) -> None:  # fmt: skip
        """A topic as ZooKeeper kept it before (docs/http.md, "Migration"), with the principals
        its records held: what the monitor holds already is kept (it is newer)."""
        self._on(topic, MonitorCommand.TOPIC_IMPORT, owner, index=head, caller=Caller(principal))
        for subscriber, following, held in followers:
            self._on(topic, MonitorCommand.TOPIC_IMPORT, owner, index=following,
                     subscriber=subscriber, caller=Caller(held))  # fmt: skip

    def consumed(self, queue: str, floors: dict[str, int]) -> None:
        """Tell the queue's monitor that this gateway needs nothing of each exchange's log
        before its floor (monitor/topics.py, "Retention")."""
        self._ask(queue, TopicAsk(MonitorCommand.TOPIC_FLOOR, floors=tuple(floors.items())))

    def close(self) -> None:
        with self._lock:
            links, self._links = self._links, []
        for link in links:
            link.close()
