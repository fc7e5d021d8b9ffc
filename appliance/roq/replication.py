"""Log replication between exchanges (the thesis §3.2.1): each exchange leads its own log and
copies it to `replicationFactor - 1` replica exchanges that the queue's monitor assigns.

Leader side (`Replicator`, in the leading exchange's main thread, which owns its sockets): once
per turn of the exchange's loop, what was appended since the last send goes to each replica's
port F+3 as one frame of whole batches (the same stamped bytes, read back from the memory log),
with the offset it must land at; replicas answer with their new end offset. One frame per turn
rather than per batch: a replication frame costs each side tens of µs, so small batches sent one
by one doubled the exchanges' CPU (docs/benchmarks.md §3). Sends are pipelined up to
`REPLICATION_WINDOW_BYTES` ahead of the replica's acknowledgement. A replica that is behind (new,
restarted, or it missed batches) answers with where its copy ends, and the leader back-fills it
from its own log; if retention already deleted that part, the leader tells the replica to
restart its copy at the log's start (RESTART), and the replica is out of sync until it has
caught up.

In sync (Kafka's ISR rule, with its `replica.lag.time.max.ms` as `REPLICA_LAG_S`): a replica is
in sync while its copy holds the whole log as it stood `REPLICA_LAG_S` ago, and has no hole. So
a replica that stops answering, or keeps answering but falls further behind than that, drops
out; a new replica of a long log is out until its back-fill has come that close to the end.
The committed offset is the lowest end offset among in-sync replicas (and the leader's own end):
`acks=all` confirms a batch once it is below it, so it waits for a slow replica at most about
`REPLICA_LAG_S`, and never for a back-fill. `min.insync.copies` (Kafka's
`min.insync.replicas`; by default replicationFactor) is the floor: while fewer copies than that
are in sync (the leader counts as one), the committed offset does not move at all, and the
exchange refuses what waited past `limits.acks_all_insync_wait_s` (service.py) with a reason
naming the copies missing. `acks=all` is never quietly the leader alone: in the fault harness's
rolling restart it was, while a replica's machine restarted, and a subscriber reading the
short copy of that leader's log, before its machine was back, lost what only the leader held.
Before the monitor's first assignment since the exchange started nothing is committed either,
and a newly assigned replica that has not answered yet is waited for (at most `REPLICA_LAG_S`),
as its first answer may well show it in sync (an empty copy of an empty log, at a queue's
start). The committed offset never moves back.

Replica side (`ReplicaStore`): one log per leader under
`<directory>/_replicas/<queue>/<leader id>@<replica id>/`, in the same segment format, so the copy
can be read (replay) and analysed like the original. A write at an offset below the copy's end
means the leader lost a tail it never had acknowledged (it crashed before syncing): the copy is
cut back to the leader's offset, so leader and copies never diverge. A frame is decoded whole
(kind, leader id, an offset below `limits.log_offset_max`, every batch valid) before a copy is
opened or changed; a copy that cannot be opened at start is set aside (quarantined), so one bad
copy never stops the exchange. A replica copies only the leaders the queue's monitor assigned to
it (`Leaders` of REPLICAS 1030, `ReplicaStore.accept`): a write, probe or restart from any other
exchange is refused with a reason and creates nothing, and until the monitor has said (a fresh
or restarted exchange) every leader is refused; the copies already held stay readable. A leader
told FAILED asks again `limits.replication_refused_retry_s` later.
"""

from __future__ import annotations

import collections
import dataclasses
import logging
import shutil
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from roq import limits
from roq.errors import (
    CorruptRecord,
    DecodeError,
    InvalidOffset,
    LogError,
    ProtocolError,
    TransportError,
)
from roq.log import Log, LogSettings, ReadStatus, replica_directory
from roq.log import format as batchfmt
from roq.log.format import BatchHeader
from roq.protocol import dataplane
from roq.protocol.messages.control import ReplicaStatus
from roq.protocol.names import check_exchange_id, is_state_log, state_log_epoch
from roq.transport import Kind, connect, drained, open_socket, send_nowait

log = logging.getLogger(__name__)

# Kept under these names for the docstring above, the tests and benchmarks/replica_catchup.py.
REPLICATION_WINDOW_BYTES = limits.replication_window_bytes
REPLICA_LAG_S = limits.replica_lag_s
REPLICA_LOGS_MAX = limits.replica_logs_max
_END = struct.Struct("<Q")

WRITE = b"W"  # [W][leader id][offset 8 LE][whole batches]  → [w][leader id][status][end 8 LE]
# (a FAILED answer adds a fifth frame, the reason in UTF-8)
PROBE = b"Q"  # [Q][leader id]                         → [w][leader id][K][end 8 LE]
RESTART = b"S"  # [S][leader id][offset 8 LE]          → [w][leader id][K][end 8 LE]
# A leader that compacts (the monitor's state log) has its copies follow its start: each copy
# drops its whole segments before it (a copy otherwise keeps all history: nothing else prunes
# a copy whose leader lives).
PRUNE = b"D"  # [D][leader id][start 8 LE]            → [w][leader id][K][end 8 LE]
# (the log server tells these from log reads by the first frame: R, T and P are taken)
WRITTEN = b"w"
OK, BEHIND, FAILED = b"K", b"B", b"X"
_FRAMES = {PROBE: 2, RESTART: 3, PRUNE: 3, WRITE: 4}
KINDS = tuple(_FRAMES)  # what the log server hands to a ReplicaStore
QUARANTINE_SUFFIX = ".quarantined"  # a copy set aside: `<leader>@<replica>.quarantined-<time>`


# --- replica side ---------------------------------------------------------------------------
# A copy's write, once appended: the frame and each of its batches' (position, header)
Copied = Callable[[memoryview, list[tuple[int, BatchHeader]]], None]


class ReplicaStore:
    """The copies this exchange keeps of other exchanges' logs. Main thread only."""

    def __init__(
        self,
        root: str | Path,
        queue: str,
        own_id: str,
        settings: LogSettings,
        copied: Copied | None = None,
    ):
        # `copied`: told of the batches of each message log's write once appended (the
        # exchange's de-duplication window takes their message ids; not a state log's)
        self.copied = copied
        # No memory log for copies: a copy is read only once its leader is dead, and then the
        # page cache serves it. A memory tail each (64 MiB by default) made R=2 exchanges
        # grow past 200 MB resident (docs/benchmarks.md §4).
        settings = dataclasses.replace(settings, memory_bytes=0)
        self.root, self.queue, self.own_id, self.settings = root, queue, own_id, settings
        self.logs: dict[str, Log] = {}
        # The leaders the monitor assigned this exchange to copy; none until it has said.
        self.leaders: frozenset[str] = frozenset()
        self._open_existing()

    def accept(self, leaders: tuple[str, ...]) -> None:
        """The monitor's assignment: copy these leaders' logs, and refuse every other's writes
        (the copies already held stay readable)."""
        wanted = frozenset(leaders) - {self.own_id}
        if wanted != self.leaders:
            log.info("copies of %s's logs: accepting %s", self.queue,
                     ", ".join(sorted(wanted)) or "none")  # fmt: skip
        self.leaders = wanted

    def _open_existing(self) -> None:
        """Open the copies this exchange kept before it (re)started: they are announced in its
        reports, so the copy of a leader that died meanwhile can still be replayed."""
        parent = Path(self.root) / "_replicas" / self.queue
        suffix = f"@{self.own_id}"
        try:
            found = sorted(p.name for p in parent.iterdir() if p.name.endswith(suffix))
        except OSError:
            return  # no copies yet
        for name in found[:REPLICA_LOGS_MAX]:
            try:
                self._log(name.removesuffix(suffix))
            except CorruptRecord as error:
                _quarantine(parent / name, error)
            except LogError as error:
                log.error("cannot open the copy in %s: %s", parent / name, error)

    def drop_state_before(self, epoch: int) -> None:
        """The queue's monitor of `epoch` holds its whole delivery state in its own, copied
        state log: the copies of older epochs' state logs kept here go."""
        for leader_id in [x for x in self.logs if 0 <= state_log_epoch(x) < epoch]:
            if leader_id in self.leaders:
                continue  # still assigned: the monitor's list is the authority
            self.logs.pop(leader_id).close()
            directory = replica_directory(self.root, self.queue, leader_id, self.own_id)
            shutil.rmtree(directory, ignore_errors=True)  # compacted: a few segments
            log.info("copies of %s's logs: deleted the copy of %s (the monitor's state log of "
                     "epoch %d holds what it held)", self.queue, leader_id, epoch)  # fmt: skip

    def ends(self) -> dict[str, int]:
        """Leader id → where this exchange's copy of its log ends (for the monitor)."""
        return {leader_id: copy.end_offset for leader_id, copy in self.logs.items()}

    def copy(self, leader_id: str) -> Log:
        """The copy of `leader_id`'s log, for reads; InvalidOffset if this exchange has none."""
        check_exchange_id(leader_id)
        if leader_id not in self.logs:
            directory = replica_directory(self.root, self.queue, leader_id, self.own_id)
            if not directory.exists():
                raise InvalidOffset(f"no copy of {leader_id}'s log here")
        return self._log(leader_id)

    def _log(self, leader_id: str) -> Log:
        copy = self.logs.get(leader_id)
        if copy is None:
            if len(self.logs) >= REPLICA_LOGS_MAX:
                raise LogError(f"already keeping {REPLICA_LOGS_MAX} replica logs")
            directory = replica_directory(self.root, self.queue, leader_id, self.own_id)
            name = f"copy of {leader_id}"
            settings = self.settings
            if is_state_log(leader_id):  # pruned as its leader compacts: segments as its own
                settings = dataclasses.replace(settings, max_file_size=limits.state_segment_bytes)
            copy = self.logs[leader_id] = Log.open(
                directory, settings, name=name, background_delete=True
            )
        return copy

    def handle(self, frames: list[bytes]) -> list[bytes]:
        """Answer one WRITE, PROBE, RESTART or PRUNE (frames without the ROUTER identity). The whole
        frame is checked before the copy is opened or changed: a bad one changes nothing."""
        kind, leader_id, offset = _decode(frames)
        if leader_id not in self.leaders:
            raise NotAssigned(
                f"{leader_id} is not a leader this exchange was assigned to copy"
                f" (assigned: {', '.join(sorted(self.leaders)) or 'none yet'})"
            )
        view = memoryview(frames[3]) if kind == WRITE else memoryview(b"")
        # Every batch, records included, before any is written (CorruptRecord: told FAILED).
        checked = list(batchfmt.iter_batches(view, validate=True))
        if kind == WRITE and not checked:
            raise ProtocolError("replication write without a batch")
        copy = self._log(leader_id)
        if kind == PROBE:
            return [WRITTEN, frames[1], OK, _END.pack(copy.end_offset)]
        if kind == RESTART:
            if offset > copy.end_offset:  # a repeated RESTART is answered, not applied twice
                copy.restart_at(offset)
            return [WRITTEN, frames[1], OK, _END.pack(copy.end_offset)]
        if kind == PRUNE:  # up to where the copy reaches: its tail may still be coming
            copy.drop_before(max(copy.start_offset, min(offset, copy.end_offset)))
            return [WRITTEN, frames[1], OK, _END.pack(copy.end_offset)]
        answer = self._write(copy, offset, view, checked)
        if answer[0] == OK and self.copied is not None and not is_state_log(leader_id):
            self.copied(view, checked)
        return [WRITTEN, frames[1], *answer]

    def _write(
        self, copy: Log, offset: int, view: memoryview, checked: list[tuple[int, BatchHeader]]
    ) -> list[bytes]:
        """Append a frame of whole batches, already checked, at `offset`."""
        if offset > copy.end_offset:
            return [BEHIND, _END.pack(copy.end_offset)]  # the leader back-fills from here
        if offset < copy.end_offset:
            if offset < copy.start_offset:
                return [BEHIND, _END.pack(copy.end_offset)]
            log.warning("%s: leader rewrote from %d (copy ended at %d): cutting back",
                        copy.name, offset, copy.end_offset)  # fmt: skip
            copy.truncate_to(offset)
        for position, header in checked:
            batch = bytearray(view[position : position + header.size])
            copy.append(batch, header, expect_offset=offset + position)
        return [OK, _END.pack(copy.end_offset)]

    def tick(self, now: float) -> None:
        for copy in self.logs.values():
            copy.tick(now)

    def close(self) -> None:
        for copy in self.logs.values():
            copy.close()


class NotAssigned(ProtocolError):
    """A replication frame from an exchange the monitor did not assign this one to copy."""


def _decode(frames: list[bytes]) -> tuple[bytes, str, int]:
    """(kind, leader id, offset: 0 for PROBE) of a replication frame, or ProtocolError."""
    kind = bytes(frames[0]) if frames else b""
    if _FRAMES.get(kind) != len(frames):
        raise ProtocolError(f"malformed replication frame of kind {kind[:4]!r}")
    leader_id = check_exchange_id(bytes(frames[1]).decode(errors="replace"))
    offset = dataplane.decode_offset(frames[2], "replication offset") if kind != PROBE else 0
    return kind, leader_id, offset


def _quarantine(directory: Path, error: Exception) -> None:
    """Set aside a copy that cannot be opened, so the exchange serves on without it (a live
    leader fills a new copy); renamed, not deleted, for an operator to look at."""
    aside = directory.with_name(f"{directory.name}{QUARANTINE_SUFFIX}-{int(time.time())}")
    try:
        directory.rename(aside)
    except OSError as rename_error:
        log.error("cannot open the copy in %s (%s) nor set it aside: %s",
                  directory, error, rename_error)  # fmt: skip
        return
    log.error("the copy in %s is corrupt (%s): quarantined as %s; serving without it",
              directory, error, aside.name)  # fmt: skip


# --- leader side ----------------------------------------------------------------------------
@dataclass
class ReplicaLink:
    replica_id: str
    endpoint: str
    sock: Any
    acked: int = -1  # the replica's end offset as it last said (-1: not known yet)
    sent_to: int = -1  # the offset the next batch sent to it starts at
    # After a restart (its copy fell behind retention) the copy lacks what lies between its old
    # end and the restart: it is out of sync until it holds the log up to here.
    resync_at: int = 0
    was_in_sync: bool = False  # as last logged
    retry_at: float = 0.0  # when to probe again after a refusal (0: no probe is due)
    refused: str = ""  # the reason of the last refusal, as logged
    linked_at: float = 0.0  # when it was assigned (monotonic)
    pruned_to: int = 0  # the leader's start as last sent in a PRUNE (`Replicator.prune`)

    def in_sync(self, lagged_end: int) -> bool:
        """`lagged_end`: the leader's log end `REPLICA_LAG_S` ago."""
        return self.acked >= max(self.resync_at, lagged_end, 0)


class Replicator:
    """Copies one leader's log to its assigned replicas. Main thread only."""

    def __init__(
        self, context: Any, leader_id: str, message_log: Log, name: str,
        lag_s: float = REPLICA_LAG_S, min_copies: int = 1, prune: bool = False,
    ):  # fmt: skip
        self.context, self.leader_id, self.log, self.name = context, leader_id, message_log, name
        self.min_copies = min_copies  # min.insync.copies, the leader included
        self.prune = prune  # copies follow the log's start (a compacted log: PRUNE)
        self._committed = 0  # what acks=all has confirmed up to: never moves back
        # as the last `committed` counted them, the leader included (min_copies until the
        # first count: a start is not a fall below the floor, and not logged as one)
        self.copies_in_sync = min_copies
        self._id = leader_id.encode()
        self.links: dict[str, ReplicaLink] = {}
        self.lag_s = lag_s
        # (time, log end) every `limits.replication_end_sample_s`, back to lag_s ago: bounded by
        # lag_s over that period
        self._ends: collections.deque[tuple[float, int]] = collections.deque()
        self._note_end(time.monotonic())
        self._started = time.monotonic()
        self.assigned = False  # the monitor has said who copies this log (see committed)

    def _note_end(self, now: float) -> None:
        if not self._ends or now - self._ends[-1][0] >= limits.replication_end_sample_s:
            self._ends.append((now, self.log.end_offset))
        while len(self._ends) > 1 and self._ends[1][0] <= now - self.lag_s:
            self._ends.popleft()  # the one left is the newest at or before now - lag_s

    def _lagged_end(self) -> int:
        """The log's end `lag_s` ago (or when this leader started, if that is later)."""
        now = time.monotonic()
        self._note_end(now)
        return self._ends[0][1]

    def assign(self, replicas: list[tuple[str, str]]) -> None:
        """Replace the replica set with [(replica id, tcp://ip:F+3)]."""
        wanted = dict(replicas)
        self.assigned = True
        for replica_id in [r for r in self.links if wanted.get(r) != self.links[r].endpoint]:
            self.links.pop(replica_id).sock.close(0)
            log.info("%s: replica %s released", self.name, replica_id)
        for replica_id, endpoint in wanted.items():
            if replica_id not in self.links:
                self._link(replica_id, endpoint)

    def _link(self, replica_id: str, endpoint: str) -> None:
        hwm = limits.replication_link_hwm
        sock = open_socket(self.context, Kind.DEALER, sndhwm=hwm, rcvhwm=hwm)
        connect(sock, endpoint)
        self.links[replica_id] = ReplicaLink(replica_id, endpoint, sock, linked_at=time.monotonic())
        self._probe(self.links[replica_id])
        log.info("%s: replicating to %s (%s)", self.name, replica_id, endpoint)

    def sockets(self) -> list[Any]:
        return [link.sock for link in self.links.values()]

    # --- sending ----------------------------------------------------------------------------
    def _probe(self, link: ReplicaLink) -> None:
        """Ask the replica where its copy ends. Sent on a link with room for
        `limits.replication_link_hwm` messages, one probe at a time: a full queue here is a
        broken link, and raises."""
        if not send_nowait(link.sock, [PROBE, self._id]):
            raise TransportError(f"{self.name}: the link to {link.replica_id} is full")

    def _room(self, link: ReplicaLink) -> bool:
        return link.sent_to - max(link.acked, 0) < REPLICATION_WINDOW_BYTES

    def _send(
        self, link: ReplicaLink, offset: int, batches: bytes | bytearray | memoryview
    ) -> bool:
        if not send_nowait(link.sock, [WRITE, self._id, _END.pack(offset), batches]):
            return False  # sent again from the log on a later turn
        link.sent_to = offset + len(batches)
        return True

    def backfill(self) -> None:
        """Send each replica what it lacks, from the log: new batches and a laggard's back-fill
        alike, `limits.replication_backfill_read_bytes` per frame, up to the replication window per
        call."""
        now = time.monotonic()
        for link in self.links.values():
            if link.retry_at and now >= link.retry_at:
                self._probe_again(link)
            while 0 <= link.sent_to < self.log.end_offset and self._room(link):
                if not self._backfill(link):
                    break
            if self.prune and link.pruned_to < self.log.start_offset <= link.acked:
                self._prune(link)

    def _backfill(self, link: ReplicaLink) -> bool:
        """One frame of whole batches from `link.sent_to`; False when nothing more can go now."""
        try:
            result = self.log.read(link.sent_to, limits.replication_backfill_read_bytes)
        except (InvalidOffset, LogError) as error:
            log.error("%s: cannot back-fill %s from %d: %s",
                      self.name, link.replica_id, link.sent_to, error)  # fmt: skip
            link.sent_to = -1  # ask it again where it stands
            self._probe(link)
            return False
        if result.status is ReadStatus.EVICTED:
            return self._restart(link, result.next_offset)
        if result.status is not ReadStatus.BATCHES:
            return False
        return self._send(link, result.offset, result.data)

    def _prune(self, link: ReplicaLink) -> None:
        """The log's start moved (compaction) and the copy holds it: the copy drops what lies
        before (sent again at the next move if the link was full)."""
        if send_nowait(link.sock, [PRUNE, self._id, _END.pack(self.log.start_offset)]):
            link.pruned_to = self.log.start_offset

    def _restart(self, link: ReplicaLink, start: int) -> bool:
        """The replica's copy ends below what retention left of this log: it cannot be filled
        in, so the replica empties its copy and goes on at this log's start."""
        if not send_nowait(link.sock, [RESTART, self._id, _END.pack(start)]):
            return False
        log.warning("%s: %s is behind retention (sent up to %d); it restarts at %d and is out "
                    "of sync until it holds the log up to %d", self.name, link.replica_id,
                    link.sent_to, start, self.log.end_offset)  # fmt: skip
        link.sent_to = start
        link.resync_at = self.log.end_offset
        return True

    # --- answers ----------------------------------------------------------------------------
    def on_answer(self, sock: Any) -> None:
        link = next((x for x in self.links.values() if x.sock is sock), None)
        if link is None:
            return  # closed since the poll (the replica set changed): reading it would raise
        for frames in drained(sock, 10_000):
            if len(frames) not in (4, 5) or frames[0] != WRITTEN:
                continue
            if frames[2] == FAILED:
                self._refused(link, bytes(frames[4]) if len(frames) == 5 else b"")
                continue
            try:
                end = dataplane.decode_offset(frames[3], "replica's end")
            except DecodeError as error:
                log.warning("%s: bad answer from %s: %s", self.name, link.replica_id, error)
                continue
            self._answered(link, frames[2], end)

    def _refused(self, link: ReplicaLink, reason: bytes) -> None:
        """The replica refused (not assigned this leader yet, a disk error): stop sending and
        ask it again later where its copy stands."""
        why = reason[:200].decode(errors="replace") or "no reason given"
        if why != link.refused:
            log.warning("%s: replica %s refused: %s; asking again every %.1f s", self.name,
                        link.replica_id, why, limits.replication_refused_retry_s)  # fmt: skip
            link.refused = why
        link.sent_to = -1
        link.retry_at = time.monotonic() + limits.replication_refused_retry_s

    def _probe_again(self, link: ReplicaLink) -> None:
        """After a refusal (the link was quiet since: its queue has room; if not, a later turn)."""
        if send_nowait(link.sock, [PROBE, self._id]):
            link.retry_at = 0.0

    def _answered(self, link: ReplicaLink, status: bytes, end: int) -> None:
        if link.refused:
            log.info("%s: replica %s accepts the copy again", self.name, link.replica_id)
            link.refused = ""
        if status == BEHIND or link.sent_to < 0:
            link.acked = link.sent_to = min(end, self.log.end_offset)
            if end > self.log.end_offset:
                link.sent_to = self.log.end_offset  # its copy is ahead: it will be cut back
        else:
            link.acked = max(link.acked, end)

    def committed(self) -> int:
        """The offset below which every in-sync replica holds the log, once at least
        `min_copies` copies are in sync (the exchange asks once per loop turn: a replica's moves
        in and out of sync are logged here)."""
        now = time.monotonic()
        if not self.assigned:
            if now - self._started < limits.acks_all_assignment_wait_s:
                return self._committed  # who copies the log is not known yet: confirm nothing
            log.warning("%s: no replica assignment from the monitor in %.0f s", self.name,
                        limits.acks_all_assignment_wait_s)  # fmt: skip
            self.assigned = True
        lagged = self._lagged_end()
        ends = []
        in_sync_count = 1
        for link in self.links.values():
            in_sync = link.in_sync(lagged)
            if in_sync != link.was_in_sync:
                self._log_sync_change(link, in_sync)
            if in_sync:
                in_sync_count += 1
                ends.append(min(link.acked, self.log.end_offset))
            elif link.acked < 0 and now - link.linked_at < self.lag_s:
                ends.append(0)  # assigned, not answered yet: wait for its first answer
        self._note_copies(in_sync_count)
        if in_sync_count >= self.min_copies:
            self._committed = max(self._committed, min(ends, default=self.log.end_offset))
        return self._committed

    def _note_copies(self, count: int) -> None:
        """Log each crossing of min.insync.copies (not each turn)."""
        below, was_below = count < self.min_copies, self.copies_in_sync < self.min_copies
        if below and not was_below:
            log.warning("%s: %d of min.insync.copies=%d copies in sync: acks=all confirms "
                        "nothing until another copy is", self.name, count,
                        self.min_copies)  # fmt: skip
        elif was_below and not below:
            log.info("%s: %d copies in sync (min.insync.copies=%d): acks=all confirms again",
                     self.name, count, self.min_copies)  # fmt: skip
        self.copies_in_sync = count

    @property
    def below_min_copies(self) -> bool:
        """Fewer copies in sync than min.insync.copies, as the last `committed` counted."""
        return self.copies_in_sync < self.min_copies

    def _log_sync_change(self, link: ReplicaLink, in_sync: bool) -> None:
        link.was_in_sync = in_sync
        if in_sync:
            log.info("%s: replica %s is in sync", self.name, link.replica_id)
        else:
            log.warning("%s: replica %s is out of sync (its copy ends at %d, the log at %d)",
                        self.name, link.replica_id,
                        link.acked, self.log.end_offset)  # fmt: skip

    @property
    def under_replicated(self) -> bool:
        lagged = self._lagged_end()
        return not self.links or not all(link.in_sync(lagged) for link in self.links.values())

    def status(self) -> list[ReplicaStatus]:
        lagged = self._lagged_end()
        return [
            ReplicaStatus(x.replica_id, x.acked, x.sent_to, x.in_sync(lagged))
            for x in self.links.values()
        ]

    def close(self) -> None:
        for link in self.links.values():
            link.sock.close(0)


# --- copying a gone exchange's log again ----------------------------------------------------
class CopySender:
    """Sends the copies this exchange holds of gone exchanges' logs to the exchanges the
    monitor names (`Sources` of REPLICAS 1030), until each gone log has replicationFactor
    copies again. The sender is a `Replicator` over the copy instead of a log this exchange
    leads: the same frames, with the gone leader's id, the same window and back-fill, so the
    target stores `<leader>@<target>` as a byte-for-byte prefix like any copy. Nothing appends
    to a gone leader's copy, so the target's copy is complete once it ends where this one
    does; the monitor sees that in the target's report and stops naming it. Main thread only."""

    def __init__(self, context: Any, store: ReplicaStore, name: str, own: Log | None = None):
        """`own`: a keeper's own log (the lost exchange's), sent like the copies it holds; an
        exchange never sends its own log this way (its replicas have it)."""
        self.context, self.store, self.name, self.own = context, store, name, own
        self.senders: dict[str, Replicator] = {}  # gone leader id → its sender
        self._told_complete: set[tuple[str, str]] = set()  # (leader, target) logged as done

    def assign(self, sources: list[tuple[str, str, str]]) -> None:
        """Replace what is sent with [(gone leader id, target id, tcp://ip:F+3)], at most
        `limits.recopy_targets_max` of them (the monitor names the rest again later)."""
        wanted: dict[str, list[tuple[str, str]]] = {}
        own_id = self.store.own_id
        for leader_id, target_id, endpoint in sources[: limits.recopy_targets_max]:
            if target_id != own_id and (leader_id != own_id or self.own is not None):
                wanted.setdefault(leader_id, []).append((target_id, endpoint))
        for leader_id in [x for x in self.senders if x not in wanted]:
            self.senders.pop(leader_id).close()
            log.info("%s: no longer sends its copy of %s's log", self.name, leader_id)
        for leader_id, targets in wanted.items():
            sender = self.senders.get(leader_id) or self._sender(leader_id)
            if sender is not None:
                sender.assign(targets)

    def _sender(self, leader_id: str) -> Replicator | None:
        try:
            copy = self.own if self.own and leader_id == self.store.own_id else None
            copy = copy or self.store.copy(leader_id)
        except (InvalidOffset, LogError) as error:
            log.warning("%s: cannot send its copy of %s's log: %s", self.name, leader_id, error)
            return None
        name = f"{self.name}: copy of {leader_id}"
        sender = self.senders[leader_id] = Replicator(self.context, leader_id, copy, name)
        return sender

    def sockets(self) -> list[Any]:
        return [sock for sender in self.senders.values() for sock in sender.sockets()]

    def on_answer(self, sock: Any) -> None:
        for sender in self.senders.values():
            if any(link.sock is sock for link in sender.links.values()):
                sender.on_answer(sock)
                return

    def backfill(self) -> None:
        for leader_id, sender in self.senders.items():
            sender.backfill()
            for link in sender.links.values():
                done = (leader_id, link.replica_id)
                if link.acked >= sender.log.end_offset and done not in self._told_complete:
                    self._told_complete.add(done)
                    log.info("%s: %s holds the whole copy of %s's log (%d bytes)",
                             self.name, link.replica_id, leader_id, link.acked)  # fmt: skip
        # only the links still there: bounded by them
        self._told_complete &= {(x, r) for x, s in self.senders.items() for r in s.links}

    def close(self) -> None:
        for sender in self.senders.values():
            sender.close()
