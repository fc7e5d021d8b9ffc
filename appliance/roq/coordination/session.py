"""A ZooKeeper session with bounded retries (kazoo's default back-off grows to an hour)."""

from __future__ import annotations

import logging
import os
import socket
import ssl
import threading
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient, KazooState
from kazoo.exceptions import KazooException, NoAuthError
from kazoo.handlers import utils
from kazoo.handlers.threading import KazooTimeoutError, SequentialThreadingHandler
from kazoo.retry import KazooRetry
from kazoo.security import Permissions, make_digest_acl

from roq import limits
from roq.coordination.paths import Paths
from roq.errors import CoordinationError, SecurityError
from roq.protocol.zktls import ZkTls

log = logging.getLogger(__name__)


class ZooKeeperTimeout(KazooTimeoutError, KazooException):  # type: ignore[misc]
    """ZooKeeper did not answer a request within limits.zk_request_timeout_s. A KazooException,
    so every caller that handles ZooKeeper failures handles this one too; not a ConnectionLoss,
    so kazoo's retry does not multiply the wait."""


class SecurityRefused(SecurityError, CoordinationError):
    """ZooKeeper refused roq's credential for the cluster's namespace."""


class _BoundedResult(utils.AsyncResult):  # type: ignore[misc]
    """kazoo queues a request while the connection is down and, without a timeout, waits for an
    answer until the server comes back: forever if it never does. That hung `roq host` on
    SIGTERM after its ZooKeeper died. Every blocking wait here has the bound instead."""

    def __init__(self, handler: Any):
        super().__init__(handler, threading.Condition, ZooKeeperTimeout)

    def get(self, block: bool = True, timeout: float | None = None) -> Any:
        if block and timeout is None:
            timeout = limits.zk_request_timeout_s
        return super().get(block, timeout)


class _BoundedHandler(SequentialThreadingHandler):  # type: ignore[misc]
    def __init__(self, tls: ssl.SSLContext | None = None) -> None:
        super().__init__()
        self._tls = tls

    def async_result(self) -> _BoundedResult:
        return _BoundedResult(self)

    def create_connection(self, *args: Any, **kwargs: Any) -> Any:
        """With TLS, a connection through the cluster's context (`tls_context`), never kazoo's:
        kazoo's own also trusts every CA of the system, so any publicly issued certificate
        would pass for ZooKeeper's and receive the digest credential."""
        if self._tls is None:
            return super().create_connection(*args, **kwargs)
        raw = socket.create_connection(kwargs["address"], kwargs.get("timeout"))
        try:
            connection = self._tls.wrap_socket(raw)  # the handshake, within the same timeout
        except BaseException:
            raw.close()
            raise
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection


# --- ZooKeeper's TLS (docs/security.md §4) -------------------------------------------------------
def tls_context(tls: ZkTls) -> ssl.SSLContext:
    """A client context that trusts the cluster's CA alone (no system CA), checks no host name
    (no certificate names one: transport/certificates.py) and presents `tls`'s certificate."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)  # CERT_REQUIRED
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = False
    context.load_verify_locations(cadata=tls.ca)
    # load_cert_chain reads files only: the key goes through an anonymous memory file, so a
    # client never writes it to disk
    memory = os.memfd_create("roq-zk-tls", os.MFD_CLOEXEC)
    try:
        data = (tls.key + tls.cert).encode("ascii")
        while data:
            data = data[os.write(memory, data) :]
        context.load_cert_chain(f"/proc/self/fd/{memory}")
    except (OSError, ValueError) as error:
        raise SecurityError(f"the credentials' ZooKeeper TLS certificate or key: {error}") from None
    finally:
        os.close(memory)
    return context


def digest_acl(auth: str) -> list[Any]:
    """The ACL of every znode roq creates under a secured namespace: all rights to the holder of
    the cluster's digest credential ("user:password"), none to anyone else."""
    user, _, password = auth.partition(":")
    return [make_digest_acl(user, password, all=True)]


def connect(
    servers: str,
    session_timeout_ms: int,
    *,
    connect_timeout_s: float = limits.zk_connect_timeout_s,
    on_state: Callable[[str], None] | None = None,
    auth: str | None = None,
    tls: ZkTls | None = None,
) -> Any:
    """A started KazooClient, or CoordinationError naming the servers within the bound.

    With `auth` ("user:password", the cluster's digest credential: docs/security.md) the session
    authenticates, and kazoo sends the credential again on every reconnection, a new session's
    too; every znode it creates carries `digest_acl(auth)`. Without it the session is anonymous:
    it can still create open znodes, and cannot read a secured cluster's. With `tls` every
    connection is TLS (`tls_context`): the credential and the znodes never cross in clear."""
    client = KazooClient(
        hosts=servers,
        handler=_BoundedHandler(tls_context(tls) if tls is not None else None),
        use_ssl=tls is not None,  # what kazoo logs; the connection is the handler's
        auth_data=[("digest", auth)] if auth else None,
        default_acl=digest_acl(auth) if auth else None,
        timeout=session_timeout_ms / 1000.0,
        connection_retry=KazooRetry(max_tries=-1, max_delay=limits.zk_reconnect_delay_max_s),
        command_retry=KazooRetry(
            max_tries=limits.zk_command_retries_max, max_delay=limits.zk_reconnect_delay_max_s
        ),
    )
    if on_state is not None:
        client.add_listener(lambda state: on_state(_state_name(state)))
    try:
        client.start(timeout=connect_timeout_s)
    except (KazooTimeoutError, KazooException, OSError) as error:
        client.stop()
        client.close()
        over = " over TLS (without TLS: zk.tls=false, ROQ_ZK_TLS=off for clients)" if tls else ""
        raise CoordinationError(
            f"cannot reach ZooKeeper at {servers}{over} within {connect_timeout_s:.0f} s ({error})"
        ) from None
    return client


class SharedSession:
    """A process's one ZooKeeper session, shared by every part of it that talks to ZooKeeper (a
    monitor's group store, task store and scaling actuator): one connection and one session per
    process, whatever the number of users. Opened at its first use, not at start-up, so a
    process that cannot reach ZooKeeper yet still starts: its users get CoordinationError and
    try again later. Once open, kazoo keeps it: it reconnects after a lost connection, and
    after an expiry it opens a new session, which nothing here has to notice (the users hold
    no ephemeral znode and no watch; their writes are fenced by znode versions, and a monitor
    by its host's lease, system/lease.py). A KazooClient is thread-safe, so users on several
    threads share it; the lock only makes the first use connect once."""

    def __init__(
        self,
        servers: str,
        session_timeout_ms: int,
        auth: str | None = None,
        tls: ZkTls | None = None,
    ):
        self._servers, self._timeout_ms, self._auth = servers, session_timeout_ms, auth
        self._tls = tls
        self._lock = threading.Lock()
        self._client: Any = None
        self._closed = False
        self._attempts = 0
        self._failure = ""

    def client(self) -> Any:
        """The started KazooClient; CoordinationError when ZooKeeper does not answer within
        limits.zk_connect_timeout_s (the next call tries again), or once closed. A call that
        waited for another thread's attempt to connect gets that attempt's failure, not a wait
        of its own: no caller waits for more than one attempt."""
        attempts = self._attempts  # attempts ended
        with self._lock:
            if self._closed:
                raise CoordinationError("the process's ZooKeeper session is closed")
            if self._client is None:
                if self._attempts != attempts:
                    raise CoordinationError(self._failure)
                try:
                    self._client = connect(
                        self._servers, self._timeout_ms, auth=self._auth, tls=self._tls
                    )
                except CoordinationError as error:
                    self._failure = str(error)
                    raise
                finally:
                    self._attempts += 1
            return self._client

    def close(self) -> None:
        """Close the session (once its users are done); a later `client()` is refused."""
        with self._lock:
            client, self._client, self._closed = self._client, None, True
        if client is not None:
            close(client)


class QueueStore:
    """A queue's znodes under one root (its groups, its tasks), written by the queue's monitor
    through its process's session. Owned by the monitor's main thread (kazoo's own threads
    aside); the session is the monitor's, which the monitor closes."""

    def __init__(self, zk: SharedSession, paths: Paths, queue: str, root: str):
        self.paths, self.queue, self.root = paths, queue, root
        self._session = zk
        self._rooted = False

    def _zk(self) -> Any:
        return self._session.client()

    def _transaction(self) -> Any:
        """A multi, its root made first, once (a round trip of its own: a multi's create does
        not make its parents)."""
        zk = self._zk()
        if not self._rooted:
            zk.ensure_path(self.root)
            self._rooted = True
        return zk.transaction()


def secure_namespace(client: Any, paths: Paths, auth: str | None) -> None:
    """Make the namespace and its first level carry the cluster's ACL: they may predate security
    (a cluster upgraded, or run with security=off once). Znodes below are created with it."""
    if not auth:
        return
    namespace = paths.namespace
    acl = digest_acl(auth)
    try:
        client.ensure_path(namespace)
        for path in [namespace] + [paths.top(c) for c in client.get_children(namespace)]:
            if client.get_acls(path)[0] != acl:
                client.set_acls(path, acl)
    except NoAuthError:
        raise SecurityRefused(
            f"ZooKeeper refuses this node's credential for {namespace}: its cluster.json is not "
            "the cluster's (copy the cluster.json of a node already in it)"
        ) from None
    except KazooException as error:
        raise CoordinationError(f"cannot secure {namespace} in ZooKeeper: {error}") from None


# --- a ZooKeeper closed to anonymous clients (zk.close.root; docs/security.md §4) -------------
# ZooKeeper's root and its own /zookeeper (where quotas are written) are open to every client by
# default: one without any credential created znodes there until the server ran out of memory.
CLOSED_ROOTS = ("/", "/zookeeper", "/zookeeper/quota")


def close_root(client: Any, auth: str | None) -> list[str]:
    """Give CLOSED_ROOTS the cluster's ACL, for a ZooKeeper that serves this cluster alone: then
    only the holder of its credential creates znodes at the root (a namespace, another
    cluster's included). Each is changed only while anyone may still create under it
    (ZooKeeper's default), so an operator's own ACL stays. Returns the paths changed."""
    if not auth:
        log.warning("zk.close.root: nothing closed with security off (no credential)")
        return []
    acl, changed = digest_acl(auth), []
    try:
        for path in CLOSED_ROOTS:
            if client.exists(path) and _open_to_anyone(client.get_acls(path)[0]):
                client.set_acls(path, acl)
                changed.append(path)
    except NoAuthError:
        raise SecurityRefused(
            f"ZooKeeper refuses this node's credential for {path}: its root was closed by "
            "another cluster's credential (zk.close.root on a ZooKeeper this cluster does not own?)"
        ) from None
    except KazooException as error:
        raise CoordinationError(f"cannot close ZooKeeper's root: {error}") from None
    if changed:
        log.warning("ZooKeeper: %s closed to every client without this cluster's credential",
                    ", ".join(changed))  # fmt: skip
    return changed


def _open_to_anyone(acls: list[Any]) -> bool:
    return any(a.id.scheme == "world" and a.perms & Permissions.CREATE for a in acls)


def _state_name(state: Any) -> str:
    if state == KazooState.LOST:
        return "LOST"
    if state == KazooState.SUSPENDED:
        return "SUSPENDED"
    return "CONNECTED"


def responds(client: Any, timeout_s: float = limits.zk_probe_timeout_s) -> bool:
    """Whether ZooKeeper answers a request within `timeout_s`. A shutdown asks this first: its
    SIGTERM often comes with the server's death (`roq up` killed), before kazoo has noticed the
    dropped connection, and each cleanup request would then wait its full bound."""
    if not client.connected:
        return False
    try:
        client.exists_async("/").get(timeout=timeout_s)
    except (KazooTimeoutError, KazooException):
        return False
    return True


def session_id(client: Any) -> int | None:
    """The id of the client's current session; None while it has none. A new session (the old
    one expired) has a new id."""
    found = client.client_id
    return None if found is None else int(found[0])


def answered_on(client: Any, session: int, timeout_s: float = limits.zk_probe_timeout_s) -> bool:
    """Whether ZooKeeper answers a request on `session` (the current one, not a successor)
    within `timeout_s`. An expired session gets no answer, so a True proves the session was
    alive after the request was sent: the server cannot expire it earlier than a session
    timeout after that (host/fencing.py builds the lease on it)."""
    if session_id(client) != session or not responds(client, timeout_s):
        return False
    return session_id(client) == session


def close(client: Any) -> None:
    """Close the session, waiting at most `limits.zk_close_timeout_s`. kazoo's stop joins its
    worker thread without a bound, and with ZooKeeper gone that thread may sit in a watch's
    read for `zk_request_timeout_s`, and then waits for its connection thread: a GCM killed with
    its ZooKeeper (`roq up` killed) took over 15 s to exit. Past the bound the stop goes on in
    a daemon thread, which the process's exit ends; a reachable ZooKeeper closes in
    milliseconds, so its ephemeral znodes still go at once."""
    done = threading.Event()

    def stop() -> None:
        try:
            client.stop()
            client.close()
        except KazooException as error:  # closing must never mask the reason we are closing
            log.warning("closing the ZooKeeper session failed: %s", error)
        finally:
            done.set()

    threading.Thread(target=stop, name="roq-zk-close", daemon=True).start()
    if not done.wait(limits.zk_close_timeout_s):
        log.warning("the ZooKeeper session did not close within %.0f s (ZooKeeper unreachable?): "
                    "left to end with the process", limits.zk_close_timeout_s)  # fmt: skip
