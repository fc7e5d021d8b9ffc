"""The message log on a real cluster: kill -9, restart and replay; resume; retention; full disk."""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from roq.client.locate import MonitorAddress
from roq.client.publisher import Publisher, PublishError
from roq.client.subscriber import Subscriber
from roq.log import segment_name
from roq.protocol.commands import ChildCommand
from roq.protocol.ports import ExchangePort, MonitorPort, sibling
from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import Daemon, LocalCluster, processes_with, wait_for
from roq.transport import new_context
from roq.transport.rpc import Requester

pytestmark = pytest.mark.integration


def _start(cluster: LocalCluster, **overrides: Any) -> dict[str, Any]:
    cluster.start_gcm()
    cluster.start_host("h1", **overrides)
    cluster.wait_ready()
    with cluster.admin() as admin:
        admin.create_queue("q1")
        status = admin.status()
    [exchange] = status.queues[0].exchanges
    return exchange.fields()


def _publish(
    cluster: LocalCluster,
    count: int,
    acks: str = "leader",
    prefix: str = "m",
    linger_ms: float = 2,
    batch_bytes: int = 64 * 1024,
) -> None:
    with Publisher(
        "q1", gcm=cluster.gcm, acks=acks, linger_ms=linger_ms, batch_bytes=batch_bytes
    ) as publisher:
        for n in range(count):
            publisher.send(f"{prefix}{n}".encode())
        publisher.flush()


def _sub_cli(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return cluster.cli("sub", "q1", "--gcm", cluster.gcm, *args, timeout_s=60)


def test_acknowledged_messages_survive_kill_9_of_their_exchange(cluster: LocalCluster):
    exchange = _start(cluster)
    _publish(cluster, 1000)
    [pid] = processes_with(exchange["Id"])
    os.kill(pid, signal.SIGKILL)
    # The host restarts it under the same id: it recovers its log and serves it again.
    wait_for(lambda: processes_with(exchange["Id"]) not in ([], [pid]), 15, "exchange restarted")
    result = _sub_cli(cluster, "--from-beginning", "--count", "1000", "--timeout", "30")
    assert result.returncode == 0, result.stderr + cluster.logs()
    assert result.stdout.splitlines() == [f"m{n}" for n in range(1000)]
    assert "recovered" in cluster.logs() or "holds offsets 0.." in cluster.logs()


def test_a_publisher_sends_again_what_an_exchange_restarted_in_place_never_confirmed(
    cluster: LocalCluster,
):
    """kill -9 of the queue's monitor and of its frozen exchange, which had taken batches
    without confirming them (what a host killed and back within its session does): the host
    restarts both, the exchange at the same address under the same id, and the new monitor
    never knew the old exchange, so no fail-over tells the publisher. Its drain probe is
    answered by another process than before, and it sends those batches again: the flush
    ends, and every message is read back once, in order. Before, the flush waited for
    confirmations that would never come (the fault harness: 31 s)."""
    exchange = _start(cluster)
    [pid] = processes_with(exchange["Id"])
    [monitor] = processes_with("roq monitor q1", cluster.namespace)
    with Publisher("q1", gcm=cluster.gcm, acks="leader", linger_ms=0) as publisher:
        for n in range(100):
            publisher.send(f"m{n}".encode())
        publisher.flush(timeout_s=10)
        os.kill(pid, signal.SIGSTOP)
        for n in range(100, 200):
            publisher.send(f"m{n}".encode())
        wait_for(lambda: publisher.sent_messages == 200, 5, "the batches sent to the frozen one")
        os.kill(monitor, signal.SIGKILL)
        os.kill(pid, signal.SIGKILL)
        publisher.flush(timeout_s=15)
        assert publisher.exchange_restarts == 1
    got = _sub_cli(cluster, "--from-beginning", "--count", "200", "--timeout", "30")
    assert got.stdout.splitlines() == [f"m{n}" for n in range(200)], got.stderr


def test_a_restarted_subscriber_resumes_with_no_gap_and_no_duplicate(
    cluster: LocalCluster, tmp_path: Path
):
    _start(cluster)
    offsets = tmp_path / "sub.offsets"
    out = tmp_path / "out"
    args = ["--offsets", str(offsets), "--timeout", "60"]
    with out.open("wb") as sink:
        first = subprocess.Popen(
            roq_command("sub", "q1", "--gcm", cluster.gcm, "--from-beginning", *args),
            env=child_environment(), stdout=sink, stderr=subprocess.PIPE,
        )  # fmt: skip
        _publish(cluster, 500, prefix="a")
        wait_for(lambda: out.read_bytes().count(b"\n") >= 500, 15, "first 500 delivered")
        first.send_signal(signal.SIGTERM)
        assert first.wait(timeout=15) == 0
    _publish(cluster, 500, prefix="b")  # published while no subscriber runs
    second = _sub_cli(cluster, *args[:2], "--count", "500", "--timeout", "30")
    assert second.returncode == 0, second.stderr
    lines = out.read_text().splitlines() + second.stdout.splitlines()
    assert lines == [f"a{n}" for n in range(500)] + [f"b{n}" for n in range(500)]


def test_a_first_run_that_received_nothing_records_where_it_started(
    cluster: LocalCluster, tmp_path: Path
):
    """Issue 32: `roq sub --offsets F` that received nothing recorded no position, so the next
    run started at its own "now" and skipped what was published in between."""
    _start(cluster)
    offsets = tmp_path / "sub.offsets"
    first = _sub_cli(cluster, "--offsets", str(offsets), "--timeout", "1")
    assert first.returncode == 0 and first.stdout == "", first.stderr
    _publish(cluster, 100, prefix="between")  # while no subscriber runs
    second = _sub_cli(cluster, "--offsets", str(offsets), "--count", "100", "--timeout", "30")
    assert second.returncode == 0, second.stderr
    assert second.stdout.splitlines() == [f"between{n}" for n in range(100)]


def test_counted_reads_that_stop_mid_batch_lose_nothing_and_resume_exactly(
    cluster: LocalCluster, tmp_path: Path
):
    """Counts that end inside batches: the rest of a batch comes on the next call, and a
    commit made there resumes at the first record not yet yielded."""
    _start(cluster)
    _publish(cluster, 1000, linger_ms=50)  # batches of many records
    offsets = tmp_path / "sub.offsets"
    got: list[bytes] = []
    with Subscriber("q1", gcm=cluster.gcm, start="beginning", offsets_file=offsets) as first:
        for count in (7, 93, 250):
            got += [r.payload for r in first.messages(count=count, timeout_s=10)]
        first.commit()
    assert got == [b"m%d" % n for n in range(350)]
    with Subscriber("q1", gcm=cluster.gcm, offsets_file=offsets) as second:
        rest = [r.payload for r in second.messages(count=650, timeout_s=15)]
        assert list(second.messages(timeout_s=0.5)) == [], "a record came twice"
    assert rest == [b"m%d" % n for n in range(350, 1000)]


def test_retention_evicts_and_readers_are_told(cluster: LocalCluster):
    _start(cluster, maxFileSize=4096, **{"log.retention.bytes": 8192})
    _publish(cluster, 3000, batch_bytes=1)  # 3000 batches, ≈ 210 KB: ~50 segments of 4 KB
    with Subscriber("q1", gcm=cluster.gcm, start="beginning") as subscriber:
        got = [r.payload for r in subscriber.messages(count=3000, timeout_s=5)]
        [feed] = subscriber.feeds.values()
        evicted = feed.evicted_bytes
    assert evicted > 0, "reading from offset 0 must be answered 'evicted'"
    assert 0 < len(got) < 3000
    assert got[-1] == b"m2999"  # the newest messages are kept
    first = int(got[0][1:])
    assert got == [f"m{n}".encode() for n in range(first, 3000)]  # no hole after the evicted part


def test_an_unwritable_log_refuses_publishes_with_a_reason(cluster: LocalCluster):
    exchange = _start(cluster, maxFileSize=1024)
    directory = cluster.tmp / "h1" / "log" / "q1" / exchange["Id"]
    with Publisher("q1", gcm=cluster.gcm, acks="leader", batch_bytes=1) as publisher:
        for _ in range(14):  # 14 batches of 71 bytes: the 15th does not fit and rolls
            publisher.send(b"first")
        publisher.flush()
        [segment] = sorted(directory.glob("*.log"))
        end = segment.stat().st_size
        assert end == 14 * 71
        (directory / segment_name(end)).symlink_to("/dev/full")  # the next segment is taken
        publisher.send(b"second")
        with pytest.raises(PublishError, match=r"refused"):
            publisher.flush()
    log_text = cluster.logs()
    assert "the log is unavailable" in log_text and "cannot create segment" in log_text
    with Subscriber("q1", gcm=cluster.gcm, start="beginning") as subscriber:
        got = [r.payload for r in subscriber.messages(count=15, timeout_s=3)]
    assert got == [b"first"] * 14
    assert processes_with(exchange["Id"]), "the exchange keeps serving"


def _segments_bytes(directory: Path) -> bytes:
    return b"".join(path.read_bytes() for path in sorted(directory.glob("*.log")))


def test_replicated_acks_all_survive_kill_9_of_the_leader(cluster: LocalCluster):
    first = _start(cluster, **{"exchange.max.perhost": 4, "replicationFactor": 2})
    with cluster.admin() as admin:
        second = admin.create_exchange("q1", "tx-replica").exchange.fields()
    root = cluster.tmp / "h1" / "log"
    copy_of_first = root / "_replicas" / "q1" / f"{first['Id']}@{second['Id']}"
    wait_for(copy_of_first.exists, 15, "the monitor assigned replicas")
    publisher = Publisher("q1", gcm=cluster.gcm, acks="all", linger_ms=1)
    try:
        leader_id = first["Id"] if publisher.exchange == first["Front"] else second["Id"]
        sent = 0
        for n in range(1500):
            publisher.send(f"m{n}".encode())
            sent += 1
            if n == 500:
                publisher.flush()  # these are acknowledged: on both exchanges
                [pid] = processes_with(leader_id)
                os.kill(pid, signal.SIGKILL)
        # The host restarts the killed exchange on its port within ~250 ms, and the publisher's
        # socket may reconnect to it before the monitor calls the old one dead: the move can
        # come after everything was confirmed, so wait for it rather than assume its order.
        wait_for(lambda: publisher.moves >= 1, 15, "the publisher told its exchange died")
        publisher.flush()  # everything acknowledged, part of it maybe re-sent after the move
    finally:
        publisher.close()
    result = _sub_cli(cluster, "--from-beginning", "--count", str(sent), "--timeout", "30")
    assert result.returncode == 0, result.stderr + cluster.logs()
    assert result.stdout.splitlines() == [f"m{n}" for n in range(sent)]
    # Each log's copy is a prefix of it (byte for byte, offsets included), and once replication
    # has caught up, all of it. The killed leader's copy holds at least the 501 confirmed
    # messages. (Which exchange the publisher moved to is placement's choice: the restarted one
    # takes publishers at once when no subscriber is waiting, and then the other log may stay
    # empty.)
    pairs = [(first, second), (second, first)]

    def logs_and_copies() -> list[tuple[bytes, bytes]]:
        return [
            (_segments_bytes(root / "q1" / leader["Id"]),
             _segments_bytes(root / "_replicas" / "q1" / f"{leader['Id']}@{replica['Id']}"))
            for leader, replica in pairs
        ]  # fmt: skip

    assert all(original.startswith(copy) for original, copy in logs_and_copies())
    wait_for(lambda: all(o == c for o, c in logs_and_copies()), 20, "every copy complete")
    killed = next(i for i, (leader, _) in enumerate(pairs) if leader["Id"] == leader_id)
    assert len(logs_and_copies()[killed][1]) > 0


def test_deleting_a_replicated_queue_removes_its_logs_and_copies_on_every_host(
    cluster: LocalCluster,
):
    first = _start(cluster, **{"replicationFactor": 2})
    cluster.start_host("h2", **{"replicationFactor": 2})
    cluster.wait_ready(hosts=2)
    with cluster.admin() as admin:
        second = admin.create_exchange("q1", "tx-h2", host="h2").exchange.fields()
    h1, h2 = cluster.tmp / "h1" / "log", cluster.tmp / "h2" / "log"
    copies = [
        h2 / "_replicas" / "q1" / f"{first['Id']}@{second['Id']}",
        h1 / "_replicas" / "q1" / f"{second['Id']}@{first['Id']}",
    ]
    wait_for(lambda: all(c.exists() for c in copies), 15, "the monitor assigned replicas")
    _publish(cluster, 300, acks="all")
    wait_for(lambda: any(_segments_bytes(c) for c in copies), 15, "a copy holding data")
    owned = [h1 / "q1" / first["Id"], h2 / "q1" / second["Id"]]
    assert all(d.exists() for d in owned)
    with cluster.admin() as admin:
        # h2 runs nothing of q1 any more, but its files stay until the queue is deleted
        admin.remove_exchange("q1", second["Id"])
        assert owned[1].exists() and copies[0].exists()
        admin.delete_queue("q1")
    gone = [h1 / "q1", h2 / "q1", h1 / "_replicas" / "q1", h2 / "_replicas" / "q1"]
    wait_for(lambda: not any(d.exists() for d in gone), 10, f"{gone} deleted")
    assert not processes_with(first["Id"]) and not processes_with(second["Id"])


# --- replay from a replica when the owner is dead ----------------------------------------------
def _status_of(endpoint: str) -> dict[str, Any]:
    """STATUS from a child's control port (an exchange's F+2, a monitor's B+5)."""
    context = new_context()
    requester = Requester(context, endpoint, timeout_ms=2000)
    try:
        return dict(requester.request({"CMD": int(ChildCommand.PING)})["STATUS"])
    finally:
        requester.close()
        context.term()


def _two_hosts(
    cluster: LocalCluster, **monitor_settings: Any
) -> tuple[dict[str, Any], dict[str, Any], Daemon]:
    """A queue with its monitor and one exchange on h1 and a second exchange on h2, each log
    copied to the other (replicationFactor 2). Returns (h2's exchange, the queue, h2). The
    second exchange is asked for at once: the monitor's own request for it (a queue keeps
    replicationFactor exchanges) comes later and is refused, the queue having its two."""
    settings = {"replicationFactor": 2}
    cluster.start_gcm()
    cluster.start_host("h1", **settings, **monitor_settings)
    h2 = cluster.start_host("h2", **settings)
    cluster.wait_ready(hosts=2)
    with cluster.admin() as admin:
        admin.create_queue("q1", host="h1")
        exchange = admin.create_exchange("q1", "tx-h2", host="h2").exchange.fields()
        [queue] = admin.status().queues
    return exchange, queue.fields(), h2


def _fully_replicated(exchange: dict[str, Any]) -> bool:
    status = _status_of(sibling(exchange["Front"], ExchangePort.FRONT, ExchangePort.CONTROL))
    replicas = status["Replicas"]
    return (
        bool(replicas)
        and all(r["InSync"] for r in replicas)
        and (status["Committed"] == status["LogEnd"])
    )


def _kill_host_and_wait_for_the_copy(
    cluster: LocalCluster, host: Daemon, exchange: dict[str, Any], queue: dict[str, Any]
) -> dict[str, Any]:
    """kill -9 the host and its exchange (nobody restarts it); the monitor's announcement of
    the dead exchange's copy, once it is made."""
    wait_for(lambda: _fully_replicated(exchange), 10, "every batch on the replica")
    cluster.kill(host)
    assert not processes_with(exchange["Id"])

    def announced() -> dict[str, Any] | None:
        copies = _status_of(MonitorAddress(queue["Monitor_host"]).at(MonitorPort.CONTROL))["Copies"]
        return next((c for c in copies if c["Id"] == exchange["Id"]), None)

    return wait_for(announced, 10, f"the monitor announcing the copy of {exchange['Id']}")


def _stream(records: list[Any]) -> list[tuple[bytes, int, bytes]]:
    return [(r.producer_id, r.seq, r.payload) for r in records]


def test_a_dead_exchanges_log_is_replayed_from_its_replica(cluster: LocalCluster):
    exchange, queue, h2 = _two_hosts(cluster)
    publisher, _ = cluster.publisher_on({exchange["Front"]}, keep_others=False)
    for n in range(300):
        publisher.send(f"m{n}".encode())
    publisher.flush()  # acks=all: on the replica too
    halfway = time.time()
    for n in range(300, 600):
        publisher.send(f"m{n}".encode())
    publisher.flush()
    publisher.close()
    copy = _kill_host_and_wait_for_the_copy(cluster, h2, exchange, queue)
    assert copy["Replicas"][0]["End"] > 0
    with Subscriber("q1", gcm=cluster.gcm, start="beginning") as subscriber:
        got = list(subscriber.messages(count=600, timeout_s=20))
        extra = list(subscriber.messages(count=1, timeout_s=1))
        [feed] = [f for f in subscriber.feeds.values() if f.exchange_id == exchange["Id"]]
        assert feed.copies == [copy["Replicas"][0]["Log"]]
        assert feed.next_offset == copy["Replicas"][0]["End"]  # the copy's offsets are the log's
    assert len(set(_stream(got))) == len(got) == 600, "each message exactly once"
    assert [r.payload for r in got] == [f"m{n}".encode() for n in range(600)]
    assert extra == []
    with Subscriber("q1", gcm=cluster.gcm, from_time=halfway) as subscriber:
        later = [r.payload for r in subscriber.messages(count=300, timeout_s=20)]
    assert later == [f"m{n}".encode() for n in range(300, 600)]  # a seek by time on the copy


def test_an_offsets_file_resumes_on_the_copy_of_a_dead_exchange(
    cluster: LocalCluster, tmp_path: Path
):
    exchange, queue, h2 = _two_hosts(cluster)
    offsets = tmp_path / "sub.offsets"
    publisher, _ = cluster.publisher_on({exchange["Front"]}, keep_others=False)
    with Subscriber("q1", gcm=cluster.gcm, start="beginning", offsets_file=offsets) as first:
        wait_for(lambda: len(first.feeds) == 2, 10, "the subscriber on both exchanges")
        for n in range(300):
            publisher.send(f"a{n}".encode())
        publisher.flush()
        before = list(first.messages(count=300, timeout_s=15))
        first.commit()
    for n in range(300):  # published while no subscriber runs, then the exchange dies
        publisher.send(f"b{n}".encode())
    publisher.flush()
    publisher.close()
    _kill_host_and_wait_for_the_copy(cluster, h2, exchange, queue)
    with Subscriber("q1", gcm=cluster.gcm, offsets_file=offsets) as second:
        after = list(second.messages(count=300, timeout_s=20))
        extra = list(second.messages(count=1, timeout_s=1))
    assert [r.payload for r in before] == [f"a{n}".encode() for n in range(300)]
    assert [r.payload for r in after] == [f"b{n}".encode() for n in range(300)]
    assert len(set(_stream(before + after))) == 600 and extra == []


def test_a_read_in_flight_moves_to_the_copy_when_the_owner_is_declared_dead(
    cluster: LocalCluster, caplog: pytest.LogCaptureFixture
):
    # The monitor takes 3 s (15 heartbeats) to declare the exchange dead, so the subscriber
    # joins it as live, reads its dead log server, and moves to the copy on the next list.
    exchange, _, h2 = _two_hosts(cluster, **{"monitor.dead.heartbeats": 15})
    publisher, _ = cluster.publisher_on({exchange["Front"]}, keep_others=False)
    for n in range(600):
        publisher.send(f"m{n}".encode())
    publisher.flush()
    publisher.close()
    wait_for(lambda: _fully_replicated(exchange), 10, "every batch on the replica")
    cluster.kill(h2)
    caplog.set_level(logging.INFO, logger="roq.client.feed")
    with Subscriber("q1", gcm=cluster.gcm, start="beginning") as subscriber:
        assert exchange["Id"] in subscriber.exchanges.values(), "joined while still listed"
        got = list(subscriber.messages(count=600, timeout_s=20))
    assert f"exchange {exchange['Id']} is gone: reading its log from the copy" in caplog.text
    assert [r.payload for r in got] == [f"m{n}".encode() for n in range(600)]
    assert len(set(_stream(got))) == 600


def test_a_feed_whose_exchange_stops_answering_is_noticed_and_recovers(cluster: LocalCluster):
    # The monitor would drop a stopped exchange after 20 s: this test sees the feed alone.
    exchange = _start(cluster, **{"monitor.dead.heartbeats": 100})
    [pid] = processes_with(exchange["Id"])
    with Subscriber("q1", gcm=cluster.gcm) as subscriber:
        [feed] = subscriber.feeds.values()
        list(subscriber.messages(timeout_s=3))  # idle: probes are answered
        assert not feed.silent
        os.kill(pid, signal.SIGSTOP)
        try:
            started = time.monotonic()
            wait_for(lambda: list(subscriber.messages(timeout_s=0.1)) == [] and feed.silent,
                     10, "the feed noticing its exchange is silent")  # fmt: skip
            noticed_s = time.monotonic() - started
        finally:
            os.kill(pid, signal.SIGCONT)
        wait_for(lambda: list(subscriber.messages(timeout_s=0.1)) == [] and not feed.silent,
                 10, "the feed hearing from its exchange again")  # fmt: skip
    assert noticed_s < 2 + 5 + 1  # idle probe period + answer timeout (+ polling slack)


def _log_bytes(directory: Path) -> tuple[int, bytes]:
    """(start offset, bytes) of a log directory's segments (contiguous ones)."""
    segments = sorted(directory.glob("*.log"))
    return int(segments[0].stem), b"".join(path.read_bytes() for path in segments)


def test_a_replica_behind_the_leaders_retention_starts_its_copy_again(cluster: LocalCluster):
    # 256 KiB segments, 1 MiB kept; the monitor would wait 20 s before declaring a silent
    # exchange dead, so the stopped replica stays assigned.
    first = _start(cluster, **{
        "exchange.max.perhost": 4, "replicationFactor": 2, "maxFileSize": 256 * 1024,
        "log.retention.bytes": 1024 * 1024, "monitor.dead.heartbeats": 100,
    })  # fmt: skip
    with cluster.admin() as admin:
        second = admin.create_exchange("q1", "tx-replica").exchange.fields()
    publisher = Publisher("q1", gcm=cluster.gcm, acks="leader", linger_ms=1)
    leader, replica = (first, second) if publisher.exchange == first["Front"] else (second, first)
    root = cluster.tmp / "h1" / "log"
    copy = root / "_replicas" / "q1" / f"{leader['Id']}@{replica['Id']}"
    wait_for(copy.exists, 15, "the monitor assigned replicas")
    payload = b"x" * 1024
    for _ in range(200):
        publisher.send(payload)
    publisher.flush()
    wait_for(lambda: _fully_replicated(leader), 15, "the first batches on the replica")
    [pid] = processes_with(replica["Id"])
    os.kill(pid, signal.SIGSTOP)
    try:  # 12 MiB through a 1 MiB retention: the copy ends below what the leader keeps
        for _ in range(12 * 1024):
            publisher.send(payload)
        publisher.flush()
    finally:
        os.kill(pid, signal.SIGCONT)
    publisher.close()
    wait_for(lambda: _fully_replicated(leader), 30, "the replica in sync again")
    # The whole host log (cluster.logs() keeps only each log's tail; the retention lines that
    # follow the warning can push it out)
    assert any("is behind retention" in d.log_text() for d in cluster.daemons)
    leader_start, leader_bytes = _log_bytes(root / "q1" / leader["Id"])
    copy_start, copy_bytes = _log_bytes(copy)
    assert leader_start > 8 * 1024 * 1024, "retention evicted what the replica lacked"
    assert copy_start >= leader_start - 1024 * 1024  # started again, not filled in
    assert leader_start + len(leader_bytes) == copy_start + len(copy_bytes)  # same end
    overlap = max(leader_start, copy_start)
    assert leader_bytes[overlap - leader_start :] == copy_bytes[overlap - copy_start :]


def test_a_dropped_tail_is_read_from_the_log_with_no_later_batch_to_reveal_it(
    cluster: LocalCluster,
):
    """The subscriber's live connection is cut (`ss -K`) while the end of what was published
    is still in flight to it, and nothing is published after: the batches in the connection's
    buffers are gone and no later live batch reveals the gap. The feed's idle probe (2 s of
    silence: where does the log end?) finds the tail and reads it from the log. (Letting
    ZeroMQ drop for a subscriber that does not read is no such test: its buffers free up
    while the publisher sends, so it drops in the middle and a later batch shows the gap.)"""
    _start(cluster, **{"exchange.subscriber.hwm": 10})
    count = 2_000
    # hwm 1: what the subscriber's socket holds when the connection is cut is at most the
    # batch after "first" (with 10 it held batches from both sides of a drop by the exchange's
    # socket: a gap, read from the log before any probe)
    with Subscriber("q1", gcm=cluster.gcm, hwm=1) as subscriber:
        with Publisher("q1", gcm=cluster.gcm, batch_bytes=1) as publisher:  # a batch each
            publisher.send(b"first")
            publisher.flush()
            assert [r.payload for r in subscriber.messages(count=1, timeout_s=20)] == [b"first"]
            for n in range(count):
                publisher.send(b"%d " % n + b"x" * 2000)
            publisher.flush()  # the subscriber reads nothing meanwhile
            [feed] = subscriber.feeds.values()
            port = feed.back.rsplit(":", 1)[1]
            cut = subprocess.run(
                ["ss", "-K", "(", "sport", "=", f":{port}", "or", "dport", "=", f":{port}", ")"],
                capture_output=True, text=True, timeout=10, check=False,
            )  # fmt: skip
            assert f":{port}" in cut.stdout, f"no connection cut: {cut.stdout} {cut.stderr}"
        got = [r.payload.split(b" ")[0] for r in subscriber.messages(count=count, timeout_s=60)]
        assert got == [b"%d" % n for n in range(count)], f"{len(got)} of {count}"
        assert feed.tails_found >= 1, "the tail was not found by the idle probe"
    assert subscriber.sequencer.lost == 0 and subscriber.sequencer.duplicates == 0


def test_a_subscriber_far_behind_pauses_its_live_stream_and_catches_up(cluster: LocalCluster):
    """A subscriber that did not read while 40 MB went by (ZeroMQ dropped most of it for that
    subscriber) reads the log with its live stream paused, delivers every message once and in
    order, then takes the live stream again."""
    _start(cluster, **{"exchange.subscriber.hwm": 10})
    count, payload = 40_000, b"x" * 1000
    with Subscriber("q1", gcm=cluster.gcm, hwm=10) as subscriber:
        with Publisher("q1", gcm=cluster.gcm) as publisher:
            for n in range(count):
                publisher.send(b"%d " % n + payload)
            publisher.flush()  # the subscriber reads nothing meanwhile
        got = [r.payload.split(b" ")[0] for r in subscriber.messages(count=count, timeout_s=60)]
        assert got == [b"%d" % n for n in range(count)]
        [feed] = subscriber.feeds.values()
        assert feed.pauses >= 1, "40 MB behind: the live stream should have been paused"
        wait_for(lambda: list(subscriber.messages(timeout_s=0.2)) == [] and not feed.live_paused,
                 10, "caught up, live again")  # fmt: skip
        read_before = feed.read_batches
        with Publisher("q1", gcm=cluster.gcm) as publisher:
            time.sleep(0.5)  # the live socket has reconnected
            publisher.send(b"live")
        assert [r.payload for r in subscriber.messages(count=1, timeout_s=10)] == [b"live"]
        assert feed.read_batches == read_before, "the new message came on the live stream"
    assert subscriber.sequencer.lost == 0 and subscriber.sequencer.duplicates == 0
