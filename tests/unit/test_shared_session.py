"""SharedSession, a process's one ZooKeeper session (coordination/session.py), over a fake
`connect`: its users share one client, connected once, and a failed attempt is not waited for
twice. tests/integration/test_workqueues.py counts a real monitor's connections."""

from __future__ import annotations

import threading
from typing import Any

import pytest

from roq.coordination import session
from roq.coordination.session import SharedSession
from roq.errors import CoordinationError


class FakeConnect:
    """Stands for session.connect: counts the attempts, fails while `down`, and holds an
    attempt until `release` is set (ZooKeeper answering slowly)."""

    def __init__(self) -> None:
        self.attempts = 0
        self.down = False
        self.entered, self.release = threading.Event(), threading.Event()
        self.release.set()
        self.closed: list[Any] = []

    def connect(self, servers: str, session_timeout_ms: int, **options: Any) -> Any:
        self.attempts += 1
        self.entered.set()
        assert self.release.wait(10)
        if self.down:
            raise CoordinationError(
                f"cannot reach ZooKeeper at {servers} (attempt {self.attempts})"
            )
        return f"client {self.attempts}"


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> FakeConnect:
    made = FakeConnect()
    monkeypatch.setattr(session, "connect", made.connect)
    monkeypatch.setattr(session, "close", made.closed.append)
    return made


def test_every_user_gets_the_one_client_connected_at_the_first_use(fake: FakeConnect):
    shared = SharedSession("zk:2181", 6000)
    assert fake.attempts == 0  # not at start-up
    clients = [shared.client() for _ in range(3)]
    assert clients == ["client 1"] * 3 and fake.attempts == 1
    shared.close()
    assert fake.closed == ["client 1"]
    with pytest.raises(CoordinationError, match="closed"):
        shared.client()
    shared.close()  # twice: nothing more to close
    assert fake.closed == ["client 1"]


def test_a_failed_attempt_is_retried_by_the_next_call(fake: FakeConnect):
    shared = SharedSession("zk:2181", 6000)
    fake.down = True
    with pytest.raises(CoordinationError, match="attempt 1"):
        shared.client()
    fake.down = False
    assert shared.client() == "client 2"
    shared.close()


def test_a_caller_that_waited_for_another_threads_failed_attempt_does_not_wait_again(
    fake: FakeConnect,
):
    shared = SharedSession("zk:2181", 6000)
    fake.down = True
    fake.release.clear()
    failures: list[str] = []

    def first() -> None:
        try:
            shared.client()
        except CoordinationError as error:
            failures.append(str(error))

    thread = threading.Thread(target=first)
    thread.start()
    assert fake.entered.wait(10)  # the thread's attempt is under way
    fake.release.set()
    with pytest.raises(CoordinationError, match="attempt 1"):
        shared.client()  # this attempt's failure, or the thread's: never a second wait here
    thread.join(10)
    assert failures and "attempt 1" in failures[0]
    assert fake.attempts == 1
