"""Availability under faults, on 127.0.0.1 (the fault harness's two availability failures, made
deterministic): publishers leave an exchange whose log disk is full for one that can append,
and come back once it can again; publishers of a killed monitor's host are acknowledged again
within zk.session.timeout + 5 s, also when the leading GCM dies with that host."""

from __future__ import annotations

import contextlib
import errno
import json
import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from roq.client.publisher import Publisher, PublishError
from roq.errors import EXIT_NOT_SERVING
from roq.testing.cluster import Daemon, LocalCluster, wait_for

pytestmark = pytest.mark.integration

SESSION_S = 4.0  # zk.session.timeout of the test cluster (LocalCluster's default)
GRACE_MS = 500  # host.loss.grace, as in test_hostloss.py
# The goal (issue 21): acknowledged again within the session + 5 s, measured by
# benchmarks/fault_availability.py and benchmarks/hostloss_failover.py (docs/benchmarks.md).
# A test asserts liveness, as the fault harness does (tests/faults/faultrun.py): 3× the goal,
# so a loaded CI machine's 9.1 s is not a failure and a publisher that never resumes is.
RESUME_GOAL_S = SESSION_S + 5
RESUME_BOUND_S = 3 * RESUME_GOAL_S
HOST = {"exchange.max.perhost": 4, "exchange.warmup": 500, "replicationFactor": 2}


def _status(cluster: LocalCluster) -> dict[str, Any]:
    result = cluster.cli("status", "--json", "--gcm", cluster.gcm, timeout_s=60)
    # 5: a queue is NOT SERVING (printed all the same), as it may be while a host is lost
    assert result.returncode in (0, EXIT_NOT_SERVING), result.stderr + cluster.logs()
    return dict(json.loads(result.stdout))


def _queue(cluster: LocalCluster) -> dict[str, Any]:
    return next(q for q in _status(cluster)["Queues"] if q["Name"] == "q1")


def _live_exchange(cluster: LocalCluster, exchange_id: str) -> dict[str, Any]:
    """The exchange as q1's monitor knows it ({} if it does not)."""
    live = _queue(cluster).get("Live") or {}
    return next((x for x in live.get("Exchanges", []) if x["Id"] == exchange_id), {})


def _queue_on_two_hosts(cluster: LocalCluster) -> dict[str, str]:
    """q1's monitor and first exchange on h1, a second exchange on h2; front → host."""
    with cluster.admin() as admin:
        admin.create_queue("q1", "h1")
        admin.create_exchange("q1", "availability-tx-h2", host="h2")
    wait_for(lambda: len(_queue(cluster)["Exchanges"]) == 2, 15, "q1's two exchanges")

    def placeable() -> list[bool]:
        live = _queue(cluster).get("Live") or {}
        return [x["Placeable"] for x in live.get("Exchanges", [])]

    wait_for(lambda: placeable() == [True, True], 15, "both exchanges past exchange.warmup")
    return {x["Front"]: x["Host"] for x in _queue(cluster)["Exchanges"]}


def _publishers_on(
    fronts: dict[str, str], host: str, **where: str
) -> tuple[Publisher, list[Publisher]]:
    """A publisher the monitor placed on `host`'s exchange, and the others made on the way."""
    others = []
    for _ in range(8):
        pub = Publisher("q1", acks="all", linger_ms=1, **where)
        if fronts.get(pub.exchange or "") == host:
            return pub, others
        others.append(pub)
    raise AssertionError(f"no publisher placed on {host}: {fronts}")


# --- a full log disk --------------------------------------------------------------------------
@contextlib.contextmanager
def _tmpfs(path: Path, size: str) -> Iterator[Path]:
    """A small tmpfs at `path`, always unmounted (lazily: the host's exchange may still hold a
    file open when the test ends; the kernel frees it once closed)."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs (a disk that fills) needs root")
    path.mkdir(parents=True)
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(path)], check=True)
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


def _fill(directory: Path) -> Path:
    """Write zeros until the file system is full (ENOSPC)."""
    filler = directory / "filler"
    chunk = b"\0" * (1 << 20)
    with filler.open("wb") as handle:
        while True:
            try:
                handle.write(chunk)
                handle.flush()
            except OSError as error:
                assert error.errno == errno.ENOSPC, error
                return filler


def _acknowledged_elsewhere(pub: Publisher, away_from: str, timeout_s: float) -> tuple[float, int]:
    """Send and flush one message at a time until one is acknowledged by another exchange than
    `away_from` (the full disk's may take a few more small batches into its last page): the
    seconds that took, and the refusals on the way."""
    started, refusals, sent = time.monotonic(), 0, 0
    while time.monotonic() - started < timeout_s:
        pub.send(f"full-{sent}".encode())
        sent += 1
        try:
            pub.flush(timeout_s=timeout_s)
        except PublishError:  # refused for want of space: not acknowledged
            refusals += 1
            continue
        if pub.exchange != away_from:
            return time.monotonic() - started, refusals
        time.sleep(0.02)
    raise AssertionError(f"not acknowledged elsewhere within {timeout_s} s ({refusals} refused)")


def test_a_full_log_disk_moves_publishers_to_an_exchange_that_can_append(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    with _tmpfs(tmp_path / "h1-disk", "16m") as disk:
        cluster.start_gcm()
        # min.insync.copies 1: this is the move away from a full disk. With 2 (the default),
        # h2's log has no copy while h1's disk is full (it takes no copy either), and acks=all
        # is refused until it has room again (guarantees §10)
        lenient = {**HOST, "min.insync.copies": 1}
        cluster.start_host("h1", directory=str(disk), **lenient)
        cluster.start_host("h2", **lenient)
        cluster.wait_ready(hosts=2)
        fronts = _queue_on_two_hosts(cluster)
        full_front = next(f for f, h in fronts.items() if h == "h1")
        full_id = next(x["Id"] for x in _queue(cluster)["Exchanges"] if x["Front"] == full_front)
        victim, others = _publishers_on(fronts, "h1", gcm=cluster.gcm)
        try:
            victim.send(b"before")
            victim.flush(timeout_s=20)

            filler = _fill(disk)
            took_s, refusals = _acknowledged_elsewhere(victim, full_front, RESUME_BOUND_S)
            print(f"acknowledged on another exchange {took_s:.2f} s after the disk filled "
                  f"({refusals} refusals)")  # fmt: skip
            assert fronts[victim.exchange or ""] == "h2", (victim.exchange, fronts)
            assert victim.moves >= 1
            refusing = _live_exchange(cluster, full_id)
            assert refusing.get("Refusing") and refusing["Placeable"] is False, refusing
            shown = cluster.cli("status", "--gcm", cluster.gcm, timeout_s=60).stdout
            assert "REFUSING APPENDS" in shown, shown
            # no new publisher is placed on the exchange that cannot append
            fresh = [Publisher("q1", gcm=cluster.gcm, acks="all", linger_ms=1) for _ in range(3)]
            others += fresh
            # (the queue may have a third exchange by now: the full one holds no copy)
            assert all(p.exchange != full_front for p in fresh), (full_front, fronts)

            filler.unlink()  # room again: the exchange takes publishers again
            wait_for(
                lambda: _live_exchange(cluster, full_id).get("Placeable") is True,
                10,
                f"exchange {full_id} placeable again\n{cluster.logs()}",
                interval_s=0.5,
            )
            assert "Refusing" not in _live_exchange(cluster, full_id)
            back = Publisher("q1", gcm=cluster.gcm, acks="all", linger_ms=1)
            others.append(back)
            back.send(b"after")
            back.flush(timeout_s=20)
        finally:
            for pub in [victim, *others]:
                with contextlib.suppress(PublishError):
                    pub.close(timeout_s=5)
            cluster.stop()  # before the tmpfs goes: its exchange writes there


# --- the monitor's host and the leading GCM killed together ------------------------------------


@pytest.mark.parametrize("grace", [GRACE_MS, None], ids=["short-grace", "default-grace"])
def test_publishers_of_a_killed_monitors_host_are_acknowledged_again_within_the_bound(
    cluster: LocalCluster, grace: int | None
) -> None:
    """As the fault harness's kill -9 of m1: the host of q1's monitor and of one exchange dies
    with the leading GCM; the standby GCM re-places the monitor and the publishers follow.
    With the default host.loss.grace (6 s) too (issue 30 item 5): the monitor moves once the
    host's session is gone, the grace holds back only the exchanges' replacement (it was
    session + grace + ~2.6 s = 14.6 s with the defaults)."""
    settings = {} if grace is None else {"host.loss.grace": grace}
    leader = cluster.start_gcm(**settings)
    cluster.wait_ready(hosts=0)
    standby = cluster.start_gcm(**settings)
    h1 = cluster.start_host("h1", **HOST)
    for name in ("h2", "h3"):
        cluster.start_host(name, **HOST)
    cluster.wait_ready(hosts=3)
    fronts = _queue_on_two_hosts(cluster)
    # through ZooKeeper, as the fault harness's workload: the GCM that answers changes
    victim, others = _publishers_on(fronts, "h1", zk=cluster.zk, namespace=cluster.namespace)
    try:
        victim.send(b"before")
        victim.flush(timeout_s=20)

        cluster.kill(h1)
        cluster.kill(leader)
        killed = time.monotonic()
        wait_for(
            lambda: not cluster.queue_processes(host="h1"), 10, "h1's monitor and exchange gone"
        )
        victim.send(b"after")
        victim.flush(timeout_s=RESUME_BOUND_S + 20)
        took_s = time.monotonic() - killed
        print(f"acknowledged on a survivor {took_s:.2f} s after the kill (goal "
              f"{RESUME_GOAL_S:.0f} s, bound {RESUME_BOUND_S:.0f} s)")  # fmt: skip
        assert victim.moves >= 1 and fronts.get(victim.exchange or "") != "h1"
        assert took_s < RESUME_BOUND_S, f"{took_s:.2f} s\n{_log_tail(standby)}{cluster.logs()}"
    finally:
        for pub in [victim, *others]:
            with contextlib.suppress(PublishError):
                pub.close(timeout_s=5)


def _log_tail(daemon: Daemon) -> str:
    return f"--- {daemon.name} (standby GCM)\n{daemon.log_text()[-3000:]}\n"


# --- replicas assigned when an exchange joins ---------------------------------------------------
def test_an_exchange_that_joins_is_assigned_as_a_replica_at_once(cluster: LocalCluster) -> None:
    """Found by the fault harness: m1 was killed 2.2 s after q1's second exchange joined, before
    the monitor's next list period had given m1's exchange a replica, so acks=all had confirmed
    on its append alone and the read from the beginning missed what it acknowledged. With a
    30 s list period, the assignment can only come from the join."""
    cluster.start_gcm()
    for name in ("h1", "h2"):
        cluster.start_host(name, **HOST, **{"monitor.list.period": 30_000})
    cluster.wait_ready(hosts=2)
    started = time.monotonic()  # before the monitor starts
    _queue_on_two_hosts(cluster)
    ids = {x["Host"]: x["Id"] for x in _queue(cluster)["Exchanges"]}

    def copied() -> bool:
        return _live_exchange(cluster, ids["h1"]).get("Replicas") == [ids["h2"]]

    wait_for(copied, 15, f"{ids['h1']} copied to {ids['h2']}\n{cluster.logs()}", interval_s=0.5)
    # a list period's assignment comes 30 s after the monitor's start at the earliest, so
    # seen sooner it was the join's (the margin was 25 s: a loaded machine's set-up took 25.2)
    assert time.monotonic() - started < 30, "assigned by the list period, not by the join"
    assert _live_exchange(cluster, ids["h2"]).get("Replicas") == [ids["h1"]]
