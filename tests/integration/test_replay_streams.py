"""A replay from the beginning of a stream that moved between exchanges: readable records are
never given up for lost because another exchange's log answered first (docs/guarantees.md §6)."""

from __future__ import annotations

import os
import signal
import time
from typing import Any

import pytest

from roq.client.subscriber import Subscriber, records
from roq.log import format as batchfmt
from roq.protocol import dataplane
from roq.testing.cluster import LocalCluster, processes_with, wait_for
from roq.transport import Kind, connect, new_context, open_socket

pytestmark = pytest.mark.integration

PRODUCER = bytes(range(16))
KEY = b"moved"


def _two_exchanges(cluster: LocalCluster) -> list[dict[str, Any]]:
    # a stopped exchange must not be declared dead while the test holds it (20 s of silence)
    cluster.start_gcm()
    cluster.start_host("h1", **{"exchange.max.perhost": 4, "monitor.dead.heartbeats": 100})
    cluster.wait_ready()
    with cluster.admin() as admin:
        admin.create_queue("q1")
        admin.create_exchange("q1", "tx-second")
        [queue] = admin.status().queues
    return [x.fields() for x in queue.exchanges]


def _append(front: str, seqs: range) -> None:
    """One batch of one record per sequence number, with one producer id and key, appended to
    the exchange at `front` (acks=leader: each confirmed before this returns)."""
    context = new_context()
    sock = open_socket(context, Kind.DEALER, sndhwm=100_000, rcvhwm=100_000)
    connect(sock, front)
    try:
        for seq in seqs:
            batch = batchfmt.encode_batch(
                PRODUCER, seq, KEY, [b"%d" % seq], [time.time_ns() // 1000]
            )
            sock.send_multipart([dataplane.CONFIRMED_BATCH, dataplane.TOKEN.pack(seq), batch])
        for _ in seqs:
            assert sock.poll(10_000), f"no confirmation from {front}"
            assert sock.recv_multipart()[0] == dataplane.ACK
    finally:
        sock.close(0)
        context.term()


def test_a_replay_waits_for_a_slower_log_holding_a_streams_beginning(cluster: LocalCluster):
    first, second = _two_exchanges(cluster)
    # The stream's first 60 records are in the first exchange's log, the next 1500 (more than a
    # subscriber holds while it waits for a gap) in the second's: as if its publisher moved.
    _append(first["Front"], range(60))
    _append(second["Front"], range(60, 1560))
    [pid] = processes_with(first["Id"])
    os.kill(pid, signal.SIGSTOP)  # its log answers late: the second log's whole read comes first
    got: list[int] = []
    try:
        with Subscriber("q1", gcm=cluster.gcm, start="beginning") as subscriber:
            [later] = [f for f in subscriber.feeds.values() if f.exchange_id == second["Id"]]

            def read() -> bool:
                for delivery in subscriber.poll(100):
                    got.extend(int(bytes(r.payload)) for r in records(delivery))
                return later.read_batches > 0

            wait_for(read, 15, "the second exchange's log answered")
            os.kill(pid, signal.SIGCONT)
            got.extend(int(bytes(r.payload)) for r in subscriber.messages(1560 - len(got), 30))
            lost, refusals = subscriber.sequencer.lost, getattr(later, "refusals", 0)
    finally:
        os.kill(pid, signal.SIGCONT)
    assert got == list(range(1560)), f"first delivered {got[:1]}, {len(got)} in all, {lost} lost"
    assert lost == 0
    assert refusals >= 1  # its read held more than fits: that part was read again


def test_a_commit_while_batches_wait_for_a_gap_reads_them_again_after_a_restart(
    cluster: LocalCluster, tmp_path
):
    """Batches the sequencer holds were read but not delivered: the committed position of their
    exchange stays before them, so a subscriber restarted from the offsets file reads them
    again instead of resuming past them (they would be lost)."""
    first, second = _two_exchanges(cluster)
    _append(first["Front"], range(60))
    _append(second["Front"], range(60, 1560))
    offsets = tmp_path / "offsets.json"
    [pid] = processes_with(first["Id"])
    os.kill(pid, signal.SIGSTOP)  # the stream's beginning answers late: the rest waits for it
    try:
        with Subscriber("q1", gcm=cluster.gcm, start="beginning", offsets_file=offsets) as sub:
            [later] = [f for f in sub.feeds.values() if f.exchange_id == second["Id"]]

            def holding() -> bool:
                assert list(sub.poll(100)) == []  # nothing deliverable before record 0
                return later.read_batches > 0 and sub.sequencer.held > 0

            wait_for(holding, 15, "the second exchange's batches held for the gap")
            sub.commit()
    finally:
        os.kill(pid, signal.SIGCONT)
    got: list[int] = []
    with Subscriber("q1", gcm=cluster.gcm, start="beginning", offsets_file=offsets) as again:
        got.extend(int(bytes(r.payload)) for r in again.messages(1560, 30))
        lost = again.sequencer.lost
    assert got == list(range(1560)), f"first delivered {got[:1]}, {len(got)} in all, {lost} lost"
