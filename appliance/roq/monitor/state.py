"""The queue's delivery-state log (docs/architecture.md §12): the monitor's own log of task
records (and, as they move, group and topic state), copied to `replicationFactor - 1` exchanges
of the queue by the message logs' replication, and the rule that makes answering safe.

The rule: **a reply waits until every state write made before it is committed** — on
`min.insync.copies` copies, the monitor's own counted, as an `acks=all` publish waits; a reply
that waited `limits.state_reply_wait_s` is refused, retriably, naming the copies missing. Not only
the replies of requests that wrote: a request that read a state written this turn must not be
answered with it before it is committed either (a monitor killed before the copy would leave
the requester holding a state no successor knows; Kafka's high watermark bounds what a
consumer sees for the same reason). A turn's writes are one append and one replication frame,
so a reply waits for one copy round trip, whatever the number of requests in the turn.

Copies: the log's leader id is `state.<epoch>` (protocol/names.py); the monitor names it among
the leaders of the exchanges it chooses as copies (REPLICAS 1030), exchanges on other hosts
than its own first, and keeps its choice while they live, so a copy is not moved for nothing.
The copies' own reports are set apart from the message logs' (service.py), so no copy plan,
listing or slot ever takes a state log for a gone exchange's messages.

Main thread only, like the Log and the Replicator it holds.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from roq import limits
from roq.errors import RoqError
from roq.log import LogSettings, Retention, state_directory
from roq.log.statelog import Change, StateLog
from roq.protocol.bsonmsg import Document
from roq.protocol.messages.control import StateLogStatus
from roq.protocol.names import state_log_id
from roq.replication import Replicator
from roq.transport.rpc import Envelope

log = logging.getLogger(__name__)

# sends a reply to the request of that envelope; the refusal that replaces a reply held too long
Deliver = Callable[[Envelope, Document], None]
Refusal = Callable[[str], Document]


@dataclasses.dataclass(frozen=True)
class CopyCandidate:
    """An exchange that may keep a copy of the state log: its id, its log port's endpoint and
    its host's address (a copy on the monitor's own host is chosen last)."""

    exchange_id: str
    endpoint: str
    address: str
    refusing: bool = False  # its disk refuses appends: it takes no copy while another can


class StateUnavailable(RoqError):
    """The state log refused a write (its disk): the request is refused, retriably."""


class StateKeeper:
    """The state log of one queue's monitor, its copies, and the replies waiting for them."""

    def __init__(
        self, context: Any, queue: str, epoch: int, root: Path | str, settings: LogSettings,
        copies: int, min_copies: int, address: str, deliver: Deliver, refusal: Refusal,
    ):  # fmt: skip
        self.queue, self.address, self.copies = queue, address, max(1, copies)
        self._deliver, self._refusal = deliver, refusal
        self.leader_id = state_log_id(epoch)
        self.name = f"monitor {queue} state log {self.leader_id}"
        kept = dataclasses.replace(
            settings,
            retention=Retention(),  # compaction alone drops what is no longer live state
            memory_bytes=limits.state_memory_bytes,
            max_file_size=limits.state_segment_bytes,
        )
        directory = state_directory(root, queue, self.leader_id)
        self.state = StateLog.open(directory, kept, _producer_id(self.leader_id), name=self.name)
        wanted = min(max(1, min_copies or copies), self.copies)
        self.replicator = Replicator(context, self.leader_id, self.state.log, self.name,
                                     min_copies=wanted)  # fmt: skip
        # The monitor is its own assigner: no assignment to wait for (an exchange's replicator
        # waits for its monitor's); until copies are chosen, min.insync.copies holds it back.
        self.replicator.assign([])
        # (state log end when answered, when, envelope, reply): in order of both
        self._held: collections.deque[tuple[int, float, Envelope, Document]] = collections.deque()
        self.chosen: tuple[str, ...] = ()  # the exchanges copying it, as last assigned
        self._links: list[tuple[str, str]] = []  # theirs: (id, log endpoint)
        self.refused_replies = 0
        log.info("%s: %d state records (%d bytes of log) in %s", self.name, len(self.state),
                 self.state.end_offset - self.state.start_offset, directory)  # fmt: skip

    # --- writes and the replies that wait for them ----------------------------------------
    def write(self, changes: Sequence[Change]) -> int:
        """Append one turn's changes as one batch (StateConflict: none written); the offset
        its replies wait to pass."""
        self.state.append(changes)
        return self.state.end_offset

    def answer(self, envelope: Envelope, reply: Document) -> None:
        """Send now if every state write so far is committed, else once it is."""
        end = self.state.end_offset
        if end <= self.replicator.committed() and not self._held:
            self._deliver(envelope, reply)
            return
        if len(self._held) >= limits.state_held_replies_max:
            self.refused_replies += 1
            why = f"{len(self._held)} replies wait for the state log's copies"
            self._deliver(envelope, self._refusal(f"queue {self.queue}: {why} (retriable)"))
            return
        self._held.append((end, time.monotonic(), envelope, reply))

    def pending(self) -> int:
        return len(self._held)

    def pump(self, ready: set[Any]) -> None:
        """Read the copies' answers among the `ready` sockets, send them what they lack, and
        release the replies now committed; a reply held past `limits.state_reply_wait_s` is
        refused instead (its writes are in the log and may be committed later: a request
        asked again finds them)."""
        for sock in self.replicator.sockets():
            if sock in ready:
                self.replicator.on_answer(sock)
        self.replicator.backfill()
        committed = self.replicator.committed()
        while self._held and self._held[0][0] <= committed:
            _, _, envelope, reply = self._held.popleft()
            self._deliver(envelope, reply)
        deadline = time.monotonic() - limits.state_reply_wait_s
        while self._held and self._held[0][1] < deadline:
            _, _, envelope, _ = self._held.popleft()
            self.refused_replies += 1
            self._deliver(envelope, self._refusal(self._not_copied()))

    def _not_copied(self) -> str:
        r = self.replicator
        return (f"queue {self.queue}: state not copied: {r.copies_in_sync} of "
                f"min.insync.copies={r.min_copies} copies of its state log in sync "
                "(retriable: ask again)")  # fmt: skip

    def sockets(self) -> list[Any]:
        return self.replicator.sockets()

    def status(self) -> StateLogStatus:
        r, state = self.replicator, self.state
        return StateLogStatus(
            self.leader_id, len(state), state.start_offset, state.end_offset, r.committed(),
            r.copies_in_sync, r.min_copies, self.chosen, len(self._held), self.refused_replies,
        )  # fmt: skip

    # --- copies -------------------------------------------------------------------------------
    def choose_copies(self, candidates: list[CopyCandidate]) -> list[CopyCandidate]:
        """The `copies - 1` exchanges to copy the state log: those already copying it while
        they live and take appends, then exchanges on other hosts, then on the monitor's own,
        by id."""
        by_id = {c.exchange_id: c for c in candidates}
        kept = [by_id[x] for x in self.chosen if x in by_id and not by_id[x].refusing]
        rest = sorted(
            (c for c in candidates if c not in kept),
            key=lambda c: (c.refusing, c.address == self.address, c.exchange_id),
        )
        chosen = (kept + rest)[: self.copies - 1]
        ids = tuple(c.exchange_id for c in chosen)
        if ids != self.chosen:
            log.info("%s: copied to %s", self.name, ", ".join(ids) or "nobody")
            self.chosen = ids
        self._links = [(c.exchange_id, c.endpoint) for c in chosen]
        return chosen

    def link(self) -> None:
        """Send to the chosen copies: called once they were told to accept this log (the
        monitor's REPLICAS), so that a first write is not refused for coming first."""
        self.replicator.assign(self._links)

    def tick(self) -> None:
        """Timers: the log's interval flush, and compaction when the log outgrew its state."""
        self.state.tick()
        if self.state.maybe_compact():
            log.info("%s: compacted to %d records from offset %d", self.name, len(self.state),
                     self.state.start_offset)  # fmt: skip

    def close(self) -> None:
        if self._held:  # never told before committed: their requesters ask the next monitor
            log.info("%s: stopping with %d replies not sent (their state is not copied yet)",
                     self.name, len(self._held))  # fmt: skip
        self._held.clear()
        self.replicator.close()
        self.state.flush()
        self.state.log.close()


def _producer_id(leader_id: str) -> bytes:
    """A batch's 16-byte producer id: the leader id's bytes, cut or padded."""
    return leader_id.encode()[:16].ljust(16, b"\0")
