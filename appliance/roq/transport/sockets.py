"""ZeroMQ sockets with every option explicit (style R7).

A socket belongs to the thread that created it; nothing here is thread-safe except `Context`.

Callers use roq names only: `READABLE` to register a socket in a `Poller`, `send_nowait`,
`recv_nowait`, `drained` and `wait_readable` instead of pyzmq's flags, and from those they see
`TransportError` instead of `zmq.ZMQError` (a full queue is a return value, not an exception).
Sockets' own blocking `send_multipart`/`recv_multipart` stay in use where a caller wants them, and
raise pyzmq's errors untranslated.
"""

from __future__ import annotations

import enum
import errno
from collections.abc import Iterator, Sequence
from typing import Any

import zmq
from zmq.utils.monitor import parse_monitor_message

from roq import limits
from roq.errors import PortInUse, TransportError
from roq.transport import security

Socket = zmq.Socket
Context = zmq.Context
Poller = zmq.Poller
READABLE = zmq.POLLIN  # Poller.register(sock, READABLE); the event a poll reports
WRITABLE = zmq.POLLOUT


class Kind(enum.IntEnum):
    REQ = zmq.REQ
    REP = zmq.REP
    PUB = zmq.PUB
    SUB = zmq.SUB
    XPUB = zmq.XPUB
    XSUB = zmq.XSUB
    PUSH = zmq.PUSH
    PULL = zmq.PULL
    DEALER = zmq.DEALER
    ROUTER = zmq.ROUTER
    PAIR = zmq.PAIR


def open_socket(
    context: Any,
    kind: Kind,
    *,
    sndhwm: int = limits.control_hwm_messages,
    rcvhwm: int = limits.control_hwm_messages,
    linger_ms: int = limits.socket_linger_ms,
    rcvtimeo_ms: int = -1,
    sndtimeo_ms: int = -1,
    subscribe: bytes | None = None,
    max_msg_bytes: int = limits.frame_bytes_max,
) -> Any:
    """A socket with its bounds set. `max_msg_bytes` makes ZeroMQ drop a peer that sends a
    frame larger than we would ever accept, before we allocate for it; the handshake bound
    drops a peer that never finishes the (CURVE) handshake. `bind` and `connect` add CURVE."""
    sock = context.socket(int(kind))
    sock.setsockopt(zmq.SNDHWM, sndhwm)
    sock.setsockopt(zmq.RCVHWM, rcvhwm)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.RCVTIMEO, rcvtimeo_ms)
    sock.setsockopt(zmq.SNDTIMEO, sndtimeo_ms)
    sock.setsockopt(zmq.MAXMSGSIZE, max_msg_bytes)
    sock.setsockopt(zmq.HANDSHAKE_IVL, limits.handshake_timeout_ms)
    if kind is Kind.SUB:
        sock.setsockopt(zmq.SUBSCRIBE, b"" if subscribe is None else subscribe)
    if kind is Kind.XPUB:
        # Every subscribe and unsubscribe (a closed connection's too) reaches the owner, not
        # only a topic's first and last: the owner can count its subscriptions.
        sock.setsockopt(zmq.XPUB_VERBOSER, 1)
    return sock


def bind(sock: Any, host: str, port: int, access: str = security.ZAP_DOMAIN) -> str:
    """Bind to tcp://host:port; a taken port raises PortInUse naming it. `access` says who may
    connect (`security.access_domain`): by default any principal of the cluster."""
    endpoint = f"tcp://{host}:{port}"
    security.secure_server(sock, endpoint, access)
    try:
        sock.bind(endpoint)
    except zmq.ZMQError as error:
        if error.errno == errno.EADDRINUSE:
            raise PortInUse(f"port {port} on {host} is already in use") from None
        raise TransportError(f"cannot bind {endpoint}: {error}") from None
    return endpoint


def drained(sock: Any, most: int, copy: bool = True) -> Iterator[list[Any]]:
    """The multipart messages waiting on `sock`, at most `most`, without blocking.

    After the first it asks whether another waits rather than ending on a receive that finds
    nothing: pyzmq raises there, ~20 µs against ~10 µs for asking, and a loop that wakes for one
    message (every hop, at low rates) paid it each time (docs/benchmarks.md §2)."""
    for turn in range(most):
        if turn == 1 and not sock.getsockopt(zmq.EVENTS) & zmq.POLLIN:
            return
        try:
            frames = sock.recv_multipart(zmq.NOBLOCK, copy=copy)
        except zmq.Again:
            return
        except zmq.ZMQError as error:
            raise TransportError(f"receive failed: {error}") from None
        yield frames


def recv_nowait(sock: Any) -> list[bytes] | None:
    """The next multipart message waiting on `sock`, or None when none waits."""
    try:
        frames: list[bytes] = sock.recv_multipart(zmq.NOBLOCK)
    except zmq.Again:
        return None
    except zmq.ZMQError as error:
        raise TransportError(f"receive failed: {error}") from None
    return frames


def send_nowait(sock: Any, frames: Sequence[Any], copy: bool = True) -> bool:
    """Queue one multipart message without blocking. False when the socket's queue is at its
    high-water mark (nothing was queued: the caller decides whether that loses the message).

    The publisher's I/O thread and replication send each batch through here: one call per
    batch, and the `try` costs nothing unless ZeroMQ raises. One frame goes by `send`: pyzmq's
    `send_multipart` costs ~0.6 µs more, and the publisher's wake-up is one empty frame."""
    try:
        if len(frames) == 1:
            sock.send(frames[0], zmq.NOBLOCK, copy=copy)
        else:
            sock.send_multipart(frames, zmq.NOBLOCK, copy=copy)
    except zmq.Again:
        return False
    except zmq.ZMQError as error:
        raise TransportError(f"send failed: {error}") from None
    return True


def copying_send_pays(sock: Any) -> bool:
    """Whether large frames should be sent copying (copy=True) on `sock`, asked once it is bound
    or connected. Yes on a CURVE socket: libzmq encrypts every frame into a buffer of its own, so
    a zero-copy send (copy=False) saves no copy there, and still pays for handing the frame back
    through pyzmq's collector thread, which takes the GIL; copying cost ~10 % less CPU per 64 KiB
    frame (docs/benchmarks.md §1e, "Where CurveZMQ's cost goes"). Without CURVE, libzmq writes
    a zero-copy frame to TCP from the caller's buffer, and the zero-copy send stays."""
    return bool(sock.getsockopt(zmq.MECHANISM) == zmq.CURVE)


def wait_readable(sock: Any, timeout_ms: int) -> bool:
    """Whether a message waits on `sock` within `timeout_ms` (it is left there)."""
    try:
        return bool(sock.poll(timeout_ms, zmq.POLLIN))
    except zmq.ZMQError as error:
        raise TransportError(f"poll failed: {error}") from None


def subscribe(sock: Any, prefix: bytes) -> None:
    """Add a prefix filter to a SUB socket (one socket may have several)."""
    sock.setsockopt(zmq.SUBSCRIBE, prefix)


def unsubscribe(sock: Any, prefix: bytes) -> None:
    sock.setsockopt(zmq.UNSUBSCRIBE, prefix)


def disconnect(sock: Any, endpoint: str) -> None:
    """Drop a connection; a peer that was never connected is not an error."""
    try:
        sock.disconnect(endpoint)
    except zmq.ZMQError:
        pass


def connect(sock: Any, endpoint: str) -> None:
    security.secure_client(sock, endpoint)
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as error:
        raise TransportError(f"cannot connect to {endpoint}: {error}") from None


class ConnectionWatch:
    """Whether a connecting socket's connection to its one peer is up, from the socket's own
    events, read without blocking (docs/guarantees.md §3, "Late is not dead"). A peer process
    that dies, kill -9 included, has its connections closed by its kernel: `up()` turns False
    within a round trip. One that is alive, however starved of CPU, or frozen, keeps them up."""

    def __init__(self, sock: Any) -> None:
        self._sock = sock
        self._events = sock.get_monitor_socket(zmq.EVENT_CONNECTED | zmq.EVENT_DISCONNECTED)
        self._up = False

    def up(self) -> bool:
        """The state after every event so far: connected and not dropped since."""
        while self._events.poll(0):
            event = parse_monitor_message(self._events.recv_multipart())
            self._up = event["event"] == zmq.EVENT_CONNECTED
        return self._up

    def close(self) -> None:
        """Before the socket closes."""
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass  # the socket is closed already
        self._events.close(0)


def new_context() -> Any:
    """Every context comes from here: one that binds gets its ZAP handler (`security`)."""
    return security.new_context()
