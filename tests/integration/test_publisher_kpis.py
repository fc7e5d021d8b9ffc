"""A publisher's KPIs (CMD 11 PUBLISHER_TOTAL, 12 PUBLISHER_MINUTE, RoQ seed 000): a real
publisher sends them to its monitor's stat input, the monitor forwards them on the KPI stream
(S+1) and keeps them for its STATUS, and `roq status` shows them."""

from __future__ import annotations

import json
from typing import Any

import pytest

from roq.client.publisher import Publisher
from roq.errors import EXIT_NOT_SERVING
from roq.protocol import bsonmsg
from roq.protocol.commands import StatCommand
from roq.testing.cluster import LocalCluster, wait_for
from roq.transport import READABLE, Kind, Poller, connect, new_context, open_socket

pytestmark = pytest.mark.integration

SENT = 120


def _stream_until(endpoint: str, wanted: Any, timeout_s: float) -> list[dict[str, Any]]:
    """The publisher KPIs read on the KPI stream until `wanted(docs)` holds (or the bound)."""
    context = new_context()
    sock = open_socket(context, Kind.SUB, subscribe=b"")
    connect(sock, endpoint)
    poller = Poller()
    poller.register(sock, READABLE)
    docs: list[dict[str, Any]] = []
    try:
        wait_for(lambda: _read(sock, poller, docs) and wanted(docs), timeout_s,
                 f"the publisher's KPIs on {endpoint}")  # fmt: skip
    finally:
        sock.close(0)
        context.term()
    return docs


def _read(sock: Any, poller: Poller, docs: list[dict[str, Any]]) -> bool:
    while poller.poll(50):
        doc = bsonmsg.decode(sock.recv_multipart()[:1])
        if doc["CMD"] in (StatCommand.PUBLISHER_TOTAL, StatCommand.PUBLISHER_MINUTE):
            docs.append(doc)
    return True


def _status(cluster: LocalCluster) -> dict[str, Any]:
    result = cluster.cli("status", "--json", "--gcm", cluster.gcm)
    assert result.returncode in (0, EXIT_NOT_SERVING), result.stderr
    return dict(json.loads(result.stdout))


def test_a_publishers_kpis_reach_the_monitor_and_show_in_status(cluster: LocalCluster):
    cluster.start_with_queue()
    with cluster.admin() as admin:
        record = next(q for q in admin.list_queues() if q.name == "q1")
    with Publisher("q1", gcm=cluster.gcm, acks="leader", linger_ms=1) as publisher:
        for n in range(SENT):
            publisher.send(b"m%d" % n, key=b"k")
        publisher.flush()
        pid = publisher.producer_id.hex()

        def all_counted(docs: list[dict[str, Any]]) -> bool:
            mine = [d for d in docs if d.get("PublisherID") == pid]
            return any(d["CMD"] == StatCommand.PUBLISHER_TOTAL and d["TotalSent"] == SENT
                       for d in mine) and any(d["CMD"] == StatCommand.PUBLISHER_MINUTE
                                              for d in mine)  # fmt: skip

        docs = _stream_until(record.stat_monitor_host, all_counted, 30)
        minutes = [d for d in docs if d["CMD"] == StatCommand.PUBLISHER_MINUTE]
        assert all(d["QName"] == "q1" and d["Period"] > 0 for d in minutes)
        # the minute counts add up to what was sent, once the sending is counted at all
        assert sum(d["Total"] for d in minutes if d["PublisherID"] == pid) <= SENT

        def listed() -> dict[str, Any] | None:
            [queue] = _status(cluster)["Queues"]
            rows = [p for p in queue["Live"]["Publishers"] if p["PublisherID"] == pid]
            return rows[0] if rows and rows[0]["TotalSent"] == SENT else None

        row = wait_for(listed, 30, f"publisher {pid} with {SENT} sent in roq status --json")
        assert row["Age"] < 30
        text = cluster.cli("status", "--gcm", cluster.gcm).stdout
        assert f"publisher {pid}" in text and f"{SENT:,} sent" in text, text
