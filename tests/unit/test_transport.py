"""transport's non-blocking calls: a full queue or an empty socket is a value, never an exception,
and pyzmq's errors reach callers as TransportError."""

from __future__ import annotations

import logging
import signal
import socket
import subprocess
import sys
import time

import pytest

from roq.errors import TransportError
from roq.protocol import bsonmsg
from roq.transport import (
    READABLE,
    ConnectionWatch,
    Kind,
    Poller,
    bind,
    connect,
    copying_send_pays,
    drained,
    new_context,
    open_socket,
    recv_nowait,
    send_nowait,
    wait_readable,
)
from roq.transport.rpc import answer_routed, send_routed


@pytest.fixture
def pair():
    context = new_context()
    a = open_socket(context, Kind.PAIR, sndhwm=2, rcvhwm=2)
    b = open_socket(context, Kind.PAIR, sndhwm=2, rcvhwm=2)
    a.bind("inproc://test-transport")
    b.connect("inproc://test-transport")
    yield a, b
    a.close(0)
    b.close(0)
    context.term()


def test_send_and_receive_without_blocking(pair):
    a, b = pair
    assert recv_nowait(b) is None
    assert not wait_readable(b, 0)
    assert send_nowait(a, [b"one"]) and send_nowait(a, [b"two", b"frames"])
    assert wait_readable(b, 1000)
    poller = Poller()
    poller.register(b, READABLE)
    assert dict(poller.poll(1000)) == {b: READABLE}
    assert recv_nowait(b) == [b"one"]
    assert list(drained(b, 10)) == [[b"two", b"frames"]]
    assert recv_nowait(b) is None


def test_a_full_queue_is_false_not_an_exception(pair):
    a, _ = pair
    results = [send_nowait(a, [b"x"]) for _ in range(10)]  # high-water marks of 2 + 2
    assert results[0] and not results[-1]


def test_zeromq_errors_become_transport_errors(pair):
    a, _ = pair
    a.close(0)
    with pytest.raises(TransportError):
        send_nowait(a, [b"x"])
    with pytest.raises(TransportError):
        recv_nowait(a)
    with pytest.raises(TransportError):
        list(drained(a, 1))
    with pytest.raises(TransportError):
        wait_readable(a, 0)


# --- answer_routed: a ROUTER serving REQ peers, one reply per request --------------------------
@pytest.fixture
def routed():
    context = new_context()
    server = open_socket(context, Kind.ROUTER)
    server.bind("inproc://test-routed")
    peers = []

    def peer():
        sock = open_socket(context, Kind.REQ, rcvtimeo_ms=2000)
        sock.connect("inproc://test-routed")
        peers.append(sock)
        return sock

    yield server, peer
    for sock in [server, *peers]:
        sock.close(0)
    context.term()


def _serve_until_answered(server, handler, peer) -> None:
    """answer_routed until `peer` has its reply to read (bounded: 2 s)."""
    deadline = time.monotonic() + 2
    while not wait_readable(peer, 0) and time.monotonic() < deadline:
        if wait_readable(server, 50):
            answer_routed(server, handler, "test", logging.getLogger("test"))


def test_a_held_request_blocks_no_other_peer_and_is_answered_once(routed):
    server, peer = routed
    held: list[tuple[bytes, ...]] = []

    def handler(request, envelope):
        if request["CMD"] == 1:
            held.append(envelope)
            return None  # answered later
        return bsonmsg.ok(f"cmd {request['CMD']}")

    slow, fast = peer(), peer()
    slow.send(bsonmsg.encode({"CMD": 1}))
    fast.send(bsonmsg.encode({"CMD": 2}))
    _serve_until_answered(server, handler, fast)
    assert len(held) == 1
    assert bsonmsg.decode_reply(fast.recv())["COMMENT"] == "cmd 2"  # not behind the held one
    send_routed(server, held[0], bsonmsg.ok("later"))
    assert bsonmsg.decode_reply(slow.recv())["COMMENT"] == "later"


def test_malformed_and_failing_requests_are_answered_and_the_socket_serves_on(routed):
    server, peer = routed

    def handler(request, envelope):
        if request["CMD"] == 3:
            raise ValueError("a bug")
        return bsonmsg.ok("fine")

    sock = peer()
    for frames, expected in (
        ([b"\x32\x00\x00\x00\x10", b"\xca\xd5"], "expected 1 frame"),  # the fuzzer's case
        ([b"not bson"], "not a BSON document"),
        ([bsonmsg.encode({"CMD": 3})], "internal error: ValueError"),
        ([bsonmsg.encode({"CMD": 4})], "fine"),
    ):
        sock.send_multipart(frames)
        _serve_until_answered(server, handler, sock)
        reply = bsonmsg.decode_reply(sock.recv())
        assert expected in reply["COMMENT"], reply


def _peer(endpoint: str):
    """A ROUTER in a process of its own: its kernel closes its connections when it dies."""
    code = (
        "import sys, time, zmq; s = zmq.Context().socket(zmq.ROUTER); s.bind(sys.argv[1]); "
        "print('bound', flush=True); time.sleep(60)"
    )
    child = subprocess.Popen([sys.executable, "-c", code, endpoint], stdout=subprocess.PIPE)
    assert child.stdout is not None and child.stdout.readline() == b"bound\n"
    return child


@pytest.mark.parametrize("how", ["SIGKILL", "SIGSTOP"])
def test_a_connection_watch_sees_a_killed_peer_drop_and_a_stopped_one_stay(how: str) -> None:
    """The monitor's evidence that a silent exchange is late, not dead (monitor/detector.py):
    a killed peer's connection drops within a round trip; a stopped one's stays up."""
    with socket.socket() as probe:  # a free port for the peer
        probe.bind(("127.0.0.1", 0))
        endpoint = f"tcp://127.0.0.1:{probe.getsockname()[1]}"
    context = new_context()
    sock = open_socket(context, Kind.DEALER)
    watch = ConnectionWatch(sock)
    child = _peer(endpoint)
    try:
        assert not watch.up()  # not connected yet
        sock.connect(endpoint)  # plain, as the peer is (transport's `connect` adds CURVE)
        deadline = time.monotonic() + 5
        while not watch.up() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watch.up()
        child.send_signal(getattr(signal, how))
        deadline = time.monotonic() + (5 if how == "SIGKILL" else 1)
        while watch.up() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert watch.up() is (how == "SIGSTOP")
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=10)
        watch.close()
        sock.close(0)
        context.term()


def test_large_frames_are_sent_copying_on_curve_sockets_only(pair):
    """A zero-copy send saves no copy where libzmq encrypts (CURVE); inproc stays zero-copy."""
    context = new_context()
    server = open_socket(context, Kind.ROUTER)
    client = open_socket(context, Kind.DEALER)
    try:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        bind(server, "127.0.0.1", port)
        connect(client, f"tcp://127.0.0.1:{port}")
        assert copying_send_pays(server) and copying_send_pays(client)
        assert not any(copying_send_pays(sock) for sock in pair)
        batch = bytearray(70_000)  # above pyzmq's copy threshold
        assert send_nowait(client, [b"k", batch], copy=copying_send_pays(client))
        batch[0] = 1  # the copy left: what arrives is what was sent
        assert wait_readable(server, 30_000)
        frames = recv_nowait(server)
        assert frames is not None and frames[1:] == [b"k", bytes(70_000)]
    finally:
        server.close(0)
        client.close(0)
        context.term()
