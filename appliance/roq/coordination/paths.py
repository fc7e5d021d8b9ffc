"""Every znode path roq uses, built in one place (namespace configurable, default /roq).

<ns>/gcm/election/…            kazoo Election (lock) participants
<ns>/gcm/epoch                 PERSISTENT empty; its version is the leader epoch: each newly
                                          elected leader bumps it, and every leader write checks
                                          it (registry.Fence)
<ns>/gcm/leader                EPHEMERAL  the leading GCM: {"id", "topology", "admin", "broadcast"}
<ns>/hosts/<host>              EPHEMERAL  a live host: {"name", "address", "hcm", "max_exchanges",
                                          "pid"}
<ns>/ports/<host>/<port>       PERSISTENT a port block the host claimed: {"queue", "role", "width"}
                                          (+ "txid" for an exchange)
<ns>/queues/<q>                PERSISTENT the queue record (state machine, see registry.QueueState)
<ns>/queues/<q>/exchanges/<id> PERSISTENT an exchange of the queue: {"host", "front", "back", …}
<ns>/queues/<q>/scaling        PERSISTENT autoscaling rules (JSON)
<ns>/queues/<q>/listeners      PERSISTENT rules listeners (admin 2008): {"Addresses": [...]}
<ns>/xchangeTransactions/<tx>  PERSISTENT idempotency record of an exchange creation
<ns>/http/topics/<t>           PERSISTENT an HTTP gateway topic: {"topic", "owner", "head"}
<ns>/http/topics/<t>/<s>       PERSISTENT a subscriber of it: {"next"} (coordination/topics.py)
<ns>/gone/<host>               PERSISTENT a host the leading GCM saw gone: {"since", "epoch"}
                                          (gcm/repair.py; deleted when it is back or repaired)
"""

from __future__ import annotations

from dataclasses import dataclass


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

    @property
    def gone(self) -> str:
        return f"{self.namespace}/gone"

    def gone_host(self, name: str) -> str:
        return f"{self.gone}/{name}"

    def roots(self) -> tuple[str, ...]:
        """Persistent roots created at start-up (and wiped by formatDB, election excluded)."""
        return (
            self.hosts,
            f"{self.namespace}/ports",
            self.queues,
            self.xchange_transactions,
            self.gone,
        )
