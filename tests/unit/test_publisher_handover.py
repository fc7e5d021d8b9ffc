"""The publisher's hand-over between the caller's threads and its I/O thread
(client/publisher.py `_Handover`), without an exchange: what the I/O thread learns of each
turn under one lock, how flushes are confirmed or failed, and the full buffer."""

import threading

import pytest

from roq.client.publisher import BufferFull, PublishError, _Handover
from roq.transport import Kind, connect, new_context, open_socket, recv_nowait


@pytest.fixture
def handover():
    context = new_context()
    woken = open_socket(context, Kind.PAIR)
    woken.bind("inproc://handover-test")
    shared = _Handover(
        "test", b"p" * 16, batch_bytes=1_000, linger_s=60.0, buffer_bytes=4_000, block_s=None
    )
    shared.wake = open_socket(context, Kind.PAIR)
    connect(shared.wake, "inproc://handover-test")
    yield shared, woken
    shared.wake.close(0)
    woken.close(0)
    context.term()


def _send(shared, payload, key=b"k"):
    with shared.lock:
        shared.check_usable()
        shared.wait_for_space()
        shared.append(key, payload, 1)


def test_a_turn_sees_lingering_messages_flushes_and_closing_at_once(handover):
    shared, woken = handover
    assert shared.take_stale() == (False, 0, False)
    _send(shared, b"x" * 10)
    assert recv_nowait(woken) is not None, "the first message wakes the I/O thread"
    assert shared.take_stale() == (True, 0, False), "younger than the linger: it waits"
    shared.barrier()
    assert shared.take_stale() == (False, 1, False), "a flush seals what lingered"
    shared.close()
    assert shared.take_stale() == (False, 1, True)


def test_batches_leave_in_order_and_free_their_space(handover):
    shared, _ = handover
    _send(shared, b"x" * 2_000)  # past batch_bytes: sealed at once
    _send(shared, b"y" * 2_000)
    first = shared.next_outbound()
    assert first is not None and first.count == 1
    shared.sent(first)
    second = shared.next_outbound()
    assert second is not None and second.token > first.token
    shared.sent(second)
    assert shared.next_outbound() is None
    assert (shared.sent_batches, shared.sent_messages, shared.outq_bytes) == (2, 2, 0)


def test_a_full_buffer_refuses_before_taking_the_message(handover):
    shared, _ = handover
    for _ in range(2):
        _send(shared, b"x" * 2_500)
    with pytest.raises(BufferFull):
        _send(shared, b"z")
    assert shared.buffers == {}, "the refused message was not taken"


def test_confirmed_flushes_are_released_and_forgotten(handover):
    shared, _ = handover
    done = shared.barrier()
    shared.sent(shared.next_outbound())
    (token,) = shared.sent_flushes()
    shared.confirm_flushes([token, token + 99])  # an unknown token is ignored
    assert done.is_set()
    assert shared.sent_flushes() == []


def test_a_failed_io_thread_releases_every_flush_and_refuses_callers(handover):
    shared, _ = handover
    done = shared.barrier()
    waiter = threading.Thread(target=done.wait, args=(10,))
    waiter.start()
    shared.fail(RuntimeError("boom"))
    waiter.join(10)
    assert done.is_set() and not waiter.is_alive()
    assert not shared.running()
    with pytest.raises(PublishError, match="boom"):
        _send(shared, b"x")


def test_refusals_are_raised_once(handover):
    shared, _ = handover
    shared.refuse("disk full")
    assert shared.fresh_refusals() == ["disk full"]
    assert shared.fresh_refusals() == []


def test_only_a_flush_that_went_out_counts_as_sent(handover):
    """A move drains the old exchange and releases the flushes it was sent. A flush still
    queued behind an unsent batch is not among them: releasing it would let `flush()` return
    before its batch reached any exchange (CI of 27 Nov: a new publisher told its exchange
    died, right after the exchange restarted at the same address, returned from flush with
    sent_batches 0)."""
    shared, _ = handover
    _send(shared, b"x" * 2_000)
    first = shared.barrier()
    batch = shared.next_outbound()
    shared.sent(batch)
    flush = shared.next_outbound()
    shared.sent(flush)
    _send(shared, b"y" * 2_000)
    second = shared.barrier()
    assert shared.sent_flushes() == [flush.token], "the second flush waits behind its batch"
    shared.confirm_flushes(shared.sent_flushes())
    assert first.is_set() and not second.is_set()
