"""The queue's delivery-state log (docs/architecture.md §12): the monitor's own log of task
records and consumer groups (`delivery.state=log`), copied to `replicationFactor - 1`
exchanges of the queue by the message logs' replication, and the rule that makes answering safe.

The rule: **a reply waits until every state write made before it is committed** — on
`min.insync.copies` copies, the monitor's own counted, as an `acks=all` publish waits; a reply
that waited `limits.state_reply_wait_s` is refused, retriably, naming the copies missing. Not only
the replies of requests that wrote: a request that read a state written this turn must not be
answered with it before it is committed either (a monitor killed before the copy would leave
the requester holding a state no successor knows; Kafka's high watermark bounds what a
consumer sees for the same reason). A turn's writes are one append and one replication frame,
so a reply waits for one copy round trip, whatever the number of requests in the turn. (The
consumer groups keep their own rule, as with ZooKeeper: a reply goes at once and says which
settles are `Written`, i.e. copied: grouplog.py.)

Copies: the log's leader id is `state.<epoch>` (protocol/names.py); the monitor names it among
the leaders of the exchanges it chooses as copies (REPLICAS 1030), exchanges on other hosts
than its own first, and keeps its choice while they live there (a copy on its own host moves
once another host has an exchange). The copies' own reports are set apart from the message
logs' (service.py), so no copy plan, listing or slot ever takes a state log for a gone
exchange's messages. The copies follow the log's compaction (PRUNE).

Start: its own log if this epoch's is on this host (a restart in place), replayed in a thread of
its own (`OwnReplay`) so that the monitor answers its host's PING and every request meanwhile,
however long the log; else the newest older log it can read (recovery.py), or, with none, a new
log that takes in the queue's ZooKeeper state (migration.py). Until then task, group and topic
requests are answered busy.

Main thread only, like the Log and the Replicator it holds (a recovery's read and the replay of
its own log each run in a thread of their own and hand their result over once ended).
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import os
import shutil
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from roq import limits
from roq.errors import CoordinationError, LogError, RoqError
from roq.log import LogSettings, Retention, state_directory
from roq.log.log import sync_directory
from roq.log.statelog import Change, StateLog
from roq.monitor.recovery import (
    ORIGIN_KEY,
    CopyRead,
    Source,
    best_first,
    is_complete,
    local_sources,
    origin_record,
)
from roq.protocol.bsonmsg import Document
from roq.protocol.messages.control import StateLogStatus
from roq.protocol.names import state_log_id
from roq.replication import Replicator
from roq.transport import READABLE, Poller
from roq.transport.rpc import Envelope

if TYPE_CHECKING:
    from roq.monitor.migration import Migration  # it imports the stores, which import this

log = logging.getLogger(__name__)

# sends a reply to the request of that envelope; the refusal that replaces a reply held too long
Deliver = Callable[[Envelope, Document], None]
Refusal = Callable[[str], Document]


@dataclasses.dataclass(frozen=True)
class CopyCandidate:
    """An exchange that may keep a copy of the state log: its id, its log port's endpoint and
    its host (a name, else an address: a copy on the monitor's own host is chosen last)."""

    exchange_id: str
    endpoint: str
    host: str
    refusing: bool = False  # its disk refuses appends: it takes no copy while another can


class StateUnavailable(RoqError):
    """The state log refused a write (its disk): the request is refused, retriably."""


class StateKeeper:
    """The state log of one queue's monitor, its copies, and the replies waiting for them.

    A monitor placed under a new epoch (a host lost, a re-placement) starts *recovering*: it
    reads the newest complete older state log it can find (monitor/recovery.py) into its own,
    and until then answers every task request as busy. Restarted in place (its epoch's log is
    on this host), it serves once its own log is replayed (in a thread: busy until then); the
    queue's first monitor (epoch 1) serves at once."""

    def __init__(
        self, context: Any, queue: str, epoch: int, root: Path | str, settings: LogSettings,
        copies: int, min_copies: int, host: str, deliver: Deliver, refusal: Refusal,
        migration: Migration | None = None,
    ):  # fmt: skip
        self.context, self.queue, self.epoch = context, queue, epoch
        self.host, self.copies = host, max(1, copies)
        self.min_copies = min(max(1, min_copies or copies), self.copies)
        self._deliver, self._refusal = deliver, refusal
        self.leader_id = state_log_id(epoch)
        self.name = f"monitor {queue} state log {self.leader_id}"
        self.settings = dataclasses.replace(
            settings,
            retention=Retention(),  # compaction alone drops what is no longer live state
            memory_bytes=limits.state_memory_bytes,
            max_file_size=limits.state_segment_bytes,
        )
        self.directory = state_directory(root, queue, self.leader_id)
        self._state: StateLog | None = None
        self._replicator: Replicator | None = None
        # (state log end when answered, when, envelope, reply): in order of both
        self._held: collections.deque[tuple[int, float, Envelope, Document]] = collections.deque()
        self.chosen: tuple[str, ...] = ()  # the exchanges copying it, as last assigned
        self._links: list[tuple[str, str]] = []  # theirs: (id, log endpoint)
        self.refused_replies = 0
        # where this epoch's log held everything older logs did (its origin record), and
        # whether the older logs of this host were deleted once that was copied
        self._origin_end = -1
        self._older_deleted = False
        # recovery: the older state logs seen (copies reported, this host's), what was tried
        here = local_sources(self.directory.parent, self.leader_id)
        self._sources = {(s.leader_id, s.holder): s for s in here}
        self._tried: set[tuple[str, str]] = set()
        self._read: CopyRead | None = None
        self._recover_until = time.monotonic() + limits.state_recovery_wait_s
        self.migration = migration  # the queue's ZooKeeper state, for a log begun fresh
        # restarted in place: its own log, replayed in a thread while the loop answers (busy)
        self._replay: OwnReplay | None = None
        if self.directory.exists():
            log.info("%s: replaying its own log in %s before serving", self.name,
                     self.directory)  # fmt: skip
            self._replay = OwnReplay(self.directory, self.settings, self._producer, self.name)
            self._replay.start()
        elif epoch <= 1:  # the queue's first monitor: no older log to look for
            self._start_fresh()
        else:
            log.info("%s: recovering: reading the newest older state log before serving",
                     self.name)  # fmt: skip

    @property
    def _producer(self) -> bytes:
        return _producer_id(self.leader_id)

    @property
    def ready(self) -> bool:
        return self._state is not None

    @property
    def state(self) -> StateLog:
        if self._state is None:
            raise StateUnavailable(f"queue {self.queue}: the monitor is recovering its state "
                                   "log (retriable: ask again)")  # fmt: skip
        return self._state

    def store_state(self) -> StateLog:
        """The log, for a store (tasklog.py, grouplog.py): CoordinationError, as a ZooKeeper
        store raises, while the monitor recovers it (the request is answered busy)."""
        try:
            return self.state
        except StateUnavailable as error:
            raise CoordinationError(str(error)) from None

    def store_write(self, changes: Sequence[Change]) -> int:
        """`write` for a store: a refused write (recovering, a disk error, a failed
        compare-and-set) raises CoordinationError; nothing acknowledged is lost."""
        try:
            return self.write(changes)
        except (StateUnavailable, LogError) as error:
            raise CoordinationError(f"state log: {error}") from None

    @property
    def replicator(self) -> Replicator:
        if self._replicator is None:
            raise StateUnavailable(f"queue {self.queue}: the monitor is recovering its state log")
        return self._replicator

    def _open(self) -> StateLog:
        return StateLog.open(self.directory, self.settings, self._producer, name=self.name)

    def _replayed(self, replay: OwnReplay) -> None:
        """Take this epoch's own log once its replay is done. A log that cannot be opened stops
        the monitor, as it did when the replay ran before the loop (its host restarts it)."""
        if replay.is_alive():
            return
        self._replay = None
        if replay.result is None:
            raise replay.error or LogError(f"{self.name}: the replay of its log ended with none")
        log.info("%s: replayed its own log in %.1f s", self.name, replay.took_s)
        self._serve(replay.result, None)

    def _serve(self, state: StateLog, source: str | None) -> None:
        """Take `state` as this epoch's log and copy it. A log begun now (`source`: what it was
        restored from, "" if nothing) gets its own origin record (recovery.py)."""
        self._state = state
        if source is None and not is_complete(state, self.leader_id):
            source = "this host"  # begun, then a crash before its origin: its own all the same
        if source is not None:
            state.append([Change(ORIGIN_KEY, origin_record(self.leader_id, source))])
        self._origin_end = state.end_offset
        self._replicator = Replicator(self.context, self.leader_id, state.log, self.name,
                                      min_copies=self.min_copies, prune=True)  # fmt: skip
        # The monitor is its own assigner: no assignment to wait for (an exchange's replicator
        # waits for its monitor's); until copies are chosen, min.insync.copies holds it back.
        self._replicator.assign(self._links)
        log.info("%s: %d state records (%d bytes of log) in %s%s", self.name, len(state),
                 state.end_offset - state.start_offset, self.directory,
                 f", restored from {source}" if source else "")  # fmt: skip

    # --- recovery -----------------------------------------------------------------------------
    def saw_copies(self, exchange_id: str, endpoint: str, copies: dict[str, int]) -> None:
        """An exchange's report of the state logs it copies (`endpoint`: its log port)."""
        for leader_id, end in copies.items():
            self._sources[(leader_id, exchange_id)] = Source(leader_id, end, exchange_id, endpoint)

    def _recover(self, now: float) -> None:
        """One step: take a finished read, or start the next, or start empty when no older
        state log turned up within `limits.state_recovery_wait_s`."""
        if self._read is not None:
            if self._read.is_alive():
                return
            self._finish_read(self._read)
            self._read = None
            if self.ready:
                return
        untried = [s for s in best_first(list(self._sources.values()), self.epoch)
                   if (s.leader_id, s.holder) not in self._tried]  # fmt: skip
        if not untried:
            if now >= self._recover_until:
                log.warning("%s: no older state log found in %.1f s: starting a new one",
                            self.name, limits.state_recovery_wait_s)  # fmt: skip
                self._start_fresh()
            return
        best = untried[0]
        holders = sum(1 for s in untried if s.leader_id == best.leader_id)
        if now < self._recover_until and holders < self.copies - 1 and best.holder != "local":
            return  # the other copies of that epoch may report yet: read the longest
        self._tried.add((best.leader_id, best.holder))
        log.info("%s: reading %s from %s (%d bytes)", self.name, best.leader_id, best.holder,
                 best.end)  # fmt: skip
        self._read = CopyRead(self.context, best, self.directory, self.settings, self._producer,
                              self.name)  # fmt: skip
        self._read.start()

    def _start_fresh(self) -> None:
        """Begin this epoch's log with nothing older to read: with the queue's ZooKeeper state
        if it has any (migration.py), built aside and renamed into place whole, so a crash
        never leaves a log with part of it. ZooKeeper unreadable: tried again a second later."""
        imported: list[Change] = []
        if self.migration is not None:
            try:
                imported = self.migration.read()
            except CoordinationError as error:
                log.warning("%s: the queue's ZooKeeper state is not readable yet (%s): "
                            "trying again", self.name, error)  # fmt: skip
                self._recover_until = time.monotonic() + 1.0
                return
        if not imported:
            self._serve(self._open(), "")
            return
        scratch = self.directory.with_name(self.directory.name + ".importing")
        shutil.rmtree(scratch, ignore_errors=True)
        with StateLog.open(scratch, self.settings, self._producer, name=self.name) as new:
            for chunk in batches(imported):
                new.append(chunk)
            new.append([Change(ORIGIN_KEY, origin_record(self.leader_id, "zookeeper"))])
            new.flush()
            end = new.end_offset
        os.replace(scratch, self.directory)
        sync_directory(self.directory.parent, self.name)  # the rename survives a crash
        assert self.migration is not None
        self.migration.end = end
        log.info("%s: %d records moved in from ZooKeeper (tasks, settings, groups, slots)",
                 self.name, len(imported))  # fmt: skip
        self._serve(self._open(), None)

    def older_dropped_below(self) -> int:
        """This epoch, once its log holds what the older ones did and that is committed (on
        min.insync.copies copies): their copies on the exchanges may go (REPLICAS'
        `DropStateBefore`). 0 before."""
        if self._state is None or self._origin_end < 0 or not self.committed_to(self._origin_end):
            return 0
        return self.epoch

    def _delete_older(self) -> None:
        """This host's older state logs of the queue, once `older_dropped_below` says so."""
        if self._older_deleted or not self.older_dropped_below():
            return
        self._older_deleted = True
        for source in local_sources(self.directory.parent, self.leader_id):
            if source.directory is not None and 0 <= source.epoch < self.epoch:
                shutil.rmtree(source.directory, ignore_errors=True)
                log.info("%s: deleted this host's older state log %s", self.name,
                         source.leader_id)  # fmt: skip

    def migrated(self) -> None:
        """Once the records moved in from ZooKeeper are copied, their znodes go (once)."""
        migration = self.migration
        if migration is None or migration.end < 0 or not self.committed_to(migration.end):
            return
        try:
            migration.forget()
        except CoordinationError as error:
            log.warning("%s: the moved znodes stay in ZooKeeper for now: %s", self.name, error)

    def _finish_read(self, read: CopyRead) -> None:
        if read.result is not None:
            self._serve(read.result, f"{read.source.leader_id} on {read.source.holder}")
        else:
            log.warning("%s: could not read %s from %s: %s; trying the next", self.name,
                        read.source.leader_id, read.source.holder, read.error)  # fmt: skip

    # --- writes and the replies that wait for them ----------------------------------------
    def write(self, changes: Sequence[Change]) -> int:
        """Append one turn's changes as one batch (StateConflict: none written); the offset
        its replies wait to pass."""
        self.state.append(changes)
        return self.state.end_offset

    def answer(self, envelope: Envelope, reply: Document) -> None:
        """Send now if every state write so far is committed, else once it is (recovering,
        nothing is written: the replies are refusals, sent at once)."""
        if self._state is None:
            self._deliver(envelope, reply)
            return
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

    def committed_to(self, end: int) -> bool:
        """Whether every state write below `end` is on min.insync.copies copies."""
        return self._replicator is not None and self._replicator.committed() >= end

    def wait_committed(self, end: int, timeout_s: float) -> bool:
        """Block at most `timeout_s` until `committed_to(end)`, reading the copies' answers
        meanwhile (a consumer's flush waits so: its SETTLE with `Sync`)."""
        deadline = time.monotonic() + timeout_s
        poller = Poller()
        for sock in self.sockets():
            poller.register(sock, READABLE)
        while not self.committed_to(end):
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            ready = poller.poll(max(1, min(int(left * 1000), limits.state_pending_poll_ms)))
            self.pump({sock for sock, _ in ready})
        return True

    def pump(self, ready: set[Any]) -> None:
        """Read the copies' answers among the `ready` sockets, send them what they lack, and
        release the replies now committed; a reply held past `limits.state_reply_wait_s` is
        refused instead (its writes are in the log and may be committed later: a request
        asked again finds them). Recovering, a step of the recovery instead."""
        if self._state is None:
            if self._replay is not None:
                self._replayed(self._replay)
            else:
                self._recover(time.monotonic())
            return
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
        return self._replicator.sockets() if self._replicator is not None else []

    def status(self) -> StateLogStatus:
        reading = self._read.source if self._read is not None else None
        recovering = f"{reading.leader_id} on {reading.holder}" if reading else "looking"
        if self._replay is not None:
            recovering = f"{self.leader_id} on this host"  # its own log, replayed
        if self._state is None or self._replicator is None:
            return StateLogStatus(self.leader_id, 0, 0, 0, 0, 0, self.min_copies, self.chosen,
                                  0, self.refused_replies, recovering)  # fmt: skip
        r, state = self._replicator, self._state
        return StateLogStatus(
            self.leader_id, len(state), state.start_offset, state.end_offset, r.committed(),
            r.copies_in_sync, r.min_copies, self.chosen, len(self._held), self.refused_replies,
        )  # fmt: skip

    # --- copies -------------------------------------------------------------------------------
    def choose_copies(self, candidates: list[CopyCandidate]) -> list[CopyCandidate]:
        """The `copies - 1` exchanges to copy the state log: those already copying it on other
        hosts while they live and take appends, then exchanges on other hosts, then on the
        monitor's own (a copy there is moved once another host has an exchange: it would be
        lost with the monitor), by id."""
        by_id = {c.exchange_id: c for c in candidates}
        kept = [by_id[x] for x in self.chosen
                if x in by_id and not by_id[x].refusing and by_id[x].host != self.host]  # fmt: skip
        rest = sorted(
            (c for c in candidates if c not in kept),
            key=lambda c: (c.refusing, c.host == self.host, c.exchange_id),
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
        if self._replicator is not None:
            self._replicator.assign(self._links)

    def tick(self) -> None:
        """Timers: the log's interval flush, and compaction when the log outgrew its state."""
        if self._state is None:
            return
        self.state.tick()
        self.migrated()
        self._delete_older()
        if self.state.maybe_compact():
            log.info("%s: compacted to %d records from offset %d", self.name, len(self.state),
                     self.state.start_offset)  # fmt: skip

    def close(self) -> None:
        if self._held:  # never told before committed: their requesters ask the next monitor
            log.info("%s: stopping with %d replies not sent (their state is not copied yet)",
                     self.name, len(self._held))  # fmt: skip
        self._held.clear()
        if self._replay is not None:  # stopped while replaying: to the log, a crash, as before
            log.info("%s: stopping before its replay ended", self.name)
            if not self._replay.is_alive() and self._replay.result is not None:
                self._replay.result.log.close()
        if self._read is not None:  # a daemon thread: its restore is left in a scratch dir
            self._read.join(limits.state_recovery_read_timeout_ms / 1000)
            if self._read.result is not None:
                self._read.result.log.close()
        if self._replicator is not None:
            self._replicator.close()
        if self._state is not None:
            self._state.flush()
            self._state.log.close()


class OwnReplay(threading.Thread):
    """Opens this epoch's own state log (a monitor restarted in place) and replays it into its
    image, off the monitor's loop: the replay is linear in the log (about 20 µs a record, so
    seconds for a few hundred thousand keys), and until it ends the monitor answers its host's
    PING (it started) and every state request as busy, as while it recovers an older log.
    `result` or `error` once done; the main thread then takes the log (`StateKeeper.pump`)."""

    def __init__(self, directory: Path, settings: LogSettings, producer_id: bytes, name: str):
        super().__init__(name="state-replay", daemon=True)
        self.directory, self.settings, self.producer_id, self.label = (
            directory, settings, producer_id, name,
        )  # fmt: skip
        self.result: StateLog | None = None
        self.error: Exception | None = None
        self.took_s = 0.0

    def run(self) -> None:
        started = time.monotonic()
        try:
            self.result = StateLog.open(self.directory, self.settings, self.producer_id,
                                        name=self.label)  # fmt: skip
        except Exception as error:
            self.error = error
        self.took_s = time.monotonic() - started


def _producer_id(leader_id: str) -> bytes:
    """A batch's 16-byte producer id: the leader id's bytes, cut or padded."""
    return leader_id.encode()[:16].ljust(16, b"\0")


def batches(changes: list[Change]) -> list[list[Change]]:
    """The changes cut into appends of at most `limits.state_snapshot_batch_bytes` each."""
    out: list[list[Change]] = [[]]
    size = 0
    for change in changes:
        cost = len(change.key) + len(change.value or b"") + 64  # the record's BSON around them
        if out[-1] and size + cost > limits.state_snapshot_batch_bytes:
            out.append([])
            size = 0
        out[-1].append(change)
        size += cost
    return [chunk for chunk in out if chunk]
