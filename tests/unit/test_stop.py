"""The graces of a stopping client count from the stop itself (roq.client.stop): a CLI's steps
after Ctrl-C share one grace instead of adding theirs up."""

from __future__ import annotations

import threading
import time

from roq.client.stop import Grace, Stop


def test_a_grace_on_a_stop_counts_from_when_it_was_set():
    stop = Stop()
    grace = Grace(stop, 0.05)
    assert not grace.over()
    stop.set()
    set_at = stop.set_at
    time.sleep(0.06)
    stop.set()  # a second signal does not move the stop's time
    assert stop.set_at == set_at
    late = Grace(stop, 0.05)  # a step that looks only now has no grace left
    assert late.over() and grace.over()


def test_a_grace_on_a_plain_event_counts_from_when_it_first_saw_it_set():
    stop = threading.Event()
    stop.set()
    time.sleep(0.06)
    grace = Grace(stop, 0.05)
    assert not grace.over()  # first seen now
    deadline = time.monotonic() + 5
    while not grace.over():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_a_grace_that_follows_another_counts_from_its_own_first_look():
    stop = Stop()
    stop.set()
    time.sleep(0.06)
    grace = Grace(stop, 0.05, from_stop=False)
    assert not grace.over()
