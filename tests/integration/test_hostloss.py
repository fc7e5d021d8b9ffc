"""Host loss is repaired (issue 18, first slice): the leading GCM re-places the monitor and the
exchanges of a host that stays gone; clients follow; a host that comes back starts nothing
stale."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.testing.cluster import Daemon, LocalCluster, processes_with, wait_for

pytestmark = pytest.mark.integration

SESSION_S = 4.0  # zk.session.timeout of the test cluster (LocalCluster's default)
GRACE_MS = 500  # host.loss.grace: short, so the bound below is the issue's
JOIN_BOUND_S = SESSION_S + 5  # the bound for a new subscriber after the kill


def _status(cluster: LocalCluster) -> dict[str, Any]:
    result = cluster.cli("status", "--json", "--gcm", cluster.gcm, timeout_s=60)
    assert result.returncode == 0, result.stderr + cluster.logs()
    return dict(json.loads(result.stdout))


def _queue(cluster: LocalCluster, name: str = "q1") -> dict[str, Any]:
    return next(q for q in _status(cluster)["Queues"] if q["Name"] == name)


def _processes_of(cluster: LocalCluster, host: str, queue: str = "q1") -> list[int]:
    """The queue's monitor and exchange processes that `host` started (its -D directory)."""
    marker = str(cluster.tmp / host / "log")
    return [
        pid
        for pid in processes_with(f" {queue} --bind ")
        if marker in Path(f"/proc/{pid}/cmdline").read_text().replace("\0", " ")
    ]


def _two_hosts(cluster: LocalCluster) -> tuple[Daemon, Daemon]:
    """q1's monitor and first exchange on h1, a second exchange on h2 (R=2: each log is copied
    on the other exchange)."""
    cluster.start_gcm(**{"host.loss.grace": GRACE_MS})
    h1 = cluster.start_host("h1", **{"exchange.max.perhost": 4, "exchange.warmup": 500})
    h2 = cluster.start_host("h2", **{"exchange.max.perhost": 4, "exchange.warmup": 500})
    cluster.wait_ready(hosts=2)
    with cluster.admin() as admin:
        admin.create_queue("q1", "h1")
        admin.create_exchange("q1", "hostloss-tx-h2", host="h2")
    wait_for(lambda: len(_processes_of(cluster, "h2")) == 1, 15, "q1's exchange on h2")
    time.sleep(1.5)  # past exchange.warmup: both exchanges take publishers
    return h1, h2


def _publisher_on(
    cluster: LocalCluster, front_host: str, acks: str = "all"
) -> tuple[Publisher, list[Publisher]]:
    """A publisher placed on the exchange of `front_host` (placement spreads them), and the
    others made on the way."""
    fronts = {x["Front"]: x["Host"] for x in _queue(cluster)["Exchanges"]}
    others = []
    for _ in range(8):
        pub = Publisher("q1", gcm=cluster.gcm, acks=acks, linger_ms=1)
        if fronts.get(pub.exchange or "") == front_host:
            return pub, others
        others.append(pub)
    raise AssertionError(f"no publisher placed on {front_host}: {fronts}")


def _send_acknowledged(pub: Publisher, tag: str, count: int, timeout_s: float) -> list[str]:
    sent = [f"{tag}-{n}" for n in range(count)]
    for line in sent:
        pub.send(line.encode())
    pub.flush(timeout_s=timeout_s)
    return sent


def test_the_monitors_host_killed_publishers_move_and_a_subscriber_joins(
    cluster: LocalCluster,
) -> None:
    h1, _ = _two_hosts(cluster)
    victim, others = _publisher_on(cluster, "h1")
    quiet, more = _publisher_on(cluster, "h1", acks="none")
    quiet.send(b"none-before")
    quiet.flush(timeout_s=10)
    acknowledged = _send_acknowledged(victim, "before", 200, 20)
    time.sleep(0.5)  # the replica of h1's log on h2 caught up (acks=all already waited for it)

    lost_front = victim.exchange
    cluster.kill(h1)  # its process group: the monitor and the exchange die with it
    killed = time.monotonic()
    wait_for(lambda: not _processes_of(cluster, "h1"), 10, "h1's monitor and exchange gone")

    # The publisher of the lost exchange: its confirmations stop, it asks the GCM, follows the
    # re-placed monitor to a live exchange and sends its unconfirmed batches again.
    after = [f"after-{n}" for n in range(50)]
    for line in after:
        victim.send(line.encode())
    # Meanwhile a new subscriber joins within the bound (it follows the re-placed monitor too).
    sub = Subscriber("q1", gcm=cluster.gcm, start="beginning", join_timeout_s=JOIN_BOUND_S + 5)
    joined_s = time.monotonic() - killed
    victim.flush(timeout_s=JOIN_BOUND_S + 10)
    moved_s = time.monotonic() - killed
    quiet.send(b"none-after")  # acks=none: its flush's drain, unanswered, makes it follow too
    quiet.flush(timeout_s=JOIN_BOUND_S + 10)
    assert quiet.exchange != lost_front and quiet.moves >= 1
    print(f"joined {joined_s:.1f} s, acknowledged {moved_s:.1f} s after the kill")  # with -s
    assert joined_s < JOIN_BOUND_S, f"joined {joined_s:.1f} s after the kill\n{cluster.logs()}"
    acknowledged += after
    assert victim.exchange != lost_front and victim.moves >= 1
    queue = _queue(cluster)
    assert queue["Host"] == "h2", queue
    live_fronts = {x["Front"] for x in queue["Exchanges"] if not x["Lost"]}
    assert victim.exchange in live_fronts, (victim.exchange, queue)
    assert [x["Host"] for x in queue["Exchanges"] if x["Lost"]] == ["h1"], queue
    assert len(live_fronts) == 2, f"the queue kept its capacity: {queue}"

    # The subscriber reads every acknowledged message once, in the producer's order (the lost
    # exchange's log from its copy on h2's exchange).
    mine: list[str] = []  # the acks=all publisher's (the acks=none one's are read too)
    deadline = time.monotonic() + 30
    while len(mine) < len(acknowledged) and time.monotonic() < deadline:
        got = [r.payload.decode() for r in sub.messages(count=1, timeout_s=1)]
        mine += [m for m in got if m.startswith(("before-", "after-"))]
    assert sorted(mine) == sorted(acknowledged), (
        f"{len(mine)} of {len(acknowledged)} read; moved after {moved_s:.1f} s\n{cluster.logs()}"
    )
    assert mine == acknowledged  # one producer: in its order
    status = cluster.cli("status", "--gcm", cluster.gcm, timeout_s=60).stdout
    assert "h1" in status and "GONE" in status, status
    for pub in [victim, quiet, *others, *more]:
        pub.close(timeout_s=5)
    sub.close()


def test_a_host_back_after_its_work_moved_starts_nothing_stale(cluster: LocalCluster) -> None:
    h1, _ = _two_hosts(cluster)
    lost_id = next(x["Id"] for x in _queue(cluster)["Exchanges"] if x["Host"] == "h1")
    cluster.kill(h1)
    wait_for(
        lambda: (
            _queue(cluster)["Host"] == "h2" and any(x["Lost"] for x in _queue(cluster)["Exchanges"])
        ),
        SESSION_S + 15,
        f"q1 re-placed on h2\n{cluster.logs()}",
    )
    back = cluster.start_host("h1", **{"exchange.max.perhost": 4})
    cluster.wait_ready(hosts=2)
    wait_for(lambda: back.log_text().count("serving on") == 2, 15, "h1 serving again")
    time.sleep(1.0)  # what it would adopt, it adopts before serving
    assert _processes_of(cluster, "h1") == [], back.log_text()[-3000:]
    assert back.log_text().count("re-adopted queue q1") == 0
    assert (cluster.tmp / "h1" / "log" / "q1" / lost_id).is_dir()  # its old log stays
    queue = _queue(cluster)
    assert queue["Host"] == "h2"
    assert [x["Id"] for x in queue["Exchanges"] if x["Lost"]] == [lost_id]


def test_a_host_stalled_past_its_session_stops_what_was_re_placed(cluster: LocalCluster) -> None:
    h1, _ = _two_hosts(cluster)
    stale = _processes_of(cluster, "h1")
    assert len(stale) == 2  # the monitor and an exchange
    # SIGSTOP the host only: its children keep running, as on a host cut off from ZooKeeper.
    h1.process.send_signal(signal.SIGSTOP)
    try:
        wait_for(
            lambda: _queue(cluster)["Host"] == "h2",
            SESSION_S + 15,
            f"q1 re-placed on h2\n{cluster.logs()}",
        )
    finally:
        h1.process.send_signal(signal.SIGCONT)
    wait_for(
        lambda: "registered again after its ZooKeeper session expired" in h1.log_text(),
        20,
        "h1 registered again",
    )
    wait_for(lambda: not _processes_of(cluster, "h1"), 20, f"h1's stale children stopped\n"
             f"{h1.log_text()[-3000:]}")  # fmt: skip
    assert "was re-placed while this host was gone" in h1.log_text()


# --- a lost log gets replicationFactor copies again ----------------------------------------
def _live(cluster: LocalCluster) -> dict[str, Any]:
    """q1's STATUS as its monitor answers it (through `roq status --json`)."""
    live = _queue(cluster).get("Live")
    assert live, "q1's monitor does not answer"
    return dict(live)


def _copies_of(cluster: LocalCluster, leader: str) -> dict[str, int]:
    """Exchange id → end of its copy of the gone `leader`'s log, as the monitor lists them."""
    dead = [c for c in _live(cluster)["Copies"] if c["Id"] == leader]
    return {r["Id"]: r["End"] for r in dead[0]["Replicas"]} if dead else {}


def _copy_dirs(cluster: LocalCluster, hosts: list[str], leader: str) -> dict[str, Path]:
    """The directories holding a copy of `leader`'s log on `hosts`, by the holder's id."""
    found = {}
    for host in hosts:
        for path in (cluster.tmp / host / "log" / "_replicas" / "q1").glob(f"{leader}@*"):
            found[path.name.split("@", 1)[1]] = path
    return found


def _segments(directory: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(directory.glob("*.log")))


def _read_all(cluster: LocalCluster, wanted: dict[str, list[str]], timeout_s: float) -> None:
    """A subscriber from the beginning reads every message of `wanted` (tag → in order)
    exactly once, each producer in its order."""
    sub = Subscriber("q1", gcm=cluster.gcm, start="beginning", join_timeout_s=30)
    got: dict[str, list[str]] = {tag: [] for tag in wanted}
    total = sum(len(v) for v in wanted.values())
    deadline = time.monotonic() + timeout_s
    try:
        while sum(len(v) for v in got.values()) < total and time.monotonic() < deadline:
            for record in sub.messages(count=100, timeout_s=1):
                text = record.payload.decode()
                got[text.split("-", 1)[0]].append(text)
    finally:
        sub.close()
    assert got == wanted, (
        {t: (len(got[t]), len(wanted[t])) for t in wanted},
        _live(cluster)["Copies"],
        cluster.logs(),
    )


def test_a_lost_log_is_copied_again_and_survives_a_second_host_loss(
    cluster: LocalCluster,
) -> None:
    """Issue 18's first test: three hosts, R=2, acks=all publishers running; the host with the
    monitor and a publisher's exchange is killed with all its processes."""
    cluster.start_gcm(**{"host.loss.grace": GRACE_MS})
    hosts = {
        name: cluster.start_host(name, **{"exchange.max.perhost": 4, "exchange.warmup": 500})
        for name in ("h1", "h2", "h3")
    }
    cluster.wait_ready(hosts=3)
    with cluster.admin() as admin:
        admin.create_queue("q1", "h1")
        admin.create_exchange("q1", "recopy-tx-h2", host="h2")
        admin.create_exchange("q1", "recopy-tx-h3", host="h3")
    for name in ("h2", "h3"):
        wait_for(lambda n=name: len(_processes_of(cluster, n)) == 1, 15, f"q1's exchange on {name}")
    time.sleep(1.5)  # past exchange.warmup: every exchange takes publishers
    lost_id = next(x["Id"] for x in _queue(cluster)["Exchanges"] if x["Host"] == "h1")
    victim, others = _publisher_on(cluster, "h1")
    bystander = others[0] if others else Publisher("q1", gcm=cluster.gcm, acks="all", linger_ms=1)
    acknowledged = {
        "victim": _send_acknowledged(victim, "victim", 300, 20),
        "bystander": _send_acknowledged(bystander, "bystander", 300, 20),
    }

    cluster.kill(hosts["h1"])  # its process group: the monitor and the exchange die with it
    killed = time.monotonic()
    after = [f"victim-{n}" for n in range(300, 400)]
    for line in after:
        victim.send(line.encode())
    victim.flush(timeout_s=JOIN_BOUND_S + 10)
    resumed_s = time.monotonic() - killed
    assert resumed_s < JOIN_BOUND_S, f"acknowledged {resumed_s:.1f} s after the kill"
    acknowledged["victim"] += after
    acknowledged["bystander"] += _send_acknowledged(bystander, "bystander-after", 100, 20)
    # The copy it was replicated to (an earlier, shorter copy may be there too, from before the
    # third exchange joined): the longest the new monitor lists, before any copy is made again.
    listed = wait_for(lambda: _copies_of(cluster, lost_id), 10, f"{lost_id}'s copy listed")
    original = max(listed, key=lambda x: listed[x])

    # The lost log reaches two complete copies on live exchanges of two hosts, listed by the
    # monitor, equal on disk, and roq status stops calling it short of copies.
    def complete() -> list[str]:
        ends = _copies_of(cluster, lost_id)
        done = [x for x, end in ends.items() if end == max(ends.values())]
        return done if len(done) >= 2 and not _live(cluster)["ShortLogs"] else []

    holders = wait_for(complete, 40, f"two copies of {lost_id}'s log\n{cluster.logs()}")
    copied_s = time.monotonic() - killed
    dirs = _copy_dirs(cluster, ["h2", "h3"], lost_id)
    images = {_segments(dirs[x]) for x in holders}
    assert len(images) == 1 and len(images.pop()) == _copies_of(cluster, lost_id)[original]
    assert {dirs[x].parts[-5] for x in holders} == {"h2", "h3"}, dirs  # on two hosts
    # every live log of the queue has its copy on another exchange
    live = {x["Id"]: x for x in _live(cluster)["Exchanges"]}
    assert len(live) == 3, live  # the replacement keeps the queue's capacity
    assert all(len(view["Replicas"]) == 1 for view in live.values()), live
    assert any("copying it from" in h.log_text() for h in hosts.values())  # made, not found
    print(f"resumed {resumed_s:.1f} s, two copies again {copied_s:.1f} s after the kill")
    _read_all(cluster, acknowledged, 40)

    # The host of the original copy is killed too: the new copy keeps the log readable in full.
    first_host = dirs[original].parts[-5]
    survivor = "h3" if first_host == "h2" else "h2"
    cluster.kill(hosts[first_host])
    wait_for(
        lambda: _queue(cluster)["Host"] == survivor and _copies_of(cluster, lost_id),
        SESSION_S + 30,
        f"q1 served from {survivor} with {lost_id}'s copy\n{cluster.logs()}",
    )
    _read_all(cluster, acknowledged, 60)
    for pub in [victim, bystander, *others]:
        pub.close(timeout_s=5)
