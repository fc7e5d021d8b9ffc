"""transport's non-blocking calls: a full queue or an empty socket is a value, never an exception,
and pyzmq's errors reach callers as TransportError."""

from __future__ import annotations

import pytest

from roq.errors import TransportError
from roq.transport import (
    READABLE,
    Kind,
    Poller,
    drained,
    new_context,
    open_socket,
    recv_nowait,
    send_nowait,
    wait_readable,
)


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
