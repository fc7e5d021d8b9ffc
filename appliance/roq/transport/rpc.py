"""Request/reply over ZeroMQ with a bound on every wait.

A REQ socket that timed out is stuck in its state machine, so `Requester` throws it away and
opens a fresh one for the next request (RoQ's clients hung forever here).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import zmq
import zmq.utils.monitor

from roq import limits
from roq.errors import AuthenticationRefused, ProtocolError, RequestTimeout, TransportError
from roq.protocol import bsonmsg
from roq.protocol.commands import Reason
from roq.protocol.principals import Principal
from roq.transport import security
from roq.transport.sockets import Kind, connect, open_socket


class Requester:
    """A REQ client for one endpoint. Owned by one thread."""

    def __init__(self, context: Any, endpoint: str, timeout_ms: int = limits.request_timeout_ms):
        self._context = context
        self.endpoint = endpoint
        self.timeout_ms = timeout_ms
        self._sock: Any = None
        self._watch: security.HandshakeWatch | None = None
        self._refused: str | None = None

    def _socket(self) -> Any:
        if self._sock is None:
            self._sock = open_socket(
                self._context, Kind.REQ, rcvtimeo_ms=self.timeout_ms, sndtimeo_ms=self.timeout_ms
            )
            self._watch = security.watch(self._sock)
            connect(self._sock, self.endpoint)
        return self._sock

    def request(
        self,
        doc: dict[str, Any],
        timeout_ms: int | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> dict[str, Any]:
        """Send one BSON request and return the decoded reply, or raise RequestTimeout."""
        frames = self.request_raw([bsonmsg.encode(doc)], timeout_ms, cancelled)
        return bsonmsg.decode_reply(frames[0])

    def request_raw(
        self,
        frames: list[bytes],
        timeout_ms: int | None = None,
        cancelled: Callable[[], bool] | None = None,
    ) -> list[bytes]:
        """`cancelled`, asked every `limits.request_cancel_poll_ms` while the reply is awaited,
        ends the wait early (RequestTimeout) once it says True."""
        sock = self._socket()
        wait_ms = self.timeout_ms if timeout_ms is None else timeout_ms
        try:
            sock.send_multipart(frames)
            if not self._wait(sock, wait_ms, cancelled):
                raise RequestTimeout(f"no reply from {self.endpoint} within {wait_ms} ms")
            if not sock.poll(0, zmq.POLLIN):
                raise AuthenticationRefused(self._refusal())
            reply: list[bytes] = sock.recv_multipart()
            return reply
        except (RequestTimeout, AuthenticationRefused):
            self.close()
            raise
        except zmq.ZMQError as error:
            self.close()
            raise TransportError(f"request to {self.endpoint} failed: {error}") from None

    def _wait(self, sock: Any, wait_ms: int, cancelled: Callable[[], bool] | None) -> bool:
        """Whether the wait ended before its bound: a reply, or handshakes that certainly fail
        (the server refused our key: waiting longer would only hide it; `_refused` says why)."""
        poller = zmq.Poller()
        poller.register(sock, zmq.POLLIN)
        if self._watch is not None:
            poller.register(self._watch.events, zmq.POLLIN)
        deadline = time.monotonic() + wait_ms / 1000
        while cancelled is None or not cancelled():
            left_ms = int((deadline - time.monotonic()) * 1000)
            if left_ms <= 0:
                return False
            step_ms = left_ms if cancelled is None else min(left_ms, limits.request_cancel_poll_ms)
            ready = dict(poller.poll(step_ms))
            if sock in ready:
                return True
            if self._watch is not None and self._watch.events in ready:
                self._refused = self._watch.failure()
                if self._refused is not None:
                    return True
        return False

    def _refusal(self) -> str:
        return self._refused or f"the handshake with {self.endpoint} failed"

    def close(self) -> None:
        if self._watch is not None:
            self._watch.close()
            self._watch = None
        if self._sock is not None:
            self._sock.close(0)
            self._sock = None


class Stream:
    """A DEALER to one ROUTER endpoint: requests sent without waiting, replies read as they
    come, in any order (a server that holds requests, answering each when it has something:
    the reply stream of request/response, client/requests.py). Owned by one thread. A reply
    lost with its server is the caller's to ask again (it knows what it asked)."""

    def __init__(self, context: Any, endpoint: str, hwm: int = limits.task_stream_hwm):
        self.endpoint = endpoint
        self._sock = open_socket(context, Kind.DEALER, sndhwm=hwm, rcvhwm=hwm)
        # its connections, to tell a reconnection: the server may have restarted and lost
        # what it held (`reconnected`)
        self._events = self._sock.get_monitor_socket(zmq.EVENT_CONNECTED)
        self._connections = 0
        connect(self._sock, endpoint)

    def reconnected(self) -> bool:
        """Whether the stream connected again since the last call (not its first connection):
        requests sent before may be lost with the server's old process."""
        again = False
        while self._events.poll(0):
            zmq.utils.monitor.parse_monitor_message(self._events.recv_multipart())
            self._connections += 1
            again = again or self._connections > 1
        return again

    def send(self, doc: dict[str, Any]) -> bool:
        """Queue one request (a REQ peer's framing, so the server answers it as one); False
        when the socket's queue is full (the server is gone or slow: ask again later)."""
        try:
            self._sock.send_multipart([b"", bsonmsg.encode(doc)], zmq.NOBLOCK)
        except zmq.ZMQError:
            return False
        return True

    def receive(self, wait_ms: int) -> dict[str, Any] | None:
        """The next reply, within `wait_ms`; None if none came (or the stream connected again
        meanwhile: see `reconnected`). A malformed one raises DecodeError (the stream goes on).
        """
        poller = zmq.Poller()
        poller.register(self._sock, zmq.POLLIN)
        poller.register(self._events, zmq.POLLIN)  # a reconnection ends the wait too
        if self._sock not in dict(poller.poll(max(wait_ms, 0))):
            return None
        frames = self._sock.recv_multipart()
        return bsonmsg.decode_reply(frames[-1])

    def close(self) -> None:
        try:
            self._sock.disable_monitor()
        except zmq.ZMQError:
            pass
        self._events.close(0)
        self._sock.close(0)


Handler = Callable[[dict[str, Any]], dict[str, Any]]
# Given who sent a request (None: a principal revoked since it connected) and the request: None
# to serve it, or the refusal to send instead (protocol/principals.py `missing` names why).
Authorizer = Callable[[Principal | None, dict[str, Any]], dict[str, Any] | None]


def answer(
    sock: Any, handler: Handler, log_name: str, logger: Any, authorize: Authorizer | None = None
) -> None:
    """Receive one request on a REP socket and send exactly one reply, whatever it held.

    Malformed requests get `{RESULT: 1101, COMMENT: why}`; a handler bug gets an INTERNAL
    failure reply and a logged traceback, and the socket keeps serving either way. With
    `authorize`, a request its sender may not make gets the authorizer's refusal.
    """
    # Zero-copy only to learn the sender (a frame's User-Id): requests are small either way.
    received = sock.recv_multipart(copy=False) if authorize is not None else None
    frames = [frame.bytes for frame in received] if received else sock.recv_multipart()
    try:
        request = bsonmsg.decode(frames)
        refusal = None
        if authorize is not None and received:
            refusal = authorize(security.principal_of(received[0]), request)
        reply = handler(request) if refusal is None else refusal
    except ProtocolError as error:
        logger.warning("%s: refused a malformed request: %s", log_name, error)
        reply = bsonmsg.fail(Reason.BAD_REQUEST, str(error))
    except Exception as error:  # a bug must not leave the REP socket without a reply
        logger.exception("%s: request handler failed", log_name)
        reply = bsonmsg.fail(Reason.INTERNAL, f"internal error: {type(error).__name__}: {error}")
    sock.send(bsonmsg.encode(reply))


# A routed request's return address: the ROUTER's identity frame(s) and the empty delimiter a
# REQ peer puts before its body. Kept by a server that answers later (a parked request).
Envelope = tuple[bytes, ...]
# Given a request and its envelope: the reply, or None when the handler keeps the envelope and
# answers later with `send_routed` (exactly once: the REQ peer waits for one reply).
RoutedHandler = Callable[[dict[str, Any], Envelope], dict[str, Any] | None]


def answer_routed(
    sock: Any,
    handler: RoutedHandler,
    log_name: str,
    logger: Any,
    authorize: Authorizer | None = None,
    burst: int = limits.monitor_burst_messages,
    max_bytes: int = limits.admin_frame_bytes_max,
) -> None:
    """`answer` for a ROUTER socket serving REQ peers, for at most `burst` requests: the same
    one-reply-per-request promise, except that a handler may hold a request and answer it
    later, so a request that waits (a long poll) never blocks the peers behind it (a REP
    socket answers in order, one at a time)."""
    for _ in range(burst):
        try:
            received = sock.recv_multipart(zmq.NOBLOCK, copy=False)
        except zmq.Again:
            return
        cut = next((i for i, f in enumerate(received) if not f.bytes), -1)
        if cut < 1:  # not a REQ peer's [id, "", body...]: there is no return address
            logger.warning("%s: dropped a request of %d frames without its envelope",
                           log_name, len(received))  # fmt: skip
            continue
        envelope = tuple(f.bytes for f in received[: cut + 1])
        body = received[cut + 1 :]  # not one frame: answered as malformed, as `answer` does
        reply = _routed_reply(body, envelope, handler, log_name, logger, authorize, max_bytes)
        if reply is not None:
            send_routed(sock, envelope, reply)


def _routed_reply(
    body: list[Any],
    envelope: Envelope,
    handler: RoutedHandler,
    log_name: str,
    logger: Any,
    authorize: Authorizer | None,
    max_bytes: int,
) -> dict[str, Any] | None:
    try:
        request = bsonmsg.decode([frame.bytes for frame in body], max_bytes)
        refusal = None
        if authorize is not None:  # one frame (decode checked it): it shows the sender
            refusal = authorize(security.principal_of(body[0]), request)
        return handler(request, envelope) if refusal is None else refusal
    except ProtocolError as error:
        logger.warning("%s: refused a malformed request: %s", log_name, error)
        return bsonmsg.fail(Reason.BAD_REQUEST, str(error))
    except Exception as error:  # a bug must not leave the peer without a reply
        logger.exception("%s: request handler failed", log_name)
        return bsonmsg.fail(Reason.INTERNAL, f"internal error: {type(error).__name__}: {error}")


def send_routed(sock: Any, envelope: Envelope, reply: dict[str, Any]) -> None:
    """The reply to a routed request. Never blocks: a peer gone (or too slow to read) loses
    it, and its REQ side times out and asks again, as after any lost reply."""
    try:
        sock.send_multipart([*envelope, bsonmsg.encode(reply)], zmq.NOBLOCK)
    except zmq.ZMQError:  # Again (its queue is full), or the peer is gone
        pass
