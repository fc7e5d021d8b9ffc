"""Consumer priorities and single active consumer on a real cluster (monitor/selection.py; docs/
guarantees.md, "Consumer groups"). Consumers are `roq work` processes; every kill is real."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
from test_workqueues import _publish, _worker  # the same roq work processes and publishes

from roq.client.consumer import Consumer
from roq.testing.cluster import LocalCluster, processes_with, wait_for

# with the groups in ZooKeeper and in the monitor's state log (conftest.py)
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("delivery_store")]

LEASE_S = 4.0  # the holder blocked in its --exec does not renew its lease: longer than the checks
WORK = {"work.slot.messages": 100, "work.slot.ms": 200, "work.lease.ms": int(LEASE_S * 1000)}


def _group(cluster: LocalCluster):  # type: ignore[no-untyped-def]
    with cluster.admin(timeout_ms=2000, retries=1) as admin:
        return admin.get_group("q1", "g")


def _joined(cluster: LocalCluster, count: int) -> None:
    wait_for(lambda: len(_group(cluster).consumers) == count, 30,
             f"{count} consumer(s) joined\n" + cluster.logs())  # fmt: skip


def test_a_higher_priority_consumer_gets_all_while_it_keeps_up_and_a_lower_one_takes_over(
    cluster: LocalCluster, tmp_path: Path
):
    """RabbitMQ's consumer priorities: the high consumer's prefetch (1,000) is never full with
    slots of 100 messages, so the low one gets nothing; once the high one stops (SIGTERM: it
    leaves the group), the low one takes every message."""
    cluster.start_with_queue(**WORK)
    low = _worker(cluster, tmp_path, "low", "--priority", "0", "--count", "300")
    _joined(cluster, 1)
    high = _worker(cluster, tmp_path, "high", "--priority", "10", "--prefetch", "1000")
    _joined(cluster, 2)
    first = _publish(cluster, 500, "a")
    wait_for(lambda: _group(cluster).acked >= 500, 60, "the first 500 acked\n" + cluster.logs())
    os.killpg(high.pid, signal.SIGTERM)
    taken_high = high.communicate(timeout=30)[0].decode().split()
    assert sorted(taken_high) == sorted(first), f"high took {len(taken_high)} of 500"
    _joined(cluster, 1)
    second = _publish(cluster, 300, "b")
    taken_low = low.communicate(timeout=60)[0].decode().split()
    assert sorted(taken_low) == sorted(second), f"low took {len(taken_low)}: {taken_low[:5]}"


def test_a_single_active_consumer_gets_everything_and_the_next_takes_over_after_its_kill(
    cluster: LocalCluster, tmp_path: Path
):
    """The first consumer of a single-active group holds 20 messages unacked (its --exec never
    ends); a second consumer gets nothing meanwhile. kill -9 of the first: within its lease the
    second takes over, and the 20 are handed to it again (their second delivery)."""
    cluster.start_with_queue(**WORK)
    holder = _worker(cluster, tmp_path, "holder", "--single-active", "--exec", "sleep 600",
                     "--prefetch", "20")  # fmt: skip
    _joined(cluster, 1)
    assert _group(cluster).single_active
    with Consumer("q1", "g", gcm=cluster.gcm, single_active=True) as other:
        sent = _publish(cluster, 20, "m")
        wait_for(lambda: _group(cluster).in_flight == 20, 30,
                 "the holder took the 20 messages\n" + cluster.logs())  # fmt: skip
        assert other.next(timeout_s=1.0) is None  # not the active one: nothing
        view = _group(cluster)
        assert [c.active for c in view.consumers].count(True) == 1
        assert next(c for c in view.consumers if c.active).consumer != other.consumer_id
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        killed_at = time.monotonic()
        taken = []
        for delivery in other.deliveries(count=20, timeout_s=LEASE_S + 10):
            taken.append(delivery.payload.decode())
            assert delivery.deliveries == 2  # handed to the holder once, now to this one
            delivery.ack()
        within = time.monotonic() - killed_at
        assert sorted(taken) == sorted(sent), cluster.logs()
        more = _publish(cluster, 10, "n")  # it is the active one now: it takes the new ones
        after = [d.payload.decode() for d in other.deliveries(count=10, timeout_s=20)]
        assert sorted(after) == sorted(more)
    assert within <= 3 * LEASE_S + 2.0, f"taken over {within:.2f} s after the kill"


def _group_after_restart(cluster: LocalCluster):  # type: ignore[no-untyped-def]
    try:
        return _group(cluster)
    except Exception:  # the restarted monitor answers busy while it reads its state back
        return None


def test_priorities_and_the_single_active_flag_survive_a_kill_9_of_the_monitor(
    cluster: LocalCluster,
):
    """Standings are kept in the group's record: after a kill -9 of the monitor (its host
    starts it again), the group is still single-active, each consumer keeps its priority, the
    higher one is still the active one and gets every message, the lower one none."""
    cluster.start_with_queue(**WORK)
    with (
        Consumer("q1", "g", gcm=cluster.gcm, single_active=True, priority=3) as high,
        Consumer("q1", "g", gcm=cluster.gcm, priority=1) as low,
    ):
        [pid] = processes_with("monitor q1 --bind", str(cluster.tmp))
        os.kill(pid, signal.SIGKILL)
        wait_for(lambda: processes_with("monitor q1 --bind", str(cluster.tmp)) not in ([], [pid]),
                 20, "the monitor restarted")  # fmt: skip
        wait_for(lambda: _group_after_restart(cluster) is not None, 30,
                 "the restarted monitor answers\n" + cluster.logs())  # fmt: skip
        view = _group(cluster)
        assert view.single_active
        standing = {c.consumer: (c.priority, c.active) for c in view.consumers}
        assert standing == {high.consumer_id: (3, True), low.consumer_id: (1, False)}
        sent = _publish(cluster, 5, "r")
        assert low.next(timeout_s=1.0) is None
        taken = [d.payload.decode() for d in high.deliveries(count=5, timeout_s=30)]
        assert sorted(taken) == sorted(sent), cluster.logs()
