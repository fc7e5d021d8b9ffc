"""Fencing: a host's lease on its children's right to act (docs/guarantees.md §10).

Exchanges have no ZooKeeper session, and a monitor's (its consumer groups' and tasks') holds no
ephemeral znode: their host's session is what the GCM watches, and once it has been gone for
zk.session.timeout + host.loss.grace the GCM re-places their work. So the host grants them a
lease, renewed only while its session is alive and its assignments are checked
(host/fencing.py), and a child whose lease ran out stops acting at its next loop pass: a
monitor places no one and sends no notice, an exchange appends and acknowledges nothing.
Reading logs stays allowed.

The lease is one small file per host holding `lease_until`, a CLOCK_MONOTONIC time: that
clock is one for the whole machine, and keeps running while a process is stopped (SIGSTOP),
so a child woken after a long stop sees at once that the lease is old. Its writer is a host
thread, its readers read 16 bytes (one pread) per loop pass: no socket, no dependence on the
host's main loop. The time is written twice in one write; a read that finds the two halves
different (a write in progress) keeps the previous value.

A child whose lease ended `limits.child_fenced_exit_sessions` session timeouts ago, not renewed
since, exits with EXIT_FENCED (`Fence.given_up`): its host's session went that long without an
answered renewal, so its work may run elsewhere, and a host that never comes back (stopped, cut
off, its process gone while its children lived on) must not leave it running, fenced, for good.
Its host does not restart it in place: once the lease is renewed, it starts it again only if
ZooKeeper still assigns it there (host/service.py).
"""

from __future__ import annotations

import logging
import os
import struct
from pathlib import Path

from roq import limits

log = logging.getLogger(__name__)

_FORMAT = struct.Struct("<dd")  # lease_until, twice: a torn read shows two different values


class LeaseWriter:
    """The host's side: writes `lease_until` into `path` (created, expired, at once)."""

    def __init__(self, path: Path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self._fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
        self.until = 0.0
        self.grant(0.0)

    def grant(self, until: float) -> None:
        """Let the children act until the monotonic time `until` (0.0: revoke)."""
        os.pwrite(self._fd, _FORMAT.pack(until, until), 0)
        self.until = until

    def close(self) -> None:
        os.close(self._fd)


class LeaseReader:
    """A child's side. A missing or unreadable file is an expired lease: the host writes it
    before it starts a child."""

    def __init__(self, path: str):
        self.path = path
        self._fd: int | None = None
        self.until = 0.0

    def read(self) -> float:
        """`lease_until` as the file says now (the last good value if it cannot be read)."""
        try:
            if self._fd is None:
                self._fd = os.open(self.path, os.O_RDONLY)
            data = os.pread(self._fd, _FORMAT.size, 0)
        except OSError:
            return self.until
        if len(data) == _FORMAT.size:
            first, second = _FORMAT.unpack(data)
            if first == second:
                self.until = first
        return self.until

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def fenced_exit_s(session_timeout_ms: int) -> float:
    """How long after its lease ended a child not renewed since exits (limits.py)."""
    return session_timeout_ms / 1000 * limits.child_fenced_exit_sessions


class Fence:
    """Whether a child may act, checked once per loop pass (`acting`); logs each change once
    at WARNING. Without a lease path (a child run by hand, outside a host) it always acts.
    `exit_after_s` (0: never): how long past the lease's end `given_up` says to exit."""

    def __init__(self, path: str, name: str, exit_after_s: float = 0.0):
        self.name = name
        self.exit_after_s = exit_after_s
        self._reader = LeaseReader(path) if path else None
        self.fenced = False
        self.fenced_at = 0.0  # monotonic time this child noticed its lease had run out
        self.times_fenced = 0

    def acting(self, now: float) -> bool:
        if self._reader is None:
            return True
        expired = now >= self._reader.read()
        if expired != self.fenced:
            self.fenced = expired
            if expired:
                self.fenced_at = now
                self.times_fenced += 1
                log.warning(
                    "%s: fenced: its host's lease ran out (the host lost ZooKeeper or stopped); "
                    "acting on nothing until it is renewed",
                    self.name,
                )
            else:
                log.warning("%s: lease renewed after %.1f s fenced; acting again",
                            self.name, now - self.fenced_at)  # fmt: skip
        return not expired

    def given_up(self, now: float) -> bool:
        """Fenced and its lease ended `exit_after_s` ago or more (read by this pass's
        `acting`): the child exits, EXIT_FENCED. Logged at WARNING."""
        if self._reader is None or self.exit_after_s <= 0 or not self.fenced:
            return False
        if now - self._reader.until < self.exit_after_s:
            return False
        log.warning("%s: its lease ended %.1f s ago and was not renewed: exiting (its host starts "
                    "it again if ZooKeeper still assigns it there)", self.name,
                    now - self._reader.until)  # fmt: skip
        return True

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
