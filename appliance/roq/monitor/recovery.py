"""Where a monitor placed under a new epoch finds its predecessors' state (docs/architecture.md
§12, "Recovery"): the copies of older state logs that exchanges report, and this host's own
older state logs, best first; and the reading of one into this epoch's log.

A source is complete only if it holds its log's own *origin* record (`ORIGIN_KEY`, naming that
log): every state log writes it first when it starts empty, or right after the snapshot it was
restored from (which carries its source's origin, naming the source). Copies are whole prefixes
of their log (replication appends by offset), so a copy with its own origin has the whole
snapshot before it; one without is the copy of a monitor that died while restoring, and the
next older source is read instead.

The read runs in a thread of its own (`CopyRead`), with its own socket: a copy may be long
(copies are not compacted yet) and the monitor's loop answers placements meanwhile. The thread
hands over the state log it built once it is done; the main thread takes it.
"""

from __future__ import annotations

import logging
import shutil
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bson

from roq import limits
from roq.errors import RoqError
from roq.log import Log, LogSettings, ReadStatus
from roq.log.statelog import StateLog, restore
from roq.protocol import dataplane
from roq.protocol.names import state_log_epoch
from roq.transport import Kind, connect, open_socket, recv_nowait, send_nowait, wait_readable

log = logging.getLogger(__name__)

ORIGIN_KEY = "_origin"  # {"log": the log's own leader id, "from": what it was restored from}


def origin_record(leader_id: str, source: str) -> bytes:
    return bson.encode({"log": leader_id, "from": source})


def is_complete(state: StateLog, leader_id: str) -> bool:
    """Whether `state`, read from a copy of `leader_id`'s log, holds that log's own origin
    record: a restored log's snapshot carries its source's origin, and its own comes after."""
    found = state.get(ORIGIN_KEY)
    try:
        return found is not None and bson.decode(found[0]).get("log") == leader_id
    except Exception:
        return False


@dataclass(frozen=True)
class Source:
    """An older state log: an exchange's copy (`endpoint` its log port) or this host's own
    (`endpoint` "", `directory` set)."""

    leader_id: str
    end: int
    holder: str  # the exchange holding the copy, or "local"
    endpoint: str = ""
    directory: Path | None = None

    @property
    def epoch(self) -> int:
        return state_log_epoch(self.leader_id)


def best_first(sources: list[Source], below: int) -> list[Source]:
    """The sources of epochs below `below`: the newest epoch first, the longest copy first."""
    older = [s for s in sources if 0 <= s.epoch < below]
    return sorted(older, key=lambda s: (-s.epoch, -s.end, s.holder))


def local_sources(root: Path, own: str) -> list[Source]:
    """This host's older state logs of the queue (a monitor re-placed on the same host)."""
    if not root.is_dir():
        return []
    found = []
    for path in root.iterdir():
        if path.is_dir() and path.name != own and state_log_epoch(path.name) >= 0:
            found.append(Source(path.name, _size(path), "local", directory=path))
    return found


def _size(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.iterdir() if p.is_file())


class RecoveryFailed(RoqError):
    """A source could not be read whole (gone, refused, timed out, or not complete)."""


class CopyRead(threading.Thread):
    """Reads one source and restores it into `directory`; `result` or `error` when done."""

    def __init__(self, context: Any, source: Source, directory: Path, settings: LogSettings,
                 producer_id: bytes, name: str):  # fmt: skip
        super().__init__(name=f"state-recovery-{source.leader_id}", daemon=True)
        self.context, self.source, self.directory = context, source, directory
        self.settings, self.producer_id, self.label = settings, producer_id, name
        self.result: StateLog | None = None
        self.error: Exception | None = None

    def run(self) -> None:
        try:
            chunks = self._local() if self.source.directory else self._remote()
            restored = restore(self.directory, self.settings, self.producer_id, chunks,
                               name=self.label)  # fmt: skip
            if not is_complete(restored, self.source.leader_id):
                restored.log.close()
                _discard(self.directory)
                raise RecoveryFailed(f"{self.source.leader_id} on {self.source.holder}: no "
                                     "origin record of its own (its monitor died while "
                                     "restoring)")  # fmt: skip
            self.result = restored
        except Exception as error:
            self.error = error

    def _local(self) -> Iterator[bytes]:
        assert self.source.directory is not None
        old = Log.open(self.source.directory, self.settings, name=f"old {self.source.leader_id}")
        try:
            offset = old.start_offset
            while offset < old.end_offset:
                result = old.read(offset, dataplane.READ_BYTES_MAX)
                if result.status is not ReadStatus.BATCHES:
                    break
                yield result.data
                offset = result.next_offset
        finally:
            old.close()

    def _remote(self) -> Iterator[bytes]:
        sock = open_socket(self.context, Kind.DEALER)
        connect(sock, self.source.endpoint)
        try:
            offset = 0
            for _ in range(limits.state_recovery_reads_max):
                reply = self._ask(sock, offset)
                if reply.status == dataplane.READ_EVICTED:
                    offset = reply.next_offset  # the copy starts later (a restart): read on
                    continue
                if reply.status != dataplane.READ_BATCHES:
                    return  # at its end (or nothing at all)
                yield reply.data
                offset = reply.next_offset
            raise RecoveryFailed(f"{self.source.leader_id}: more than "
                                 f"{limits.state_recovery_reads_max} reads")  # fmt: skip
        finally:
            sock.close(0)

    def _ask(self, sock: Any, offset: int) -> dataplane.ReadReply:
        request = dataplane.read_request(offset, dataplane.READ_BYTES_MAX, self.source.leader_id)
        if not send_nowait(sock, request) or not wait_readable(
            sock, limits.state_recovery_read_timeout_ms
        ):
            raise RecoveryFailed(f"{self.source.holder} did not answer a read of "
                                 f"{self.source.leader_id} at {offset}")  # fmt: skip
        frames = recv_nowait(sock) or []
        reply = dataplane.parse_read_reply(frames)
        if reply.status == dataplane.READ_ERROR:
            raise RecoveryFailed(
                f"{self.source.holder}: {reply.data[:200].decode(errors='replace')}"
            )
        return reply


def _discard(directory: Path) -> None:
    shutil.rmtree(directory, ignore_errors=True)
