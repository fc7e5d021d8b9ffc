"""Every command number roq puts on a wire, one enum per channel.

Numbers are never reused: a retired command moves to `RETIRED` with a comment, and
`tests/unit/test_protocol.py` checks that no live number is also retired. RoQ's numbers are kept
where RoQ had them (reference §2.2) so that RoQ's tools map onto roq.
"""

from __future__ import annotations

import enum


@enum.unique
class Result(enum.IntEnum):
    """`RESULT` field of every BSON reply."""

    OK = 0
    LEAD_LOST = 8  # this GCM is not the leader: ask the one ZooKeeper names
    FAIL = 1101  # the request was refused; `COMMENT` says why, `ERROR` gives a stable reason


class Reason(enum.StrEnum):
    """`ERROR` field of a FAIL reply: a stable, machine-readable reason beside the comment."""

    BAD_REQUEST = "bad_request"
    UNKNOWN_COMMAND = "unknown_command"
    UNKNOWN_QUEUE = "unknown_queue"
    ALREADY_EXISTS = "already_exists"
    NO_SUCH_HOST = "no_such_host"
    NO_CAPACITY = "no_capacity"
    HOST_FAILED = "host_failed"
    BUSY = "busy"
    INTERNAL = "internal"
    FENCED = "fenced"  # the process's host lost its lease (fencing): ask the GCM where to go
    STALE_EPOCH = "stale_epoch"  # the request carried an older assignment epoch than one seen
    FORBIDDEN = "forbidden"  # the sender's principal lacks the permission the comment names
    CONFLICT = "conflict"  # the request breaks a rule of the state it names (a topic taken…)


@enum.unique
class AdminCommand(enum.IntEnum):
    """GCM admin API on ports.base+3 (RoQ's MngtController numbers) and topology on ports.base."""

    INIT_REQ = 2  # topology dump (RoQ answered with Java serialization; roq answers BSON)
    GET_HOST_BY_QNAME = 2000
    REMOVE_QUEUE = 2001
    STOP_QUEUE = 2002
    CREATE_QUEUE = 2003
    CREATE_XCHANGE = 2004
    START_QUEUE = 2005
    ADD_AUTOSCALING_RULE = 2006
    GET_AUTOSCALING_RULE = 2007
    REGISTER_FOR_AUTOSCALING_RULE_UPDATE = 2008
    GET_CLOUD_PROPERTIES = 2009
    CREATE_QUEUE_AUTOMATICALLY = 2010
    QUEUE_EXISTS = 2011
    # roq additions
    LIST_QUEUES = 2012
    GET_STATUS = 2013
    REMOVE_XCHANGE = 2014
    # work queues (consumer groups): forwarded to the queue's monitor
    LIST_GROUPS = 2020  # {QName} → the queue's groups with their lag, in flight, dead letters
    GET_GROUP = 2021  # {QName, Group} → one group, per consumer
    DELETE_GROUP = 2022  # {QName, Group}: forget the group and its state
    GROUP_DEAD_LETTERS = 2023  # {QName, Group, Action, Letters}: redrive, purge or check letters


@enum.unique
class BroadcastCommand(enum.IntEnum):
    MNGT_UPDATE_CONFIG = 1500  # 3 frames: {CMD, CMD_ID}, {Queues:[...]}, {hosts, Hosts:[...]}


@enum.unique
class HostCommand(enum.IntEnum):
    """Requests the GCM sends to a host's request socket (hcm.port)."""

    CREATE_QUEUE = 1002
    REMOVE_QUEUE = 1008
    CREATE_EXCHANGE = 1009
    REMOVE_EXCHANGE = 1010
    INFO_EXCHANGE = 1011
    STOP_QUEUE = 1012
    MONITOR_MOVED = 1013  # the queue's monitor moved: tell this host's exchanges of it (1031)
    STOP_MONITOR = 1014  # stop the queue's monitor started under this epoch (a called-off move)
    PING = 1020
    SHUTDOWN = 1100


@enum.unique
class ChildCommand(enum.IntEnum):
    """Requests a host sends to the control socket of a monitor or exchange it started."""

    PING = 1020
    SHUTDOWN = 1100
    REPLICAS = 1030  # monitor → exchange: the replicas of your log are `Replicas` [{Id, Endpoint}]
    MONITOR_MOVED = 1031  # host → exchange: report to the monitor at `Monitor` and `Stat` now
    METRICS = 1040  # host → monitor or exchange: your Prometheus samples (protocol/metrics.py)


@enum.unique
class StatCommand(enum.IntEnum):
    """KPI stream (stat monitor, S+1): RoQ's numbers, values typed as numbers."""

    PUBLISHER_TOTAL = 11
    PUBLISHER_MINUTE = 12
    EXCHANGE_ID = 20
    EXCHANGE_MIN = 21
    EXCHANGE_OS_MIN = 22
    QUEUE = 23
    SUBSCRIBER_TOTAL = 31
    SCALING_EVENT = 40  # roq: a scaling decision or its outcome (docs/elasticity.md)


# Numbers that were used once and must never be reused, per channel.
RETIRED: dict[str, frozenset[int]] = {
    "AdminCommand": frozenset(),
    "HostCommand": frozenset(),
    "MonitorCommand": frozenset({4}),  # RoQ's "most productive" report: folded into 5
}


@enum.unique
class MonitorCommand(enum.IntEnum):
    """Requests and reports a queue's monitor receives (RoQ's numbers, reference §2.4).

    Placement requests arrive on the monitor's ROUTER socket (B+1), exchange reports on its SUB
    socket (B+0)."""

    SUBSCRIBER_INIT = 1  # → every live exchange's outbound (back) address
    PUBLISHER_INIT = 2  # → the least-loaded exchange's inbound (front) address
    PUBLISHER_PANIC = 3  # the publisher lost its exchange: place it again, never on `Lost`
    EXCHANGE_REPORT = 5  # heartbeat carrying the exchange's per-second load
    EXCHANGE_LEAVING = 6  # an exchange shutting down cleanly: forget it now
    EXCHANGE_PULSE = 7  # liveness from the exchange's pulse thread, with its loop's age
    EXCHANGE_SUBSCRIPTIONS = 8  # the exchange's subscription count changed (`Subs`)
    # Work queues (consumer groups, monitor/groups.py), on the placement ROUTER socket (B+1):
    GROUP_JOIN = 20  # a consumer joins `Group` (created if new); → the group's settings
    GROUP_LEASE = 21  # → a slot leased to this consumer (where to read it, what is settled)
    GROUP_SETTLE = 22  # acks, nacks, rejects, dead letters of one slot; and messages to hand out
    GROUP_RELEASE = 23  # the consumer gives a slot back (settled what it could)
    GROUP_LEAVE = 24  # the consumer leaves: its slots go back to the group at once
    GROUP_INFO = 25  # `Group` (or every group when empty): lag, in flight, per consumer
    GROUP_DELETE = 26  # forget `Group` and its durable state
    GROUP_DEAD_LETTERS = 27  # redrive or purge `Letters` of `Group`'s dead letters (admin)
    # Request/response through the queue (monitor/tasks.py), on the placement ROUTER socket (B+1):
    TASK_SUBMIT = 40  # claim task id `Task` for `Service` (or → the existing task: dedupe)
    TASK_START = 41  # a worker took attempt `Attempt` of `Task`: run it, or skip it (→ `Run`)
    TASK_FINISH = 42  # its result or error (→ stored, or `Retry` with a new attempt)
    TASK_GET = 43  # → the task's state, and its result once done
    TASK_ACK = 44  # the client has the result: remove the task
    TASK_CONFIG = 45  # the queue's request settings (set the ones given; → all of them)
    # The HTTP gateway's topics (monitor/topics.py), kept in the state log of the monitor of the
    # topic's queue (`http-N`), on the placement ROUTER socket (B+1):
    TOPIC_REGISTER = 50  # register `Topic` for `Name` (its owner), at most `Limit` topics here
    TOPIC_PUBLISH = 51  # owner `Name` takes `Count` indexes of `Topic` (→ `First`, `Head`)
    TOPIC_SUBSCRIBE = 52  # `Name` follows `Topic` from after its head (→ `Next`); `Limit` of them
    TOPIC_POSITION = 53  # → `Name`'s next index in `Topic`, and the topic's `Head`
    TOPIC_ACK = 54  # `Name` acknowledges message `Index` of `Topic`, its next (→ the new `Next`)
    TOPIC_COUNT = 55  # → how many topics this queue holds (`Topics`)
    TOPIC_IMPORT = 56  # a topic kept in ZooKeeper before: `Topic` of owner `Name` at head `Index`,
    # or with `Subscriber`, that subscriber's next `Index`; nothing if already here
    TOPIC_FLOOR = 57  # a gateway read and filed everything before `Floors` {exchange id: offset}
    # that any topic still keeps: whole segments before it may go (Replicas' `ConsumedBefore`)


@enum.unique
class PublisherNotice(enum.IntEnum):
    """What a monitor publishes to its publishers (B+2)."""

    RELOCATE = 1  # move `ProducerID` to `Exchange`
    EXCHANGE_LOST = 2  # `Front` is dead: publishers attached to exactly that address fail over


@enum.unique
class SubscriberNotice(enum.IntEnum):
    """What a monitor publishes to its subscribers (B+3)."""

    NEW_EXCHANGE = 1  # connect to `Back` (RoQ sent the front port here; roq sends the back one)
    EXCHANGE_LIST = 2  # the full list, republished every period: add what is new, drop the rest
