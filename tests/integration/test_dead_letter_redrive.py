"""`roq group dlq redrive` and `purge` on a real cluster (docs/guarantees.md §12, docs/operations.md
"Dead letters"): letters made by a consumer's rejects, chosen by the filters, redriven to the
group (a consumer gets them again, once each) or purged, refused to a principal without admin,
and a kill -9 of the queue's monitor in the middle of a redrive of several steps loses and
repeats nothing. Every process is real, every kill a SIGKILL."""

from __future__ import annotations

import collections
import json
import os
import signal
import subprocess
from pathlib import Path

import pytest

from roq import limits
from roq.client.consumer import Consumer
from roq.client.publisher import Publisher
from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import LocalCluster, processes_with, wait_for

pytestmark = pytest.mark.integration

WORK = {"work.slot.messages": 100, "work.slot.ms": 200, "work.lease.ms": 2000}
MONITOR = "monitor q1 --bind"


def _dead_letters(cluster: LocalCluster, keys: dict[str, int]) -> int:
    """Publish `count` messages `<key>-<n>` per key and reject every one (to q1.g.dlq)."""
    total = sum(keys.values())
    with Publisher("q1", gcm=cluster.gcm, acks="leader", batch_bytes=4096) as publisher:
        for key, count in keys.items():
            for n in range(count):
                publisher.send(f"{key}-{n}".encode(), key.encode())
        publisher.flush()
    rejected = 0
    with Consumer("q1", "g", gcm=cluster.gcm) as consumer:
        for delivery in consumer.deliveries(timeout_s=30):
            delivery.reject("test: rejected")
            rejected += 1
            if rejected == total:
                break
        consumer.flush()
    assert rejected == total, f"{rejected} of {total} rejected\n{cluster.logs()}"
    return total


def _dlq(cluster: LocalCluster, command: str, *args: str) -> subprocess.CompletedProcess[str]:
    return cluster.cli("group", "dlq", command, "q1", "g", *args, "--gcm", cluster.gcm,
                       timeout_s=180)  # fmt: skip


def _shown(cluster: LocalCluster, *args: str) -> list[dict[str, object]]:
    shown = _dlq(cluster, "show", "--json", *args)
    assert shown.returncode == 0, shown.stderr
    return [json.loads(line) for line in shown.stdout.splitlines()]


def _consume(cluster: LocalCluster, expected: int) -> collections.Counter[str]:
    """What the group hands out now, acked, until `expected` came and then 3 s of nothing more
    (a duplicate would come within that: it is a slot of its own, leased at once)."""
    got: collections.Counter[str] = collections.Counter()
    deliveries: list[int] = []
    with Consumer("q1", "g", gcm=cluster.gcm) as consumer:
        while (delivery := consumer.next(30 if got.total() < expected else 3)) is not None:
            got[delivery.payload.decode()] += 1
            deliveries.append(delivery.deliveries)
            delivery.ack()
        consumer.flush()
    assert set(deliveries) <= {1}, f"delivery counts not reset: {collections.Counter(deliveries)}"
    return got


def _summary(done: subprocess.CompletedProcess[str]) -> str:
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()[-1]


def test_redrive_delivers_chosen_letters_again_once_and_purge_removes_them(
    cluster: LocalCluster,
):
    cluster.start_with_queue(**WORK)
    _dead_letters(cluster, {"a": 10, "b": 20})
    assert len(_shown(cluster)) == 30
    dry = _dlq(cluster, "purge", "--key", "a", "--dry-run")
    assert dry.returncode == 0 and "dry run: 10 letters would be purged" in dry.stdout, dry
    assert len(dry.stdout.splitlines()) == 11 and len(_shown(cluster)) == 30  # nothing changed
    assert _summary(_dlq(cluster, "purge", "--key", "a")).startswith("purged 10, already")
    left = _shown(cluster)
    assert len(left) == 20 and {x["Key"] for x in left} == {"b"}
    assert _summary(_dlq(cluster, "redrive", "--limit", "5")).startswith("redriven 5,")
    assert len(_shown(cluster)) == 15
    first = _consume(cluster, 5)
    assert first == collections.Counter(f"b-{n}" for n in range(5)), first  # oldest first
    assert _summary(_dlq(cluster, "redrive", "--older-than", "1h")).startswith("redriven 0,")
    assert _summary(_dlq(cluster, "redrive")).startswith("redriven 15, already removed 0")
    assert _shown(cluster) == []
    rest = _consume(cluster, 15)
    assert rest == collections.Counter(f"b-{n}" for n in range(5, 20)), rest
    again = _summary(_dlq(cluster, "redrive"))
    assert again.startswith("redriven 0,") and "skipped 0" in again, again


def test_a_principal_without_admin_is_refused_naming_the_group_and_the_permission(
    cluster: LocalCluster,
):
    cluster.start_with_queue(**WORK)
    _dead_letters(cluster, {"a": 3})
    reader = _principal(cluster, "reader", "q1", "subscribe", "consume")
    for command in ("redrive", "purge"):
        refused = cluster.cli("--credentials", str(reader), "group", "dlq", command, "q1", "g",
                              "--gcm", cluster.gcm, timeout_s=60)  # fmt: skip
        assert refused.returncode == 1, (refused.stdout, refused.stderr)
        assert f"group dlq {command} q1/g" in refused.stderr, refused.stderr
        assert "principal reader lacks permission 'admin' on queue 'q1'" in refused.stderr
    assert len(_shown(cluster)) == 3  # as the admin: nothing was changed


def _principal(cluster: LocalCluster, name: str, *grant: str) -> Path:
    """A principal made with `roq keys`, granted `grant`, once its hosts know it."""
    where = ["--zk", cluster.zk, "--namespace", cluster.namespace]
    path = cluster.tmp / f"{name}.json"
    made = cluster.cli("keys", "create", name, "--out", str(path), *where)
    assert made.returncode == 0, made.stderr
    granted = cluster.cli("keys", "grant", name, *grant, *where)
    assert granted.returncode == 0, granted.stderr
    table = cluster.tmp / "h1" / "log" / ".host-h1.principals"
    wait_for(lambda: table.exists() and f'"{name}"' in table.read_text(), 10, f"{name} known")
    wait_for(lambda: _refuses_admin(cluster, path), 20, f"{name} known to the GCM")
    return path


def _refuses_admin(cluster: LocalCluster, credentials: Path) -> bool:
    """The GCM knows the key: it refuses it by name (not as an unknown key)."""
    done = cluster.cli("--credentials", str(credentials), "group", "show", "q1", "g", "--gcm",
                       cluster.gcm, timeout_s=30)  # fmt: skip
    return "lacks permission 'admin'" in done.stderr


@pytest.mark.usefixtures("delivery_store")
def test_kill_9_of_the_monitor_mid_redrive_delivers_each_letter_once(cluster: LocalCluster):
    """Four steps of 200 letters; the monitor is killed once the first is answered. Whatever
    the kill interrupted, each step is stored whole or not at all, so after a second run every
    letter is delivered once again and none is left: a step whose slots were stored without the
    letters' removal would deliver them twice after the re-run, one whose removal was stored
    without its slots would lose them."""
    cluster.start_with_queue(**WORK)
    total = _dead_letters(cluster, {"k": 4 * limits.work_dlq_step_max})
    [pid] = processes_with(MONITOR, str(cluster.tmp))  # found first: killed at once below
    run = subprocess.Popen(
        roq_command("group", "dlq", "redrive", "q1", "g", "--gcm", cluster.gcm),
        env=child_environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert run.stderr is not None
        progress = run.stderr.readline()  # the first step's answer
        assert f"200/{total} letters" in progress, progress
        os.kill(pid, signal.SIGKILL)
        out, err = run.communicate(timeout=180)
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    wait_for(lambda: processes_with(MONITOR, str(cluster.tmp)) not in ([], [pid]), 30,
             "the monitor restarted\n" + cluster.logs())  # fmt: skip
    assert run.returncode in (0, 75), (run.returncode, progress + err)
    # the kill came mid-run: a step waited for the restarted monitor (the GCM answered late, or
    # busy and it was asked again), or the run gave up
    waited = ("asking again", "waiting for the GCM")
    assert any(w in err for w in waited) or run.returncode == 75, (progress + err, out)
    again = _summary(_dlq(cluster, "redrive"))
    assert _shown(cluster) == [], again
    got = _consume(cluster, total)
    twice = [m for m, n in got.items() if n > 1]
    assert not twice, f"delivered twice: {twice[:10]}; {out}{again}"
    assert sorted(got) == sorted(f"k-{n}" for n in range(total)), (
        f"{total - len(got)} lost; first run: {out} {err[-500:]}; second: {again}"
    )
