"""ZeroMQ sockets with every option explicit (style R7).

A socket belongs to the thread that created it; nothing here is thread-safe except `Context`.
"""

from __future__ import annotations

import enum
import errno
from collections.abc import Iterator
from typing import Any

import zmq

from roq import limits
from roq.errors import PortInUse, TransportError

Socket = zmq.Socket
Context = zmq.Context
Poller = zmq.Poller
WouldBlock = zmq.Again
POLLIN = zmq.POLLIN
POLLOUT = zmq.POLLOUT
SNDMORE = zmq.SNDMORE
NOBLOCK = zmq.NOBLOCK


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
    frame larger than we would ever accept, before we allocate for it."""
    sock = context.socket(int(kind))
    sock.setsockopt(zmq.SNDHWM, sndhwm)
    sock.setsockopt(zmq.RCVHWM, rcvhwm)
    sock.setsockopt(zmq.LINGER, linger_ms)
    sock.setsockopt(zmq.RCVTIMEO, rcvtimeo_ms)
    sock.setsockopt(zmq.SNDTIMEO, sndtimeo_ms)
    sock.setsockopt(zmq.MAXMSGSIZE, max_msg_bytes)
    if kind is Kind.SUB:
        sock.setsockopt(zmq.SUBSCRIBE, b"" if subscribe is None else subscribe)
    if kind is Kind.XPUB:
        # Every subscribe and unsubscribe (a closed connection's too) reaches the owner, not
        # only a topic's first and last: the owner can count its subscriptions.
        sock.setsockopt(zmq.XPUB_VERBOSER, 1)
    return sock


def bind(sock: Any, host: str, port: int) -> str:
    """Bind to tcp://host:port; a taken port raises PortInUse naming it."""
    endpoint = f"tcp://{host}:{port}"
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
        yield frames


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
    try:
        sock.connect(endpoint)
    except zmq.ZMQError as error:
        raise TransportError(f"cannot connect to {endpoint}: {error}") from None


def new_context() -> Any:
    return zmq.Context()
