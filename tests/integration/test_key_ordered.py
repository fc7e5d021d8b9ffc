"""Key-ordered consumer groups on a real cluster (monitor/keyed.py; docs/guarantees.md, "Consumer
groups"): two exchanges, four consumer processes (one killed with SIGKILL mid-stream), many keys,
and a publisher relocated to the other exchange mid-stream. Each consumer writes, per message,
when its application got it and when it acked it (CLOCK_MONOTONIC: one clock for every process
of the machine), and the test checks every message against them."""

from __future__ import annotations

import collections
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from roq.client.publisher import Publisher
from roq.system.spawn import child_environment
from roq.testing.cluster import LocalCluster, wait_for

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("delivery_store")]

LEASE_S = 2.0
WORK = {
    "work.slot.messages": 200,
    "work.slot.ms": 200,
    "work.lease.ms": int(LEASE_S * 1000),
    # a heavy publisher is relocated to the second exchange once it is placeable (as
    # test_dataplane.py::test_heavy_publisher_is_reallocated_without_loss_or_reordering)
    "exchange.max.perhost": 4,
    "exchange.warmup": 200,
    "exchange.max.throughput": 200_000,
    "relocate.coldstart": 0.0,
    "relocate.hysteresis": 2,
    "relocate.cooldown": 2000,
}

# A consumer of the key-ordered group g, until the file `stop` exists: per message a line "G
# <got> <producer> <key> <n>" when the application gets it, and "A <acked> …" once it acked it,
# 5 ms later (its work: the heavy publisher alone sends 400 msg/s, so a backlog builds up in
# each log, and a key's records are still unacked in the first log when its publisher moves).
CONSUMER = """
import os, sys, time
from roq.client.consumer import Consumer
queue, gcm, out, stop = sys.argv[1:5]
with open(out, "a", buffering=1) as lines:
    with Consumer(queue, "g", gcm=gcm, key_ordered=True, inflight=20) as consumer:
        lines.write("joined\\n")
        while not os.path.exists(stop):
            delivery = consumer.next(timeout_s=0.2)
            if delivery is None:
                continue
            n = delivery.payload.split(b"|")[0].decode()
            what = f"{delivery.producer_id.hex()} {delivery.key.decode()} {n}"
            lines.write(f"G {time.monotonic()} {what}\\n")
            time.sleep(0.005)  # its work: a backlog builds up while two consumers could not keep up
            delivery.ack()
            lines.write(f"A {time.monotonic()} {what}\\n")
"""

Event = tuple[str, float, float]  # consumer, got, acked (the kill's time if never acked)


def _consumer(cluster: LocalCluster, tmp: Path, name: str) -> subprocess.Popen[bytes]:
    with (tmp / f"{name}.err").open("wb") as err:
        return subprocess.Popen(
            [sys.executable, "-c", CONSUMER, "q1", cluster.gcm, str(tmp / f"{name}.out"),
             str(tmp / "stop")],
            env=child_environment(), stderr=err, start_new_session=True,
        )  # fmt: skip


def _events(tmp: Path, names: list[str], killed_at: dict[str, float]) -> dict[Any, list[Any]]:
    """(producer, key) → [(n, consumer, got, acked)], in the order got."""
    streams: dict[Any, list[Any]] = collections.defaultdict(list)
    for name in names:
        path = tmp / f"{name}.out"
        if not path.exists():
            continue
        got: dict[tuple[str, str, int], list[float]] = collections.defaultdict(list)
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) != 5:
                continue  # "joined", or the line a kill cut short
            what = (parts[2], parts[3], int(parts[4]))
            if parts[0] == "G":
                got[what].append(float(parts[1]))
            elif got[what]:
                streams[what[:2]].append((what[2], name, got[what].pop(0), float(parts[1])))
        for what, times in got.items():  # never acked: held until its consumer was killed
            for at in times:
                streams[what[:2]].append((what[2], name, at, killed_at.get(name, float("inf"))))
    for events in streams.values():
        events.sort(key=lambda e: e[2])
    return streams


def _received(tmp: Path, names: list[str]) -> int:
    return sum(len(s) for s in _events(tmp, names, {}).values())


def _publish_and_move(cluster: LocalCluster) -> tuple[collections.Counter[Any], Publisher]:
    """A heavy publisher (20 keys) and three light ones (their own keys) on the first
    exchange; a second exchange; the heavy one sends until it is moved there, and on."""
    heavy = Publisher("q1", gcm=cluster.gcm, linger_ms=1, acks="leader")
    light = [Publisher("q1", gcm=cluster.gcm, linger_ms=1, acks="leader") for _ in range(3)]
    start_front = heavy.exchange
    with cluster.admin() as admin:
        admin.create_exchange("q1", "tx-keyed")
    sent: collections.Counter[Any] = collections.Counter()
    ticks = iter(range(1_000_000))

    def send(publisher: Publisher, key: str, size: int) -> None:
        n = sent[(publisher.producer_id.hex(), key)]
        publisher.send(f"{n}|".encode().ljust(size, b"."), key.encode())
        sent[(publisher.producer_id.hex(), key)] += 1

    def moved_under_load() -> bool:  # each 0.05 s: ~400 KB/s from the heavy one
        for k in range(20):
            send(heavy, f"h{k}", 1000)
        tick = next(ticks)
        for i, publisher in enumerate(light):
            send(publisher, f"l{i}-{tick % 7}", 200)
        return heavy.exchange != start_front

    with contextlib.suppress(TimeoutError):  # the assertion below says what did not happen
        wait_for(moved_under_load, 20, "the heavy publisher moved", interval_s=0.05)
    assert heavy.exchange != start_front, f"heavy publisher not moved\n{cluster.logs()}"
    for _ in range(40):  # on the new exchange: the same keys, their sequences going on
        for k in range(20):
            send(heavy, f"h{k}", 1000)
        time.sleep(0.02)
    for publisher in [heavy, *light]:
        publisher.close()
    return sent, heavy


def _check_streams(streams: dict[Any, list[Any]], sent: collections.Counter[Any],
                   killed: str) -> None:  # fmt: skip
    assert set(streams) == set(sent), f"streams differ: {set(sent) ^ set(streams)}"
    for stream, events in streams.items():
        numbers = [e[0] for e in events]
        assert set(numbers) == set(range(sent[stream])), f"{stream}: lost messages"
        firsts = list(dict.fromkeys(numbers))  # each message's first delivery, in time order
        assert firsts == sorted(firsts), f"{stream}: out of order {firsts}"
        survivors = [e[0] for e in events if e[1] != killed]
        assert survivors == sorted(set(survivors)), f"{stream}: out of order or twice"
        again = [n for n, count in collections.Counter(numbers).items() if count > 1]
        held_by_killed = {e[0] for e in events if e[1] == killed}
        assert set(again) <= held_by_killed, f"{stream}: {again} twice, not the killed one's"


def _check_one_holder(streams: dict[Any, list[Any]]) -> None:
    """Per key, over every producer: no consumer gets a message of it while another holds one
    (got and not acked, or got by the killed consumer and not acked before its kill)."""
    by_key: dict[str, list[Any]] = collections.defaultdict(list)
    for (_, key), events in streams.items():
        by_key[key] += events
    for key, events in by_key.items():
        held_until: dict[str, float] = {}
        for n, consumer, got, acked in sorted(events, key=lambda e: e[2]):
            for other, until in held_until.items():
                assert other == consumer or until <= got, (
                    f"key {key}: {consumer} got #{n} at {got:.3f} while {other} held one "
                    f"until {until:.3f}"
                )
            held_until[consumer] = max(held_until.get(consumer, 0.0), acked)


def test_key_ordered_group_keeps_keys_in_order_on_one_consumer_across_a_move_and_a_kill(
    cluster: LocalCluster, tmp_path: Path
):
    cluster.start_with_queue(**WORK)
    names = ["c0", "c1", "c2", "c3"]
    consumers = {name: _consumer(cluster, tmp_path, name) for name in names}

    def joined() -> int:
        with cluster.admin(timeout_ms=2000, retries=1) as admin:
            return len(admin.get_group("q1", "g").consumers)

    wait_for(lambda: joined() == 4, 60, "four consumers joined\n" + cluster.logs())
    killed_at: dict[str, float] = {}
    sent, _ = _publish_and_move(cluster)
    total = sum(sent.values())
    wait_for(lambda: _received(tmp_path, names) >= total // 3, 60, "a third consumed")
    # the consumer that took the most so far (one whose parts had nothing yet would be no test)
    taken = collections.Counter(e[1] for es in _events(tmp_path, names, {}).values() for e in es)
    killed = taken.most_common(1)[0][0]
    os.killpg(consumers[killed].pid, signal.SIGKILL)
    consumers[killed].wait(timeout=10)
    killed_at[killed] = time.monotonic()

    def complete() -> bool:
        streams = _events(tmp_path, names, killed_at)
        return all(len({e[0] for e in streams.get(s, [])}) == n for s, n in sent.items())

    wait_for(complete, 120, "every message consumed\n" + cluster.logs(), interval_s=0.5)
    (tmp_path / "stop").touch()
    for name, process in consumers.items():
        if name != killed:
            assert process.wait(timeout=30) == 0, (tmp_path / f"{name}.err").read_text()
    streams = _events(tmp_path, names, killed_at)
    _check_streams(streams, sent, killed)
    _check_one_holder(streams)
    shares = collections.Counter(e[1] for events in streams.values() for e in events)
    assert len(shares) >= 3, f"the keys were not spread over the consumers: {shares}"
