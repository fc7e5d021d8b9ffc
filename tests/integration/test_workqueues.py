"""Work queues on a real cluster: consumer groups over slots (docs/guarantees.md, "Consumer
groups"). Consumers are `roq work` processes or `Consumer`s in this process; every kill is real."""

from __future__ import annotations

import collections
import itertools
import json
import os
import signal
import subprocess
import threading
import time
from pathlib import Path

import bson
import pytest

from roq.client.consumer import Consumer
from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.errors import RoqError
from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import LocalCluster, processes_with, wait_for

# every guarantee with the groups in ZooKeeper and in the monitor's state log (conftest.py)
pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("delivery_store")]

LEASE_S = 2.0
WORK = {"work.slot.messages": 100, "work.slot.ms": 200, "work.lease.ms": int(LEASE_S * 1000)}


def _publish(cluster: LocalCluster, count: int, prefix: str = "m", key: bytes = b"") -> list[str]:
    sent = [f"{prefix}{n}" for n in range(count)]
    # small batches: a slot holds whole batches, and 64 KiB ones hold 5,000 of these messages
    with Publisher("q1", gcm=cluster.gcm, acks="leader", batch_bytes=512) as publisher:
        for payload in sent:
            publisher.send(payload.encode(), key)
        publisher.flush()
    return sent


def _worker(cluster: LocalCluster, tmp: Path, name: str, *args: str) -> subprocess.Popen[bytes]:
    with (tmp / f"{name}.err").open("wb") as err:
        return subprocess.Popen(
            roq_command("work", "q1", "--group", "g", "--gcm", cluster.gcm, *args),
            env=child_environment(), stdout=subprocess.PIPE, stderr=err,
            start_new_session=True,
        )  # fmt: skip


def _consumers(cluster: LocalCluster, group: str = "g") -> int:
    with cluster.admin(timeout_ms=2000, retries=1) as admin:
        return len(admin.get_group("q1", group).consumers)


def test_four_consumers_share_the_messages_each_acked_exactly_once(
    cluster: LocalCluster, tmp_path: Path
):
    cluster.start_with_queue(**WORK)
    workers = [_worker(cluster, tmp_path, f"w{n}", "--timeout", "8") for n in range(4)]
    wait_for(lambda: _consumers(cluster) == 4, 30, "four consumers joined\n" + cluster.logs())
    sent = _publish(cluster, 10_000)
    outputs = [w.communicate(timeout=120)[0].decode().split() for w in workers]
    taken = [line for out in outputs for line in out]
    duplicates = [m for m, n in collections.Counter(taken).items() if n > 1]
    assert not duplicates, f"handed out twice: {duplicates[:10]}"
    assert sorted(taken) == sorted(sent), cluster.logs()
    shares = [len(out) / len(sent) for out in outputs]
    assert all(0.15 <= share <= 0.35 for share in shares), shares
    with cluster.admin() as admin:
        [group] = admin.list_groups("q1")
    assert (group.acked, group.lag, group.in_flight) == (10_000, 0, 0)


def test_a_killed_consumers_messages_go_to_another_within_the_lease(
    cluster: LocalCluster, tmp_path: Path
):
    cluster.start_with_queue(**WORK)
    holder = _worker(cluster, tmp_path, "holder", "--exec", "sleep 600", "--prefetch", "20")
    wait_for(lambda: _consumers(cluster) == 1, 30, "the holder joined\n" + cluster.logs())
    sent = _publish(cluster, 20)

    def held() -> int:
        with cluster.admin(timeout_ms=2000, retries=1) as admin:
            return admin.get_group("q1", "g").in_flight

    wait_for(lambda: held() == 20, 15, "the holder leased the 20 messages\n" + cluster.logs())
    with Consumer("q1", "g", gcm=cluster.gcm) as other:
        os.killpg(holder.pid, signal.SIGKILL)
        holder.wait(timeout=10)
        killed_at = time.monotonic()
        taken = []
        for delivery in other.deliveries(count=20, timeout_s=LEASE_S + 5):
            taken.append(delivery.payload.decode())
            assert delivery.deliveries == 2  # handed to the holder once, now to us
            delivery.ack()
        within = time.monotonic() - killed_at
    assert sorted(taken) == sorted(sent)
    assert within <= LEASE_S + 1.0, f"redelivered {within:.2f} s after the kill"


def _burst(cluster: LocalCluster, count: int) -> list[str]:
    """`count` messages published at once, in one batch: one slot of the group."""
    sent = [f"b{n}" for n in range(count)]
    with Publisher("q1", gcm=cluster.gcm, acks="leader", linger_ms=1000) as publisher:
        for payload in sent:
            publisher.send(payload.encode())
        publisher.flush()
    return sent


def _shares(workers: list[subprocess.Popen[bytes]], sent: list[str]) -> list[int]:
    """What each worker printed, checked: every message once, none twice."""
    outputs = [w.communicate(timeout=120)[0].decode().split() for w in workers]
    taken = [line for out in outputs for line in out]
    assert sorted(taken) == sorted(sent), f"{len(taken)} of {len(sent)}"
    return [len(out) for out in outputs]


def test_a_burst_in_one_slot_is_shared_among_the_consumers_waiting_for_it(
    cluster: LocalCluster, tmp_path: Path
):
    """Two idle `roq work` consumers (100 messages handed out at most, the default), then
    1,000 messages at once in one batch, so one slot: the consumer that leases it holds 100;
    the other, finding no slot free, takes the second half of the rest (a split slot). Alone
    each took >= 30 % (the issue's target; docs/benchmarks.md measures the shares). How much
    the second gets depends on how soon it asks: a part split off for it that it has not
    leased yet is leased by the holder once through its own (work goes to who asks), so a
    consumer starved of CPU gets less: 21 % and 14 % on the loaded CI machine. The bound shows
    the burst is shared at all (before the split, the second consumer got none)."""
    cluster.start_with_queue(**WORK)
    workers = [_worker(cluster, tmp_path, f"w{n}", "--timeout", "5") for n in range(2)]
    wait_for(lambda: _consumers(cluster) == 2, 30, "two consumers joined\n" + cluster.logs())
    shares = _shares(workers, _burst(cluster, 1000))
    assert min(shares) >= 50, shares


def test_slow_jobs_published_at_once_are_shared_by_the_consumers_that_run_them(
    cluster: LocalCluster, tmp_path: Path
):
    """Two `roq work --exec` consumers taking 0.1 s per message (one held at a time, the
    default with --exec) and 40 messages at once: each runs 20 ± 4 of them (before, the one
    that leased the slot ran all 40 while the other idled)."""
    cluster.start_with_queue(**WORK)
    job = "cat; echo; sleep 0.1"
    workers = [_worker(cluster, tmp_path, f"w{n}", "--exec", job, "--timeout", "4")
               for n in range(2)]  # fmt: skip
    wait_for(lambda: _consumers(cluster) == 2, 30, "two consumers joined\n" + cluster.logs())
    shares = _shares(workers, _burst(cluster, 40))
    assert all(16 <= share <= 24 for share in shares), shares


def test_a_poison_message_reaches_the_dead_letters_after_max_deliveries(
    cluster: LocalCluster, tmp_path: Path
):
    cluster.start_with_queue(**WORK)
    _publish(cluster, 1, prefix="poison")
    _publish(cluster, 3, prefix="fine")
    # The worker dies (kill -9 of itself) on the poison message, every time it gets it.
    crash = 'read p; if [ "$p" = poison0 ]; then kill -9 $PPID; sleep 5; fi'
    crashes = 0
    deadline = time.monotonic() + 90
    while time.monotonic() < deadline:
        worker = _worker(cluster, tmp_path, f"w{crashes}", "--exec", crash, "--timeout", "6")
        code = worker.wait(timeout=60)
        if code != -signal.SIGKILL:
            break
        crashes += 1
    assert crashes == 5, f"{crashes} crashes\n{cluster.logs()}"
    with Subscriber("q1.g.dlq", gcm=cluster.gcm, start="beginning") as dead:
        [letter] = [bson.decode(r.payload) for r in dead.messages(count=1, timeout_s=20)]
    assert letter["Payload"] == b"poison0"
    assert (letter["Queue"], letter["Group"], letter["Deliveries"]) == ("q1", "g", 5)
    assert letter["Exchange"] and letter["Offset"] == 0 and letter["Reason"]
    with cluster.admin() as admin:
        group = admin.get_group("q1", "g")
    assert (group.dead_letters, group.acked, group.lag) == (1, 3, 0)
    # the operator's view, decoded (issue 32: `roq sub q1.g.dlq` printed raw BSON)
    shown = cluster.cli("group", "dlq", "show", "q1", "g", "--json", "--gcm", cluster.gcm,
                        timeout_s=60)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    [line] = [json.loads(text) for text in shown.stdout.splitlines()]
    assert (line["Payload"], line["Deliveries"], line["Group"]) == ("poison0", 5, "g")
    assert 0 <= time.time() - line["DeadAt"] < 600  # when it was dead-lettered
    # filters (issue 33): by key, by age; the table names why, when and after how many
    for args, expected in ((["--key", "other"], 0), (["--older-than", "1h"], 0),
                           (["--newer-than", "1h", "--limit", "1"], 1)):  # fmt: skip
        chosen = cluster.cli("group", "dlq", "show", "q1", "g", "--json", *args, "--gcm",
                             cluster.gcm, timeout_s=60)  # fmt: skip
        assert len(chosen.stdout.splitlines()) == expected, (args, chosen.stdout, chosen.stderr)
    shown = cluster.cli("group", "dlq", "show", "q1", "g", "--gcm", cluster.gcm, timeout_s=60)
    header, body = shown.stdout.splitlines()
    assert header.split()[:3] == ["WHEN", "(UTC)", "ATTEMPTS"] and "poison0" in body, shown


def _pids(cluster: LocalCluster, fragment: str) -> list[int]:
    """This cluster's processes whose command line holds `fragment` (other tests on the machine
    run queues named q1 too: the cluster's own log directory tells them apart)."""
    marker = str(cluster.tmp)
    return processes_with(fragment, marker)


def _restart(cluster: LocalCluster, fragment: str) -> None:
    """kill -9 one process; its host starts it again (same command line, same ports)."""
    [pid] = _pids(cluster, fragment)
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: _pids(cluster, fragment) not in ([], [pid]), 20, f"{fragment} restarted")


def test_kill_9_of_the_monitor_and_an_exchange_loses_nothing_and_repeats_no_ack(
    cluster: LocalCluster,
):
    cluster.start_with_queue(2, **WORK, **{"exchange.max.perhost": 4})
    with cluster.admin() as admin:
        second = admin.create_exchange("q1", "work-tx-h2", host="h2").exchange.fields()
    first = next(x for x in _status_exchanges(cluster) if x != second["Id"])
    sent = _publish(cluster, 1000, prefix="a") + _publish(cluster, 1000, prefix="b")
    acked: set[str] = set()
    again: list[str] = []
    kills = {400: "monitor q1 --bind", 1000: first}
    with Consumer("q1", "g", gcm=cluster.gcm) as consumer:
        for delivery in consumer.deliveries(timeout_s=30):
            payload = delivery.payload.decode()
            if payload in acked:
                again.append(payload)
            delivery.ack()
            consumer.flush()  # confirmed: from here on it must never come back
            acked.add(payload)
            if len(acked) in kills:
                _restart(cluster, kills.pop(len(acked)))
            if len(acked) == len(sent):
                break
    assert not again, f"acknowledged, then delivered again: {again[:10]}"
    assert acked == set(sent), f"{len(set(sent) - acked)} lost\n{cluster.logs()}"
    assert not kills


def _status_exchanges(cluster: LocalCluster) -> list[str]:
    with cluster.admin() as admin:
        [queue] = admin.status().queues
    return [x.fields()["Id"] for x in queue.exchanges]


def test_ordered_mode_keeps_each_key_in_order_on_one_consumer_at_a_time(cluster: LocalCluster):
    cluster.start_with_queue(**WORK)
    events: list[tuple[str, str, int, float, float]] = []  # consumer, key, n, got, acked
    lock = threading.Lock()
    first_in = threading.Event()

    def work(name: str, leave_after: int | None = None) -> None:
        with Consumer("q1", "g", gcm=cluster.gcm, ordered=True) as consumer:
            first_in.set()
            for taken, delivery in enumerate(consumer.deliveries(timeout_s=4), 1):
                got = time.monotonic()
                time.sleep(0.0005)
                delivery.ack()
                key, n = delivery.payload.decode().split("-")
                with lock:
                    events.append((name, key, int(n), got, time.monotonic()))
                if taken == leave_after:
                    return  # leaves the group with its slot

    threads = [threading.Thread(target=work, args=("a",))]
    threads[0].start()
    first_in.wait(30)
    with Publisher("q1", gcm=cluster.gcm, acks="leader", batch_bytes=512) as publisher:
        for n in range(300):
            for k in range(4):
                publisher.send(f"k{k}-{n}".encode(), f"k{k}".encode())
        publisher.flush()
    threads.append(threading.Thread(target=work, args=("leaver", 150)))
    threads[1].start()
    time.sleep(0.5)  # a consumer joining mid-stream
    threads.append(threading.Thread(target=work, args=("joiner",)))
    threads[2].start()
    for thread in threads:
        thread.join(timeout=120)
    by_key: dict[str, list[tuple[str, str, int, float, float]]] = collections.defaultdict(list)
    for event in sorted(events, key=lambda e: e[3]):
        by_key[event[1]].append(event)
    assert sorted(by_key) == ["k0", "k1", "k2", "k3"]
    for key, seen in by_key.items():
        assert [e[2] for e in seen] == list(range(300)), f"{key} out of order or incomplete"
        for before, after in itertools.pairwise(seen):
            if before[0] != after[0]:  # handed over: the first let go before the next took it
                assert before[4] <= after[3], f"{key}: {before} and {after} overlap"
    assert {e[0] for e in events} >= {"a", "leaver"}


def test_an_exchange_added_during_consumption_is_consumed_too(cluster: LocalCluster):
    cluster.start_with_queue(2, **WORK, **{"exchange.max.perhost": 4, "exchange.warmup": 200})
    sent = _publish(cluster, 500, prefix="old")
    taken: dict[str, str] = {}
    with Consumer("q1", "g", gcm=cluster.gcm) as consumer:
        for delivery in consumer.deliveries(count=250, timeout_s=20):
            taken[delivery.payload.decode()] = delivery.exchange
            delivery.ack()
        with cluster.admin() as admin:
            added = admin.create_exchange("q1", "work-scale-out", host="h2").exchange.fields()
        wait_for(lambda: len(_status_exchanges(cluster)) == 2, 20, "the second exchange")
        # new publishers go to the exchange with the fewest: the new one
        sent += _publish(cluster, 500, prefix="new1") + _publish(cluster, 500, prefix="new2")
        for delivery in consumer.deliveries(timeout_s=10):
            taken[delivery.payload.decode()] = delivery.exchange
            delivery.ack()
            if len(taken) == len(sent):
                break
    assert set(taken) == set(sent), f"{len(set(sent) - set(taken))} never consumed"
    assert added["Id"] in set(taken.values()), "nothing came from the new exchange"


def test_a_group_with_a_key_prefix_gets_only_those_keys_and_the_rest_counts_as_settled(
    cluster: LocalCluster,
):
    cluster.start_with_queue(**WORK)
    with Publisher("q1", gcm=cluster.gcm, acks="leader", batch_bytes=512) as publisher:
        for n in range(600):
            key = (b"eu.", b"us.", b"eu")[n % 3] + str(n % 7).encode()
            publisher.send(f"{key.decode()}-{n}".encode(), key)
        publisher.flush()
    wanted = {f"eu.{n % 7}-{n}" for n in range(0, 600, 3)}
    taken: list[str] = []
    with Consumer("q1", "eu", gcm=cluster.gcm, prefix=b"eu.") as consumer:
        assert consumer.prefix == b"eu."
        for delivery in consumer.deliveries(timeout_s=5):
            assert delivery.key.startswith(b"eu.")
            taken.append(delivery.payload.decode())
            delivery.ack()
        consumer.flush()
    assert sorted(taken) == sorted(wanted), f"{len(taken)} of {len(wanted)}"
    with Consumer("q1", "all", gcm=cluster.gcm) as everything:  # another group: every key
        assert everything.prefix == b""
        for every in everything.deliveries(count=600, timeout_s=5):
            every.ack()
        assert everything.stats["acked"] == 600
    with cluster.admin() as admin:
        group = admin.get_group("q1", "eu")
    # the other keys are settled for this group: no lag, only its own messages acked
    assert (group.prefix, group.acked, group.lag, group.in_flight) == (b"eu.", 200, 0, 0)
    with pytest.raises(RoqError, match="prefix"):
        Consumer("q1", "eu", gcm=cluster.gcm, prefix=b"us.")  # the group's prefix is fixed


# Issue 32: an idle `roq work` must stop on Ctrl-C or SIGTERM (it used to wait for a message
# first: for ever on an idle queue). The goal is 1 s; the bound here is liveness on a loaded
# machine, and the old code fails it by never exiting.
STOP_BOUND_S = 10.0


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_an_idle_roq_work_stops_on_a_signal_and_leaves_its_group(
    cluster: LocalCluster, tmp_path: Path, signum: int
):
    cluster.start_with_queue(**WORK)
    worker = _worker(cluster, tmp_path, "idle")
    try:
        wait_for(lambda: _consumers(cluster) == 1, 30, "the consumer joined\n" + cluster.logs())
        worker.send_signal(signum)
        assert worker.wait(timeout=STOP_BOUND_S) == 0
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)
    # it left its group: its slots are given back, not held until its lease ends
    wait_for(lambda: _consumers(cluster) == 0, 10, "the consumer left its group")
