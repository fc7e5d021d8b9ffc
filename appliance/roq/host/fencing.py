"""The host's side of fencing: it renews its children's lease (system/lease.py) while its
ZooKeeper session is alive and confirmed.

"Confirmed" is the session on which the host's assignments were last checked: the first one
(whose registration and adoption started only what ZooKeeper assigns to this host), then,
after an expiry, the new one once the host registered again and stopped what was re-placed
meanwhile (`confirm`, from the main loop). Until then the new session renews nothing, or it
would renew the lease of children whose work moved.

Each renewal is a ZooKeeper request on the confirmed session; the lease runs from the moment
the request was *sent*. An answer proves the session was alive at some time after that
moment, so ZooKeeper cannot expire it before `sent + zk.session.timeout`, and the GCM re-places
nothing of this host before `sent + zk.session.timeout + host.loss.grace`. The lease,
`sent + lease`, with the lease shorter than the session, ends before that
(docs/guarantees.md §10 states the bound and its assumptions). A stopped host (SIGSTOP) renews
nothing; woken, its first request on an expired session is refused, so a stale kazoo state
cannot renew. The renewal runs in its own thread so that a slow main loop does not fence
healthy children.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path
from typing import Any

from roq import limits
from roq.coordination import session
from roq.errors import RoqError
from roq.system.lease import LeaseWriter

log = logging.getLogger(__name__)


def lease_path(log_root: str, host: str) -> Path:
    """The host's lease file, beside the logs (one directory per machine and host name)."""
    return Path(log_root) / f".host-{host.replace('/', '_')}.lease"


def lease_seconds(session_timeout_ms: int) -> float:
    """The children's lease: a fixed share of the session timeout (limits.py)."""
    return session_timeout_ms / 1000 * limits.host_lease_session_share


class LeaseKeeper(threading.Thread):
    """Renews the lease every lease / limits.host_lease_renewals while the session answers."""

    def __init__(self, zk: Any, path: Path, lease_s: float, name: str):
        super().__init__(name="roq-lease", daemon=True)
        self._zk = zk
        self.lease_s = lease_s
        self.host = name
        self._path = path
        # Opened at the first `confirm`, once this host owns its name: a second host started
        # under a live name (it exits 75) must not revoke the live one's lease.
        self.writer: LeaseWriter | None = None
        self._confirmed: int | None = None  # a session id (an int: atomic between threads)
        self._stop_event = threading.Event()
        self._lock = threading.Lock()  # one renewal at a time: `confirm`'s and the thread's

    @property
    def path(self) -> Path:
        return self._path

    def confirm(self) -> bool:
        """The main loop checked the assignments on the current session: renew on it from now
        on, starting with a renewal at once (children started next are not fenced)."""
        if self.writer is None:
            self.writer = LeaseWriter(self._path)
        self._confirmed = session.session_id(self._zk)
        return self.renew()

    def valid(self, now: float) -> bool:
        """Whether the children's lease runs at monotonic time `now` (renewed on time)."""
        writer = self.writer
        return writer is not None and writer.until > now

    def suspend(self) -> None:
        """The session expired (kazoo's thread): renew nothing until `confirm` again."""
        self._confirmed = None

    def renew(self) -> bool:
        confirmed, writer = self._confirmed, self.writer
        if confirmed is None or writer is None:
            return False
        with self._lock:
            sent = time.monotonic()
            # Longer than the period: the lease counts from `sent`, so a slow answer still
            # renews (a little less), and a ZooKeeper slow for a moment fences nothing.
            timeout_s = self.lease_s / 2
            if not session.answered_on(self._zk, confirmed, timeout_s):
                return False
            if self._confirmed != confirmed:
                return False  # suspended while the request was out
            writer.grant(max(writer.until, sent + self.lease_s))
        return True

    def run(self) -> None:
        period_s = self.lease_s / limits.host_lease_renewals
        while not self._stop_event.wait(period_s):
            try:
                self.renew()
            except (RoqError, OSError) as error:  # the next period tries again
                log.warning("host %s: lease renewal failed: %s", self.host, error)

    def stop(self) -> None:
        """Stop renewing; the lease is revoked so the children still running stop acting."""
        self._stop_event.set()
        if self.is_alive():
            self.join(self.lease_s)
        with self._lock:
            if self.writer is not None:  # never confirmed: the lease file is not ours
                self.writer.grant(0.0)
                self.writer.close()
