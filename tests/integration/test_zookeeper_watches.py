"""coordination/watches.py against a real ZooKeeper: a watch whose read fails (a request that
timed out, injected into the client once) reads again and keeps watching; kazoo's own recipe
left the watch unset until the next reconnection, with a traceback in kazoo's worker thread.
And a real session expiry of a GCM leader and a host leaves no traceback in their logs."""

from __future__ import annotations

import logging
import os
import signal
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from roq.coordination import session
from roq.coordination.session import ZooKeeperTimeout
from roq.coordination.watches import watch_children, watch_data
from roq.testing.cluster import LocalCluster, wait_for

pytestmark = pytest.mark.integration

SESSION_S = 4.0  # zk.session.timeout of the test cluster (LocalCluster's default)


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


def test_no_traceback_in_the_logs_after_a_session_expiry(cluster: LocalCluster) -> None:
    """Issue 30: the GCM leader's and a host's sessions expire for real (each stopped with its
    children past zk.session.timeout, a standby GCM taking the lead meanwhile); woken, each
    opens a new session, the host registers again, and no log shows a traceback from kazoo's
    threads (a watch's callback or read that raised on the expired session)."""
    cluster.start_with_queue(hosts=2, **{"replicationFactor": 2})
    gcm, host = cluster.daemons[0], cluster.daemons[1]
    standby = cluster.start_gcm()  # takes the lead while the first GCM is stopped
    wait_for(lambda: cluster.queue_processes(host="h1"), 15, "q1 on h1")
    for daemon in (gcm, host):
        os.killpg(daemon.process.pid, signal.SIGSTOP)
    try:
        time.sleep(SESSION_S + 6)  # the fault itself: stopped past the session timeout
    finally:
        for daemon in (gcm, host):
            os.killpg(daemon.process.pid, signal.SIGCONT)
    wait_for(lambda: "registered again after its ZooKeeper session expired" in host.log_text(),
             30, f"h1 registered again\n{cluster.logs()}")  # fmt: skip
    with cluster.admin(timeout_ms=2000, retries=1) as admin:
        wait_for(lambda: admin.status().hosts, 30, f"the GCM leads again\n{cluster.logs()}")
    time.sleep(2.0)  # what kazoo's threads would log after the reconnection, logged by now
    for daemon in (gcm, host, standby):
        assert "Traceback" not in daemon.log_text(), daemon.log_text()[-6000:]
