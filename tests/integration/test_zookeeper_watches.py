"""coordination/watches.py against a real ZooKeeper: a watch whose read fails (a request that
timed out, injected into the client once) reads again and keeps watching; kazoo's own recipe
left the watch unset until the next reconnection, with a traceback in kazoo's worker thread."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from roq.coordination import session
from roq.coordination.session import ZooKeeperTimeout
from roq.coordination.watches import watch_children, watch_data
from roq.testing.cluster import wait_for

pytestmark = pytest.mark.integration


@pytest.fixture
def client(zookeeper: str) -> Iterator[Any]:
    zk = session.connect(zookeeper, 4000)
    yield zk
    session.close(zk)


def _fail_next(client: Any, name: str, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The client's next `name` call raises ZooKeeperTimeout, as one that timed out does; the
    calls after it go to ZooKeeper. Returns the count of failures made."""
    real, failed = getattr(client, name), [0]

    def once(*args: Any, **kwargs: Any) -> Any:
        if not failed[0]:
            failed[0] += 1
            raise ZooKeeperTimeout()
        return real(*args, **kwargs)

    monkeypatch.setattr(client, name, once)
    return failed


def test_a_data_watch_whose_read_timed_out_reads_again_and_keeps_watching(
    client: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = f"/watch-{uuid.uuid4().hex}"
    client.create(path, b"1")
    seen: list[bytes] = []
    watch_data(client, path, lambda data, _stat: seen.append(data))
    wait_for(lambda: seen == [b"1"], 10, "the first read")
    failed = _fail_next(client, "get", monkeypatch)
    with caplog.at_level(logging.WARNING):
        client.set(path, b"2")
        wait_for(lambda: failed[0] == 1 and b"2" in seen, 10, f"read again: {seen}")
        client.set(path, b"3")
        wait_for(lambda: b"3" in seen, 10, f"still watching: {seen}")
    assert any("reading it again" in r.getMessage() for r in caplog.records)
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_a_children_watch_whose_read_timed_out_reads_again_and_keeps_watching(
    client: Any, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    path = f"/watch-{uuid.uuid4().hex}"
    client.create(path, b"")
    seen: list[list[str]] = []
    watch_children(client, path, lambda children: seen.append(sorted(children)))
    wait_for(lambda: seen == [[]], 10, "the first read")
    failed = _fail_next(client, "get_children", monkeypatch)
    with caplog.at_level(logging.WARNING):
        client.create(f"{path}/a", b"")
        wait_for(lambda: failed[0] == 1 and ["a"] in seen, 10, f"read again: {seen}")
        client.create(f"{path}/b", b"")
        wait_for(lambda: ["a", "b"] in seen, 10, f"still watching: {seen}")
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR], caplog.text


def test_the_first_read_fails_to_the_caller(client: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    path = f"/watch-{uuid.uuid4().hex}"
    client.create(path, b"1")
    _fail_next(client, "get", monkeypatch)
    with pytest.raises(ZooKeeperTimeout):
        watch_data(client, path, lambda data, _stat: None)
