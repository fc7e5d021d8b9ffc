"""Every znode path roq uses, built in one place (namespace configurable, default /roq).

<ns>/gcm/election/…            kazoo Election (lock) participants
<ns>/gcm/epoch                 PERSISTENT empty; its version is the leader epoch: each newly
                                          elected leader bumps it, and every leader write checks
                                          it (registry.Fence)
<ns>/gcm/leader                EPHEMERAL  the leading GCM: {"id", "topology", "admin", "broadcast"}
<ns>/hosts/<host>              EPHEMERAL  a live host: {"name", "address", "hcm", "max_exchanges",
                                          "pid", "children"}
<ns>/ports/<host>/<port>       PERSISTENT a port block the host claimed: {"queue", "role", "width"}
                                          (+ "txid" for an exchange)
<ns>/queues/<q>                PERSISTENT the queue record (state machine, see registry.QueueState)
<ns>/queues/<q>/exchanges/<id> PERSISTENT an exchange of the queue: {"host", "front", "back", …}
<ns>/queues/<q>/scaling        PERSISTENT autoscaling rules (JSON)
<ns>/queues/<q>/listeners      PERSISTENT rules listeners (admin 2008): {"Addresses": [...]}
<ns>/xchangeTransactions/<tx>  PERSISTENT idempotency record of an exchange creation
<ns>/http/topics/t<t>          PERSISTENT an HTTP gateway topic: {"topic", "owner", "head"
                                          [, "principal"]}
<ns>/http/topics/t<t>/s<s>     PERSISTENT a subscriber of it: {"next"[, "principal"]}
                                          (coordination/topics.py)
<ns>/http/principals/<p>       PERSISTENT {"topics": n}: the topics principal p registered
<ns>/gone/<host>               PERSISTENT a host the leading GCM saw gone: {"since", "epoch"}
                                          (gcm/repair.py; deleted when it is back or repaired)
<ns>/groups/<q>/<g>            PERSISTENT a consumer group of queue q: {"name", "ordered", "from",
                                          "prefix", "cursors"} (coordination/groupstore.py)
<ns>/groups/<q>/<g>/<slot>     PERSISTENT a live slot of it: monitor/slots.py's `Slot.record`
<ns>/tasks/<q>                 PERSISTENT queue q's request settings that differ from the
                                          defaults (JSON; coordination/taskstore.py)
<ns>/tasks/<q>/<task>          PERSISTENT a request/response task's record (BSON, at most 64 KiB)
<ns>/metrics/<role>@<name>     EPHEMERAL  a metrics and health listener (GCM, host, HTTP gateway):
                                          {"role", "name", "address", "scheme", "token"}
                                          (coordination/targets.py)
<ns>/security/principals       PERSISTENT its data is set by every change (one watch sees all)
<ns>/security/principals/<n>   PERSISTENT a principal: {"name", "key", "grants"[, "tokens"]}
                                          (coordination/principals.py)

The HTTP topics' and subscribers' names are percent-encoded (a znode name holds no "/") behind a
one-letter prefix, t or s (so "." and ".." are names like any other). Nothing else in roq joins a
znode path: tests/unit/test_znode_paths.py fails when a module outside this one does.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True, slots=True)
class Paths:
    namespace: str = "/roq"

    def __post_init__(self) -> None:
        if not self.namespace.startswith("/") or self.namespace.endswith("/"):
            raise ValueError(f"namespace {self.namespace!r} must start and not end with '/'")

    @property
    def election(self) -> str:
        return f"{self.namespace}/gcm/election"

    @property
    def epoch(self) -> str:
        return f"{self.namespace}/gcm/epoch"

    @property
    def leader(self) -> str:
        return f"{self.namespace}/gcm/leader"

    @property
    def hosts(self) -> str:
        return f"{self.namespace}/hosts"

    def host(self, name: str) -> str:
        return f"{self.hosts}/{name}"

    def ports(self, host: str) -> str:
        return f"{self.namespace}/ports/{host}"

    def port(self, host: str, port: int) -> str:
        return f"{self.ports(host)}/{port}"

    @property
    def queues(self) -> str:
        return f"{self.namespace}/queues"

    def queue(self, name: str) -> str:
        return f"{self.queues}/{name}"

    def exchanges(self, queue: str) -> str:
        return f"{self.queue(queue)}/exchanges"

    def exchange(self, queue: str, exchange_id: str) -> str:
        return f"{self.exchanges(queue)}/{exchange_id}"

    def scaling(self, queue: str) -> str:
        return f"{self.queue(queue)}/scaling"

    def listeners(self, queue: str) -> str:
        return f"{self.queue(queue)}/listeners"

    @property
    def xchange_transactions(self) -> str:
        return f"{self.namespace}/xchangeTransactions"

    def xchange_transaction(self, txid: str) -> str:
        return f"{self.xchange_transactions}/{txid}"

    @property
    def http_topics(self) -> str:
        return f"{self.namespace}/http/topics"

    def http_topic(self, topic: str) -> str:
        return f"{self.http_topics}/t{quote(topic, safe='')}"

    def http_principal(self, principal: str) -> str:
        return f"{self.namespace}/http/principals/{principal}"

    def http_subscriber(self, topic: str, subscriber: str) -> str:
        return f"{self.http_topic(topic)}/s{quote(subscriber, safe='')}"

    def groups(self, queue: str) -> str:
        """The queue's consumer groups (deleted with the queue)."""
        return f"{self.namespace}/groups/{queue}"

    def group(self, queue: str, group: str) -> str:
        return f"{self.groups(queue)}/{group}"

    def slot(self, queue: str, group: str, slot: str) -> str:
        return f"{self.group(queue, group)}/{slot}"

    def tasks(self, queue: str) -> str:
        """The queue's request/response tasks; its data is the queue's request settings."""
        return f"{self.namespace}/tasks/{queue}"

    def task(self, queue: str, task: str) -> str:
        return f"{self.tasks(queue)}/{task}"

    @property
    def security(self) -> str:
        return f"{self.namespace}/security"

    @property
    def principals(self) -> str:
        return f"{self.security}/principals"

    def principal(self, name: str) -> str:
        return f"{self.principals}/{name}"

    def top(self, name: str) -> str:
        """A child of the namespace itself, as ZooKeeper lists them (session.secure_namespace)."""
        return f"{self.namespace}/{name}"

    @staticmethod
    def child(parent: str, name: str) -> str:
        """A child of a path built here, as ZooKeeper lists them (Registry.wipe walks roots)."""
        return f"{parent}/{name}"

    @property
    def gone(self) -> str:
        return f"{self.namespace}/gone"

    def gone_host(self, name: str) -> str:
        return f"{self.gone}/{name}"

    @property
    def metrics(self) -> str:
        return f"{self.namespace}/metrics"

    def metrics_target(self, role: str, name: str) -> str:
        return f"{self.metrics}/{quote(role, safe='')}@{quote(name, safe='')}"

    def roots(self) -> tuple[str, ...]:
        """Persistent roots created at start-up (and wiped by formatDB, election excluded)."""
        return (
            self.hosts,
            f"{self.namespace}/ports",
            self.queues,
            self.xchange_transactions,
            self.gone,
        )
