"""Elasticity on a real cluster: scale-out under load, the capacity limit, scale-in, rules.

Thresholds are lowered through -D settings so that each scenario runs in seconds: exchanges are
sized for 200 KB/s and the implicit rule fires at half of that. Publishers and subscribers run in
this process; the monitor, its exchanges and the GCM are real processes.
"""

from __future__ import annotations

import collections
import itertools
import json
import threading
import time
from typing import Any

import pytest
from test_dataplane import Collector, _assert_exact, collectors_stopped  # noqa: F401 (autouse)

from roq.client.admin import AdminRefused
from roq.client.live import monitor_status
from roq.client.publisher import Publisher
from roq.protocol import bsonmsg
from roq.protocol.commands import StatCommand
from roq.protocol.ports import host_block
from roq.testing.cluster import LocalCluster, port_is_free, processes_with, wait_for
from roq.transport import READABLE, Kind, Poller, bind, connect, new_context, open_socket

pytestmark = pytest.mark.integration

FAST = {
    "exchange.warmup": 200,
    "exchange.max.throughput": 200_000,  # bytes/s
    "scaling.highwater": 0.5,  # the implicit rule: every exchange above 100 KB/s
    "scaling.window.ms": 1000,
    "scaling.cooldown.ms": 3000,
    "scaling.lowwater": 0.3,
    "scaling.lowwater.ms": 60_000,
    "relocate.cooldown": 2000,
}


def _start(cluster: LocalCluster, queue: str = "q1", **overrides: Any) -> str:
    cluster.start_gcm()
    cluster.start_host("h1", **{"exchange.max.perhost": 3, **FAST, **overrides})
    cluster.wait_ready()
    with cluster.admin() as admin:
        admin.create_queue(queue)
    return queue


def _live(cluster: LocalCluster, queue: str) -> dict[str, Any]:
    with cluster.admin() as admin:
        record = next(q for q in admin.list_queues() if q.name == queue)
    status = monitor_status(record.monitor_host)
    assert status is not None, "monitor unreachable"
    return status.encode()


def _events(cluster: LocalCluster, queue: str) -> list[str]:
    return [e["Event"] for e in _live(cluster, queue)["Scaling"]["Events"]]


class Load:
    """Publishers sending at roughly fixed rates from the test thread, counting what they sent.

    The rate is paced by the clock, not by the steps: on a loaded machine a step takes far
    more than its 20 ms (a CI run measured ~120 ms, so 2 x 1000 B a step made 17 KB/s where
    the test meant 100 KB/s, and a rule at 60 KB/s never fired), and the next step makes up
    for it (up to 10 steps' worth)."""

    STEP_S = 0.02

    def __init__(self, cluster: LocalCluster, queue: str, sizes: list[int]):
        self.publishers = [Publisher(queue, gcm=cluster.gcm, linger_ms=1) for _ in sizes]
        self.sizes = sizes
        self.sent: collections.Counter[bytes] = collections.Counter()
        self.last_step: float | None = None
        self.owed = 0.0  # messages each publisher owes, fractions carried to the next step

    def step(self, messages_each: int = 2) -> None:
        """One 20 ms step: `messages_each` messages from each publisher for every 20 ms since
        the last step."""
        now = time.monotonic()
        steps = 1.0 if self.last_step is None else (now - self.last_step) / self.STEP_S
        self.last_step = now
        self.owed += messages_each * min(10.0, max(1.0, steps))
        count, self.owed = int(self.owed), self.owed - int(self.owed)
        for publisher, size in zip(self.publishers, self.sizes, strict=True):
            if size:
                for _ in range(count):
                    publisher.send(b"x" * size, b"k")
                    self.sent[publisher.producer_id] += 1
        time.sleep(self.STEP_S)

    def run_until(self, done: Any, timeout_s: float, what: str, logs: Any) -> None:
        deadline = time.monotonic() + timeout_s
        while not done():
            if time.monotonic() > deadline:
                raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}\n{logs()}")
            self.step()

    def close(self) -> None:
        for publisher in self.publishers:
            publisher.close()

    def expected(self) -> dict[tuple[bytes, bytes], int]:
        return {(pid, b"k"): n for pid, n in self.sent.items()}


def test_load_ramp_adds_an_exchange_and_moves_the_heaviest_publisher(cluster: LocalCluster):
    queue = _start(cluster)
    collector = Collector(cluster, queue)
    collector.start()
    load = Load(cluster, queue, [1000, 1000, 50, 50])  # ~2 × 90 KB/s + 2 × 4 KB/s
    first = load.publishers[0].exchange
    assert all(p.exchange == first for p in load.publishers)
    load.run_until(
        lambda: any(p.exchange != first for p in load.publishers[:2]),
        25,
        "a heavy publisher on a new exchange",
        cluster.logs,
    )
    for _ in range(50):  # one more second of load on both exchanges
        load.step()
    # (replicationFactor 1 here, so that the queue starts with one exchange: the replicas a
    # joining exchange is given are test_availability's)
    live = _live(cluster, queue)
    assert len(live["Exchanges"]) == 2, "one exchange added, not more"
    moved = [p for p in load.publishers if p.exchange != first]
    assert sum(1 for p in moved if p in load.publishers[:2]) == 1, "one heavy moved, one stayed"
    events = [e["Event"] for e in live["Scaling"]["Events"]]
    assert events[:3] == ["scale_out", "exchange_added", "publisher_moved"], events
    load.close()
    wait_for(lambda: collector.count >= sum(load.sent.values()), 15, "everything delivered")
    time.sleep(0.3)
    collector.finish()
    _assert_exact(collector, load.expected())


class KpiWatcher(threading.Thread):
    """Collects the SCALING_EVENT documents of a queue's KPI stream (S+1)."""

    def __init__(self, cluster: LocalCluster, queue: str):
        super().__init__(daemon=True)
        with cluster.admin() as admin:
            record = next(q for q in admin.list_queues() if q.name == queue)
        self.endpoint = record.stat_monitor_host
        self.events: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.ready = threading.Event()

    def run(self) -> None:
        context = new_context()
        sock = open_socket(context, Kind.SUB, subscribe=b"")
        connect(sock, self.endpoint)
        poller = Poller()
        poller.register(sock, READABLE)
        self.ready.set()
        try:
            while not self.stop.is_set():
                if poller.poll(50):
                    frames = sock.recv_multipart()
                    doc = bsonmsg.decode(frames[:1])
                    if doc["CMD"] == StatCommand.SCALING_EVENT:
                        self.events.append(doc)
        finally:
            sock.close(0)
            context.term()

    def kinds(self) -> list[str]:
        return [e["Event"] for e in self.events]

    def finish(self) -> None:
        self.stop.set()
        self.join(5)


def test_a_full_host_gets_no_exchange_and_provisioner_none_raises_the_alarm(
    cluster: LocalCluster,
):
    queue = _start(cluster, **{"exchange.max.perhost": 1})
    watcher = KpiWatcher(cluster, queue)
    watcher.start()
    watcher.ready.wait(5)
    load = Load(cluster, queue, [1000, 1000])
    load.run_until(
        lambda: "capacity_exhausted" in watcher.kinds(), 20, "the capacity alarm", cluster.logs
    )
    load.close()
    watcher.finish()
    alarm = next(e for e in watcher.events if e["Event"] == "capacity_exhausted")
    assert "provisioner none starts no machine" in alarm["Reason"], alarm
    assert watcher.kinds()[0] == "scale_out", "the decision is on the stream before its outcome"
    assert "exchange_added" not in watcher.kinds()
    live = _live(cluster, queue)
    assert len(live["Exchanges"]) == 1
    assert live["Scaling"]["Events"][-1]["Event"] in ("capacity_exhausted", "scale_out")
    logs = cluster.logs()
    assert "capacity exhausted" in logs and "exchange.max.perhost" in logs
    with cluster.admin() as admin, pytest.raises(AdminRefused) as refused:
        admin.create_exchange(queue, "tx-by-hand")  # the refusal the policy got, by hand
    assert refused.value.reason == "no_capacity"


def test_load_removed_drains_and_retires_the_surplus_exchange_without_a_gap(
    cluster: LocalCluster,
):
    queue = _start(cluster, **{"scaling.lowwater.ms": 1500, "scaling.cooldown.ms": 2000})
    collector = Collector(cluster, queue)
    collector.start()
    watcher = KpiWatcher(cluster, queue)
    watcher.start()
    load = Load(cluster, queue, [1000, 1000, 50, 50])
    watcher.ready.wait(5)
    load.run_until(
        lambda: "publisher_moved" in watcher.kinds() and any(p.moves for p in load.publishers),
        25,
        "scale-out under load",
        cluster.logs,
    )
    added = next(e["Exchange"] for e in watcher.events if e["Event"] == "exchange_added")
    fronts = {x["Id"]: x["Front"] for x in _live(cluster, queue)["Exchanges"]}
    load.sizes = [0, 0, 50, 50]  # the heavy load stops; the light publishers go on
    load.run_until(lambda: "exchange_retired" in watcher.kinds(), 25, "scale-in", cluster.logs)
    for _ in range(25):  # and keep sending once the queue is back to one exchange
        load.step()
    retired = next(e for e in watcher.events if e["Event"] == "exchange_retired")
    scale_in = next(e for e in watcher.events if e["Event"] == "scale_in")
    assert "below the low-water mark" in scale_in["Reason"]
    assert retired["Exchange"] == scale_in["Exchange"]
    wait_for(lambda: len(_live(cluster, queue)["Exchanges"]) == 1, 10, "the retired one gone")
    with cluster.admin() as admin:
        recorded = next(q.fields() for q in admin.status().queues if q.info.name == queue)
    recorded = recorded["Exchanges"]
    assert [x["Id"] for x in recorded] != [retired["Exchange"]] and len(recorded) == 1
    assert not processes_with(retired["Exchange"]), "the retired exchange's process is gone"
    port = int(fronts[retired["Exchange"]].rsplit(":", 1)[1])
    assert all(port_is_free(p) for p in host_block("exchange", port, 0)), "its ports are free"
    assert added in (retired["Exchange"], recorded[0]["Id"])
    shown = cluster.cli("status", "--gcm", cluster.gcm).stdout
    assert "scaling default (exchanges 1..hosts, +1 -1)" in shown, shown
    assert "last: exchange_retired" in shown, shown
    load.close()
    watcher.finish()
    wait_for(lambda: collector.count >= sum(load.sent.values()), 15, "everything delivered")
    time.sleep(0.3)
    collector.finish()
    _assert_exact(collector, load.expected())


def test_rules_are_stored_returned_pushed_and_drive_scaling(cluster: LocalCluster):
    """RoQ's TestScalingStatMonitor, then the stored exchange rule makes the queue scale."""
    queue = _start(cluster, **{"scaling.highwater": 50.0})  # the implicit rule never fires
    context = new_context()
    listener = open_socket(context, Kind.PULL)
    port = cluster.ports.take(1)
    with cluster.as_cluster():  # a rules listener is a monitor's: the GCM pushes to the cluster
        bind(listener, "127.0.0.1", port)
    rules = {
        "AUTOSCALING_NAME": "r1",
        "AUTOSCALING_HOST": {"AUTOSCALING_HOST_CPU": 30, "AUTOSCALING_HOST_RAM": 4000},
        "AUTOSCALING_XCHANGE": {"AUTOSCALING_XCHANGE_THR": 60_000},
        "AUTOSCALING_Q": {"AUTOSCALING_Q_PROD_EXCH": 10000, "AUTOSCALING_THR_PROD_EXCH": 1e9},
    }
    try:
        with cluster.admin() as admin:
            admin.request({"CMD": 2008, "QName": queue, "Address": f"tcp://127.0.0.1:{port}"})
            admin.add_rules(queue, rules)
            stored = admin.get_rules(queue).fields()
        assert stored["AUTOSCALING_NAME"] == "r1"
        assert stored["AUTOSCALING_HOST"]["AUTOSCALING_HOST_CPU"] == 30
        assert stored["AUTOSCALING_XCHANGE"]["AUTOSCALING_XCHANGE_THR"] == 60_000
        assert stored["AUTOSCALING_Q"]["AUTOSCALING_Q_PROD_EXCH"] == 10000
        poller = Poller()
        poller.register(listener, READABLE)
        assert poller.poll(5000), "the rules were not pushed to the registered listener"
        pushed = bsonmsg.decode([listener.recv()])
        assert (
            pushed["QName"] == queue
            and pushed["AUTOSCALING_XCHANGE"] == stored["AUTOSCALING_XCHANGE"]
        )
    finally:
        listener.close(0)
        context.term()
    wait_for(
        lambda: _live(cluster, queue)["Scaling"]["Rules"]["Name"] == "r1",
        10,
        "the monitor to use rule r1",
    )
    shown = cluster.cli("scaling", "show", queue, "--json", "--gcm", cluster.gcm)
    assert shown.returncode == 0 and json.loads(shown.stdout)["AUTOSCALING_NAME"] == "r1"
    refused = cluster.cli(
        "scaling", "set", queue, "--exchange-throughput", "-5", "--gcm", cluster.gcm
    )
    assert refused.returncode == 1 and "AUTOSCALING_XCHANGE_THR" in refused.stderr, refused
    load = Load(cluster, queue, [1000, 1000])  # ~2 × 90 KB/s: above 60 KB/s, far below 50 × max
    load.run_until(
        lambda: "exchange_added" in _events(cluster, queue),
        20,
        "scale-out by r1",
        lambda: f"{json.dumps(_live(cluster, queue), default=str, indent=1)}\n{cluster.logs()}",
    )
    load.close()
    reason = next(
        e["Reason"] for e in _live(cluster, queue)["Scaling"]["Events"] if e["Event"] == "scale_out"
    )
    assert reason.startswith("exchange rule r1"), reason


@pytest.mark.parametrize(
    ("bad", "field"),
    [
        ({"AUTOSCALING_XCHANGE": {"AUTOSCALING_XCHANGE_THR": -5}}, "AUTOSCALING_XCHANGE_THR"),
        ({"AUTOSCALING_HOST": {"AUTOSCALING_HOST_CPU": "lots"}}, "AUTOSCALING_HOST_CPU"),
        ({"AUTOSCALING_Q": 7}, "AUTOSCALING_Q"),
        ({}, "no rule given"),
    ],
)
def test_invalid_rules_are_refused_naming_the_field_and_change_nothing(
    cluster: LocalCluster, bad: dict[str, Any], field: str
):
    queue = _start(cluster)
    good = {"AUTOSCALING_NAME": "keep", "AUTOSCALING_XCHANGE": {"AUTOSCALING_XCHANGE_THR": 1}}
    with cluster.admin() as admin:
        admin.add_rules(queue, good)
        with pytest.raises(AdminRefused) as refused:
            admin.add_rules(queue, {"AUTOSCALING_NAME": "bad", **bad})
        assert refused.value.reason == "bad_request" and field in str(refused.value)
        with pytest.raises(AdminRefused) as unknown:
            admin.add_rules("no-such-queue", good)
        assert unknown.value.reason == "unknown_queue"
        assert admin.get_rules(queue).name == "keep"
    wait_for(lambda: _live(cluster, queue)["Scaling"]["Rules"]["Name"] == "keep", 10, "rules kept")
    time.sleep(0.3)
    assert _live(cluster, queue)["Scaling"]["Rules"]["Name"] == "keep"


def test_flapping_load_does_not_scale_faster_than_the_cooldown(cluster: LocalCluster):
    cooldown_s = 3.0
    queue = _start(
        cluster,
        **{
            "scaling.window.ms": 400,  # short enough for the flapping to cross both marks
            "scaling.cooldown.ms": int(cooldown_s * 1000),
            "scaling.lowwater.ms": 0,
        },
    )
    collector = Collector(cluster, queue)
    collector.start()
    watcher = KpiWatcher(cluster, queue)
    watcher.start()
    watcher.ready.wait(5)
    load = Load(cluster, queue, [1000, 1000, 50])
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # 0.6 s at ~180 KB/s, 0.6 s at ~2 KB/s, and again
        load.sizes = [1000, 1000, 50] if int(time.monotonic() / 0.6) % 2 else [0, 0, 50]
        load.step()
    load.close()
    watcher.finish()
    decisions = [e["Time"] for e in watcher.events if e["Event"] in ("scale_out", "scale_in")]
    assert decisions, f"the load never made the queue scale\n{cluster.logs()}"
    gaps = [b - a for a, b in itertools.pairwise(decisions)]
    assert all(gap >= cooldown_s - 0.05 for gap in gaps), (gaps, watcher.kinds())
    assert len(decisions) <= 10 / cooldown_s + 1
    wait_for(lambda: collector.count >= sum(load.sent.values()), 15, "everything delivered")
    time.sleep(0.3)
    collector.finish()
    _assert_exact(collector, load.expected())
