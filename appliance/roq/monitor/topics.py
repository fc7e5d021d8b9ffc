"""The HTTP gateway's topics, kept by the monitor of each topic's queue (`http-N`) in its state log
(monitor/state.py): registrations, owners, heads and subscriber positions (docs/http.md).

    http/topics                     {"topics": n}: how many topics this queue holds
    http/p/<h(principal)>           {"principal", "topics": n}: how many of them it registered
    http/t/<h(topic)>               {"topic", "owner", "head", "subscribers"[, "principal"]}
    http/s/<h(topic)>/<h(name)>     {"topic", "subscriber", "next"[, "principal"]}

`h` is a 128-bit BLAKE2b of the name, hex: names of up to 1,000 characters of any kind make keys
of a fixed, short length (state keys are bounded, `limits.state_key_chars_max`). `head` is the
index of the topic's newest message (1-based, 0: none yet); `next` is the index its subscriber
gets next. Every command is one monitor loop turn: the monitor is the one writer of its state
log, so a head is taken once whatever the number of gateways (no compare-and-set race, as
ZooKeeper's store had), and a count changes in the same append as what it counts. A reply waits
until the append is on `min.insync.copies` copies (service.py `_answer`): what a gateway was told
survives the loss of the monitor's host.

Owners and subscribers are their principals' (issue 31, finding 3): a topic records the
principal that registered it, a subscriber the one that subscribed it, and a request naming
them from another principal is refused (FORBIDDEN: the gateway's 403), unless the gateway says
its caller may act on any (`Override`: admin on the topic). A record without a principal (made
before, by a gateway with security off, or moved from ZooKeeper without one) is claimed by the
first principal that uses it: the monitor is its one writer, so exactly one claim wins.

Retention (57, TOPIC_FLOOR): a gateway that saved its index tells, per exchange of the queue,
the offset before which it needs nothing (every message there is evicted from its topic, or
none is). Any one gateway's word is enough: eviction is for good, so what is evicted for one
gateway is evicted for all; the monitor keeps the highest per exchange, in memory (the
gateways say it again with every snapshot), and hands it to the exchange with its next
REPLICAS (`ConsumedBefore`), whose log then deletes the whole segments before it.
"""

from __future__ import annotations

import hashlib
import json
import logging
from typing import Any

from roq.errors import CoordinationError
from roq.log.statelog import Change, StateLog
from roq.monitor.state import StateKeeper
from roq.protocol.commands import MonitorCommand, Reason
from roq.protocol.dispatch import Encodable, Refused, Route, route
from roq.protocol.messages.topics import TOPIC_COMMANDS, TopicAsk, TopicState

log = logging.getLogger(__name__)

COUNT_KEY = "http/topics"
PRINCIPAL_PREFIX = "http/p/"
TOPIC_PREFIX = "http/t/"
FOLLOWER_PREFIX = "http/s/"


class _Conflict(Exception):
    """The request breaks a rule of the API (the gateway answers 400 with this text)."""


class _Forbidden(Exception):
    """The caller's principal does not hold the owner or subscriber it names (403)."""


def _hold(record: dict[str, Any], ask: TopicAsk, what: str) -> bool:
    """Whether the caller may use `record` (a topic's, for its owner, or a subscriber's):
    _Forbidden if it is another principal's; True when the caller claims it now (an unclaimed
    record: the caller's write must carry the principal set here)."""
    held = str(record.get("principal") or "")
    after = ask.caller.uses(held)
    if after is None:
        raise _Forbidden(f"{what} belongs to another principal")
    if after == held:
        return False
    record["principal"] = after
    return True


def _mine(record: dict[str, Any], ask: TopicAsk) -> dict[str, Any]:
    """A new record, with the caller's principal when it has one."""
    if ask.caller.principal:
        record["principal"] = ask.caller.principal
    return record


def _h(name: str) -> str:
    return hashlib.blake2b(name.encode("utf-8", "surrogatepass"), digest_size=16).hexdigest()


def topic_key(topic: str) -> str:
    return TOPIC_PREFIX + _h(topic)


def principal_key(principal: str) -> str:
    return PRINCIPAL_PREFIX + _h(principal)


def follower_key(topic: str, subscriber: str) -> str:
    return f"{FOLLOWER_PREFIX}{_h(topic)}/{_h(subscriber)}"


def _json(value: dict[str, Any]) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


class TopicManager:
    """The topic commands (50–57) on the state log; main thread only, as the keeper."""

    def __init__(self, queue: str, keeper: StateKeeper | None):
        self.name = f"monitor {queue}"
        self.keeper = keeper
        self.floors: dict[str, int] = {}  # exchange id -> the offset no gateway reads before

    def consumed_before(self, exchange_id: str) -> int:
        return self.floors.get(exchange_id, 0)

    def forget_exchanges(self, live: set[str]) -> None:
        """Floors of exchanges that are gone go with them (the dict stays bounded)."""
        for exchange_id in self.floors.keys() - live:
            del self.floors[exchange_id]

    def routes(self) -> dict[int, Route[Any, Any]]:
        handlers = {
            MonitorCommand.TOPIC_REGISTER: self._register,
            MonitorCommand.TOPIC_PUBLISH: self._publish,
            MonitorCommand.TOPIC_SUBSCRIBE: self._subscribe,
            MonitorCommand.TOPIC_POSITION: self._position,
            MonitorCommand.TOPIC_ACK: self._ack,
            MonitorCommand.TOPIC_COUNT: self._count_of,
            MonitorCommand.TOPIC_IMPORT: self._import,
            MonitorCommand.TOPIC_FLOOR: self._floor,
        }
        assert set(handlers) == TOPIC_COMMANDS
        return {c: route(TopicAsk.decode, self._serving(h)) for c, h in handlers.items()}

    def _serving(self, handler: Any) -> Any:
        """The handler's answer; its refusals (a rule broken, the state log recovering, no
        state log at all) as replies."""

        def serve(ask: TopicAsk) -> Encodable:
            if self.keeper is None:
                return Refused(Reason.BAD_REQUEST, f"{self.name} keeps no topics: the HTTP "
                               "gateway's topics need delivery.state=log")  # fmt: skip
            try:
                return handler(self.keeper.store_state(), ask)  # type: ignore[no-any-return]
            except _Conflict as conflict:
                return Refused(Reason.CONFLICT, str(conflict))
            except _Forbidden as forbidden:
                return Refused(Reason.FORBIDDEN, str(forbidden))
            except CoordinationError as error:
                return Refused(Reason.BUSY, str(error))

        return serve

    def _write(self, changes: list[Change]) -> None:
        assert self.keeper is not None
        self.keeper.store_write(changes)

    # --- the commands --------------------------------------------------------------------------
    def _register(self, state: StateLog, ask: TopicAsk) -> TopicState:
        key = topic_key(ask.topic)
        if state.get(key) is not None:
            raise _Conflict(f"topic {ask.topic!r} is taken")
        count = _count(state)
        if count >= ask.limit:
            raise _Conflict(f"too many topics: the limit is {ask.limit} in this queue")
        principal = ask.caller.principal
        mine = _mine_count(state, principal)
        if ask.quota and mine >= ask.quota:
            raise _Forbidden(f"principal {principal} holds its quota of topics ({ask.quota} "
                             "in this queue)")  # fmt: skip
        record = _mine({"topic": ask.topic, "owner": ask.name, "head": 0, "subscribers": 0}, ask)
        changes = [Change(key, _json(record), expect=0),
                   Change(COUNT_KEY, _json({"topics": count + 1}))]  # fmt: skip
        if principal:  # counted for its quota (per-principal quotas, issue 31, finding 7)
            held = {"principal": principal, "topics": mine + 1}
            changes.append(Change(principal_key(principal), _json(held)))
        self._write(changes)
        return TopicState(topics=count + 1)

    def _publish(self, state: StateLog, ask: TopicAsk) -> TopicState:
        topic = _topic(state, ask.topic)
        if topic["owner"] != ask.name:
            raise _Conflict(f"{ask.name!r} is not the owner of topic {ask.topic!r}")
        _hold(topic, ask, f"owner {ask.name!r} of topic {ask.topic!r}")  # written below
        first = topic["head"] + 1
        topic["head"] += ask.count
        self._write([Change(topic_key(ask.topic), _json(topic))])
        return TopicState(head=topic["head"], first=first)

    def _subscribe(self, state: StateLog, ask: TopicAsk) -> TopicState:
        """Start (or restart) the subscriber after the topic's head."""
        topic = _topic(state, ask.topic)
        key = follower_key(ask.topic, ask.name)
        found = _read(state, key)
        following = {"topic": ask.topic, "subscriber": ask.name, "next": topic["head"] + 1}
        if found is None:
            _mine(following, ask)
        else:  # subscribing again restarts it: its principal's alone
            _hold(found, ask, f"subscriber {ask.name!r} of topic {ask.topic!r}")
            if found.get("principal"):
                following["principal"] = found["principal"]
        changes = [Change(key, _json(following))]
        if found is None:
            if topic["subscribers"] >= ask.limit:
                raise _Conflict(f"topic {ask.topic!r} has {ask.limit} subscribers: the limit")
            topic["subscribers"] += 1
            changes.append(Change(topic_key(ask.topic), _json(topic)))
        self._write(changes)
        return TopicState(head=topic["head"], next=following["next"])

    def _position(self, state: StateLog, ask: TopicAsk) -> TopicState:
        head = _topic(state, ask.topic)["head"]
        following = _follower(state, ask)
        if _hold(following, ask, f"subscriber {ask.name!r} of topic {ask.topic!r}"):
            self._write([Change(follower_key(ask.topic, ask.name), _json(following))])
        return TopicState(head=head, next=following["next"])

    def _ack(self, state: StateLog, ask: TopicAsk) -> TopicState:
        """Acknowledge message `Index`, which must be the subscriber's next."""
        head = _topic(state, ask.topic)["head"]
        following = _follower(state, ask)
        _hold(following, ask, f"subscriber {ask.name!r} of topic {ask.topic!r}")  # written below
        if ask.index != following["next"]:
            raise _Conflict(f"message {ask.index} is not the next of {ask.name!r} "
                            f"({following['next']})")  # fmt: skip
        if ask.index > head:
            raise _Conflict(f"message {ask.index} of topic {ask.topic!r} is not published yet")
        following["next"] = ask.index + 1
        self._write([Change(follower_key(ask.topic, ask.name), _json(following))])
        return TopicState(head=head, next=following["next"])

    def _count_of(self, state: StateLog, ask: TopicAsk) -> TopicState:
        return TopicState(topics=_count(state), mine=_mine_count(state, ask.caller.principal))

    def _floor(self, _: StateLog, ask: TopicAsk) -> TopicState:
        for exchange_id, offset in ask.floors:
            if offset > self.floors.get(exchange_id, 0):
                self.floors[exchange_id] = offset
        return TopicState()

    def _import(self, state: StateLog, ask: TopicAsk) -> TopicState:
        """A topic, or one subscriber's position, as ZooKeeper kept it before: written unless
        it is here already (then what is here is newer: a gateway on this store wrote it), so
        gateways importing at once, or one importing again after a crash, change nothing."""
        if ask.subscriber:
            return self._import_follower(state, ask)
        key = topic_key(ask.topic)
        if state.get(key) is None:
            count = _count(state) + 1
            record = {"topic": ask.topic, "owner": ask.name, "head": ask.index, "subscribers": 0}
            _mine(record, ask)  # the principal ZooKeeper's record held, if any
            self._write([Change(key, _json(record), expect=0),
                         Change(COUNT_KEY, _json({"topics": count}))])  # fmt: skip
        return TopicState(head=_topic(state, ask.topic)["head"], topics=_count(state))

    def _import_follower(self, state: StateLog, ask: TopicAsk) -> TopicState:
        topic = _topic(state, ask.topic)
        key = follower_key(ask.topic, ask.subscriber)
        found = _read(state, key)
        if found is not None:
            return TopicState(head=topic["head"], next=int(found["next"]))
        following = {"topic": ask.topic, "subscriber": ask.subscriber, "next": ask.index}
        _mine(following, ask)
        topic["subscribers"] += 1
        self._write([Change(key, _json(following), expect=0),
                     Change(topic_key(ask.topic), _json(topic))])  # fmt: skip
        return TopicState(head=topic["head"], next=ask.index)


def _read(state: StateLog, key: str) -> dict[str, Any] | None:
    found = state.get(key)
    if found is None:
        return None
    value = json.loads(found[0])
    if not isinstance(value, dict):
        raise CoordinationError(f"state record {key} is not a JSON object")
    return value


def _count(state: StateLog) -> int:
    found = _read(state, COUNT_KEY)
    return int(found["topics"]) if found else 0


def _mine_count(state: StateLog, principal: str) -> int:
    """The topics `principal` registered in this queue (0 for nobody)."""
    if not principal:
        return 0
    found = _read(state, principal_key(principal))
    return int(found["topics"]) if found and found.get("principal") == principal else 0


def _topic(state: StateLog, topic: str) -> dict[str, Any]:
    found = _read(state, topic_key(topic))
    if found is None or found.get("topic") != topic:
        raise _Conflict(f"unknown topic {topic!r}")
    return found


def _follower(state: StateLog, ask: TopicAsk) -> dict[str, Any]:
    found = _read(state, follower_key(ask.topic, ask.name))
    if found is None or found.get("subscriber") != ask.name:
        raise _Conflict(f"{ask.name!r} is not subscribed to topic {ask.topic!r}")
    return found
