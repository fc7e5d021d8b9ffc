"""A queue keeps exactly one monitor through restarts (docs/guarantees.md §6, "After a restart"):

- a cluster stopped and started again as `roq up` does it (the host, with its children, then the
  GCM stopped; both started again at once on the same ports and directories), several times:
  each queue has one live monitor, of its recorded epoch, and serves again;
- the race such a restart ran into, made certain by a hook (`hooks/sitecustomize.py`): the new
  GCM leader, finding the host's registration gone, read the live hosts again to choose one for
  the queue's monitor just as the host registered again, placed the monitor on that very host
  under a new epoch, then withdrew the placement when its record write found the host
  registered; now the move is called off and the host keeps the monitor it re-adopted;
- the race's two host requests, sent by the test: the host keeps its recorded monitor;
- a monitor whose own state log is slow to replay answers its host at once (busy meanwhile) and
  is not given up on by the host's start deadline (`limits.child_ready_timeout_ms`).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
import zkrecords

from roq import limits
from roq.client.live import monitor_status
from roq.client.locate import MonitorAddress
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.client.topics import TopicClient
from roq.coordination.registry import QueueRecord
from roq.protocol.bsonmsg import Reply
from roq.protocol.commands import MonitorCommand, Reason
from roq.protocol.messages.host import CreateQueueOnHost, StopMonitorOnHost
from roq.protocol.messages.topics import TopicAsk
from roq.protocol.ports import MonitorPort
from roq.testing.cluster import Daemon, LocalCluster, ask_once, processes_with, wait_for

pytestmark = pytest.mark.integration

T = TypeVar("T")

QUEUES = ("q1", "q2", "q3")
RESTARTS = 3
# A restart serves again within this (as tests/integration/test_resume.py's `roq up` bound: on
# the loaded CI machine every child is a Python start competing for two cores).
SERVE_AGAIN_S = 45.0
HOST = {"exchange.max.perhost": 8}
HOOKS = Path(__file__).parent / "hooks"  # its sitecustomize.py: timing hooks, off unless asked
# The replay lasts longer than the host waits for a child to answer its PING.
REPLAY_S = limits.child_ready_timeout_ms / 1000 + 5
TOPICS = 20  # the HTTP gateway's topics, kept in the monitor's state log


def _within(
    cluster: LocalCluster, predicate: Callable[[], T | None], bound_s: float, what: str
) -> T:
    """`wait_for`, failing with the cluster's logs as they are at the timeout."""
    try:
        return wait_for(predicate, bound_s, what, interval_s=0.25)
    except TimeoutError as error:
        raise AssertionError(f"{error}\n{cluster.logs()}") from None


def _records(cluster: LocalCluster, queues: tuple[str, ...]) -> dict[str, QueueRecord]:
    with zkrecords.registry(cluster) as registry:
        found = {q: registry.queue(q) for q in queues}
    return {q: got[0] for q, got in found.items() if got is not None}


def _monitors(cluster: LocalCluster, queue: str) -> list[int]:
    return processes_with(f" monitor {queue} --bind ", str(cluster.tmp))


def _one_monitor_each(cluster: LocalCluster, queues: tuple[str, ...]) -> dict[str, int] | None:
    """{queue: its monitor's pid} once every queue has exactly one monitor process, which
    answers under the epoch its record names and serves its state log, with the host
    registered and the GCM repairing nothing; None until then."""
    with cluster.admin(timeout_ms=1000, retries=1) as admin:
        status = admin.status()
    if not status.hosts or status.gone or status.repairs:
        return None
    records = _records(cluster, queues)
    pids = {}
    for queue in queues:
        found = _monitors(cluster, queue)
        record = records.get(queue)
        if len(found) != 1 or record is None:
            return None
        live = monitor_status(record.monitor)
        if live is None or live.epoch != record.epoch:
            return None
        if live.state is None or live.state.recovering:
            return None
        pids[queue] = found[0]
    return pids


def _publish(cluster: LocalCluster, queue: str, payload: bytes) -> None:
    with Publisher(queue, gcm=cluster.gcm, acks="leader") as publisher:
        publisher.send(payload)
        publisher.flush(timeout_s=10)


def _read_all(cluster: LocalCluster, queue: str, count: int) -> list[bytes]:
    with Subscriber(queue, gcm=cluster.gcm, start="beginning") as subscriber:
        return [bytes(r.payload) for r in subscriber.messages(count=count, timeout_s=20)]


def _serves(cluster: LocalCluster, sent: dict[str, list[bytes]], round_: int) -> None:
    """A publish to every queue acknowledged, and each queue read back whole (one stream per
    publish: no order across them is promised, so compared as sets)."""
    for queue in sent:
        payload = f"{queue}-{round_}".encode()
        _within(cluster, lambda q=queue, p=payload: _published(cluster, q, p), SERVE_AGAIN_S,
                f"{queue} acknowledging a publish")  # fmt: skip
        sent[queue].append(payload)
        got = _read_all(cluster, queue, len(sent[queue]))
        assert sorted(got) == sorted(sent[queue]), (queue, got, cluster.logs())


def _published(cluster: LocalCluster, queue: str, payload: bytes) -> bool:
    try:
        _publish(cluster, queue, payload)
    except Exception:
        return False
    return True


def _restart_as_roq_up(cluster: LocalCluster, gcm: Daemon, host: Daemon) -> tuple[Daemon, Daemon]:
    """Stopped as `roq up` stops (the host, which stops its children, then the GCM), then both
    started again at once, as `roq up` starts them."""
    cluster.stop_daemon(host)
    cluster.stop_daemon(gcm)
    assert not any(_monitors(cluster, q) for q in QUEUES), "the host stopped its monitors"
    return cluster.start_again(gcm), cluster.start_again(host)


@pytest.mark.timeout(400)
def _serving_queues(cluster: LocalCluster) -> tuple[Daemon, Daemon, dict[str, list[bytes]]]:
    """A GCM, host h1 and QUEUES on it, each serving (a publish read back): the GCM, the host
    and what each queue was sent."""
    gcm = cluster.start_gcm()
    host = cluster.start_host("h1", **HOST)
    cluster.wait_ready()
    with cluster.admin() as admin:
        for queue in QUEUES:
            admin.create_queue(queue, host="h1")
    sent: dict[str, list[bytes]] = {queue: [] for queue in QUEUES}
    _serves(cluster, sent, 0)
    return gcm, host, sent


def test_a_cluster_restarted_as_roq_up_does_keeps_one_monitor_per_queue_and_serves(
    cluster: LocalCluster,
) -> None:
    """Defect found 26 Nov (docs/benchmarks.md, the topics' memory run, defect 2): after such a
    restart the new GCM leader, seeing the host's registration gone, placed the queue's monitor
    on that same host under a new epoch just as it registered again; the host restarted its
    re-adopted monitor under that epoch, and the GCM's record write, conditioned on the host's
    absence, failed and withdrew the new one: no monitor, for good. Here: three queues on one
    host, restarted three times; after each, within SERVE_AGAIN_S, each queue has exactly one
    monitor, under its recorded epoch (1: a restart resumes, nothing is re-placed) and on its
    state log (`state.1`), and every queue takes a publish and reads back all it was sent."""
    gcm, host, sent = _serving_queues(cluster)
    for round_ in range(1, RESTARTS + 1):
        gcm, host = _restart_as_roq_up(cluster, gcm, host)
        pids = _within(cluster, lambda: _one_monitor_each(cluster, QUEUES), SERVE_AGAIN_S,
                       f"restart {round_}: one serving monitor per queue")  # fmt: skip
        _serves(cluster, sent, round_)
        # still the same one monitor each, and nothing moved: the restart resumed
        assert _one_monitor_each(cluster, QUEUES) == pids, cluster.logs()
        records = _records(cluster, QUEUES)
        placed = {q: (r.host, r.epoch) for q, r in records.items()}
        assert placed == dict.fromkeys(QUEUES, ("h1", 1)), records
        for queue in QUEUES:
            live = monitor_status(records[queue].monitor)
            assert live is not None and live.state is not None
            assert live.state.leader_id == "state.1", (queue, live.state)
    assert "for the called-off move stopped" not in gcm.log_text()


def _hooked(monkeypatch: pytest.MonkeyPatch, **hooks: float) -> None:
    """The processes started from now on load `hooks/sitecustomize.py` with `hooks` set."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        p for p in (str(HOOKS), os.environ.get("PYTHONPATH", "")) if p
    ))  # fmt: skip
    for name, value in hooks.items():
        monkeypatch.setenv(name, str(value))


@pytest.mark.timeout(300)
def test_a_host_registered_again_while_the_gcm_moves_its_monitor_keeps_it(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The restart race above, made certain: the GCM started again first, its repair finds h1
    gone and decides to move its monitors; a hook (`hooks/sitecustomize.py`,
    ROQ_TEST_REPAIR_WAITS_FOR_HOST) holds it there, between its read of the live hosts and its
    choice of one, until h1, started then, has registered again (and re-adopted its monitors).
    Before, the GCM chose h1, which restarted its monitor under epoch 2, then withdrew that one
    when its record write found h1 registered: q1 was left without a monitor (this test timed
    out waiting for one). Now the move is called off and every queue keeps its monitor."""
    gcm, host, sent = _serving_queues(cluster)
    cluster.stop_daemon(host)
    cluster.stop_daemon(gcm)
    _hooked(monkeypatch, ROQ_TEST_REPAIR_WAITS_FOR_HOST=SERVE_AGAIN_S)
    earlier = len(gcm.log_text())
    gcm = cluster.start_again(gcm)
    _within(cluster, lambda: "its monitor's host h1 is gone" in gcm.log_text()[earlier:],
            SERVE_AGAIN_S, "the GCM moving a monitor of h1, which is not started yet")  # fmt: skip
    monkeypatch.delenv("ROQ_TEST_REPAIR_WAITS_FOR_HOST")
    host = cluster.start_again(host)
    _within(cluster, lambda: _one_monitor_each(cluster, QUEUES), SERVE_AGAIN_S,
            "one serving monitor per queue")  # fmt: skip
    assert "test hook: a host is registered" in gcm.log_text()[earlier:], "the race was run"
    assert "host h1 registered again before its monitor was re-placed" in gcm.log_text()
    _serves(cluster, sent, 1)
    records = _records(cluster, QUEUES)
    assert {q: (r.host, r.epoch) for q, r in records.items()} == dict.fromkeys(QUEUES, ("h1", 1)), (
        records
    )


def _ask_long(endpoint: str, doc: dict[str, Any]) -> dict[str, Any]:
    return ask_once(endpoint, doc, 20_000)  # a host's answer may wait for a child's start


def test_a_placement_under_a_newer_epoch_leaves_the_hosts_recorded_monitor_alone(
    cluster: LocalCluster,
) -> None:
    """The race above, its two host requests sent by the test as the GCM sent them: a 1002
    under epoch 2 to the host that runs q1's recorded monitor (epoch 1), then the withdrawal of
    that placement (1014 for epoch 2). Before, the host restarted its monitor under epoch 2 for
    the 1002 and stopped it for the 1014: q1 had no monitor. Now the 1002 is refused (busy) and
    the recorded monitor stays, the same process, and serves."""
    cluster.start_with_queue(1)
    [monitor] = _monitors(cluster, "q1")
    [record] = _records(cluster, ("q1",)).values()
    with zkrecords.registry(cluster) as registry:
        h1 = registry.host("h1")
    assert h1 is not None and record.epoch == 1
    with cluster.as_cluster():  # the GCM's requests: the cluster's own principal
        placed = _ask_long(h1.hcm, CreateQueueOnHost("q1", record.epoch + 1).encode())
        withdrawn = _ask_long(h1.hcm, StopMonitorOnHost("q1", record.epoch + 1).encode())
    reply = Reply.decode(placed)
    assert not reply.ok and reply.error == Reason.BUSY, placed
    assert "runs the recorded monitor of q1 (epoch 1)" in reply.comment, placed
    assert Reply.decode(withdrawn).ok, withdrawn
    assert "no monitor of q1 under epoch 2" in Reply.decode(withdrawn).comment, withdrawn
    assert _monitors(cluster, "q1") == [monitor]
    live = monitor_status(record.monitor)
    assert live is not None and live.epoch == 1
    sent: dict[str, list[bytes]] = {"q1": []}
    _serves(cluster, sent, 0)


def _replaying(record: QueueRecord) -> str | None:
    """What the queue's monitor reads before it serves its state log (None once it serves, or
    while it does not answer)."""
    live = monitor_status(record.monitor)
    if live is None or live.state is None:
        return None
    return live.state.recovering or None


def _topic_count(endpoint: str) -> dict[str, Any]:
    return ask_once(endpoint, TopicAsk(MonitorCommand.TOPIC_COUNT).encode(), timeout_ms=2000)


@pytest.mark.timeout(300)
def test_a_monitor_slow_to_replay_its_state_log_is_not_given_up_and_serves_after(
    cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Defect found 26 Nov (docs/benchmarks.md, the topics' memory run, defect 1): a monitor
    replayed its own state log before its loop answered anything, so one whose log took longer
    than the host's start deadline (`limits.child_ready_timeout_ms`, 15 s: 300,000 keys on a
    loaded machine) was stopped by its host ("could not re-adopt"), and its queue left without
    a monitor. Here the host is restarted with the state log's replay made REPLAY_S long (its
    children load `hooks/sitecustomize.py`, which adds that much pure-Python work, holding
    the GIL as a replay does, to every state log replay): the monitor answers the host's PING at
    once (the host logs it started, within the deadline), says what it replays, answers a
    topic request busy meanwhile, then serves the topics and messages it had."""
    cluster.start_gcm()
    host = cluster.start_host("h1", **HOST)
    cluster.wait_ready()
    with cluster.admin() as admin:
        admin.create_queue("q1", host="h1")
    # topic commands are the gateway's: the cluster's own principal (issue 31, finding 4)
    with cluster.as_cluster():
        topics = TopicClient(("q1",), lambda _: "q1", (cluster.gcm, None, cluster.namespace))
        try:
            for n in range(TOPICS):
                topics.register(f"t{n}", "owner", 1000)
                topics.subscribe(f"t{n}", "s", 1000)
                topics.advance_head(f"t{n}", "owner", n + 1)
            before = {n: topics.position(f"t{n}", "s") for n in range(TOPICS)}
        finally:
            topics.close()
        sent: dict[str, list[bytes]] = {"q1": []}
        _serves(cluster, sent, 0)

        cluster.stop_daemon(host)
        _hooked(monkeypatch, ROQ_TEST_REPLAY_S=REPLAY_S)
        earlier = len(host.log_text())
        host = cluster.start_again(host)
        # The host's wait for the monitor's PING ends (it logs the start) while the replay runs.
        start_s = limits.child_ready_timeout_ms / 1000 + 10  # the host's own start, then its wait
        _within(cluster, lambda: "monitor q1 started" in host.log_text()[earlier:], start_s,
                "the host's start of the monitor")  # fmt: skip
        [record] = _records(cluster, ("q1",)).values()
        assert _replaying(record) == "state.1 on this host", "started before its replay ended"
        [monitor] = _monitors(cluster, "q1")
        busy = Reply.decode(_topic_count(MonitorAddress(record.monitor).at(MonitorPort.PLACEMENT)))
        assert not busy.ok and busy.error == Reason.BUSY and "recovering" in busy.comment, busy
        _within(cluster, lambda: _replaying(record) is None and monitor_status(record.monitor),
                REPLAY_S + SERVE_AGAIN_S, "the replay's end")  # fmt: skip
        assert "could not re-adopt" not in host.log_text(), host.log_text()[-4000:]
        assert _monitors(cluster, "q1") == [monitor], "the same monitor, never stopped or restarted"
        topics = TopicClient(("q1",), lambda _: "q1", (cluster.gcm, None, cluster.namespace))
        try:
            assert topics.count() == TOPICS
            assert {n: topics.position(f"t{n}", "s") for n in range(TOPICS)} == before
        finally:
            topics.close()
    _serves(cluster, sent, 1)
