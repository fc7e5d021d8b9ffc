"""The publishers' KPIs (CMD 11, 12): what a monitor keeps of them (monitor/publishers.py), what
`roq status` prints, and the analytics record's contract for them (analytics/kpi.py)."""

from __future__ import annotations

import pytest
from test_messages import MONITOR_STATUS

from roq import limits
from roq.analytics.kpi import KpiRecorder, decode_kpi, encode_kpi
from roq.cli.queues import _publisher_lines
from roq.errors import CorruptRecord, ProtocolError
from roq.log import format as batchfmt
from roq.monitor.publishers import PublisherKpis
from roq.protocol.commands import StatCommand
from roq.protocol.messages.control import MonitorStatus
from roq.protocol.messages.kpi import PublisherKpi, decode_kpi_message

TOTAL, MINUTE = StatCommand.PUBLISHER_TOTAL, StatCommand.PUBLISHER_MINUTE


def _pair(pid: str, total: int, last: int) -> tuple[PublisherKpi, PublisherKpi]:
    return (
        PublisherKpi(TOTAL, pid, "q1", total, 1.7e9),
        PublisherKpi(MINUTE, pid, "q1", last, 1.7e9, 2.0),
    )


def test_the_monitor_keeps_each_publishers_last_total_and_rate_busiest_first():
    kpis = PublisherKpis()
    for kpi in (*_pair("aa", 100, 10), *_pair("bb", 500, 400), *_pair("aa", 120, 20)):
        kpis.note(kpi, now=10.0)
    rows = kpis.rows(now=11.0)
    assert [(r.publisher_id, r.total_sent, r.rate, r.age_s) for r in rows] == [
        ("bb", 500, 200.0, 1.0),
        ("aa", 120, 10.0, 1.0),
    ]


def test_publishers_past_the_bound_are_counted_not_kept_until_one_is_forgotten():
    kpis = PublisherKpis(kept_max=2, forget_s=30.0)
    for pid in ("aa", "bb", "cc"):
        kpis.note(_pair(pid, 1, 1)[0], now=0.0)
    assert [r.publisher_id for r in kpis.rows(now=1.0)] == ["aa", "bb"]
    assert kpis.untracked == 1
    kpis.note(_pair("bb", 2, 1)[0], now=20.0)  # aa falls silent; bb still reports
    kpis.note(_pair("cc", 3, 1)[0], now=31.0)  # aa silent past forget_s: its place is free
    assert sorted(r.publisher_id for r in kpis.rows(now=31.0)) == ["bb", "cc"]
    assert kpis.untracked == 1


def test_a_silent_publisher_leaves_the_rows():
    kpis = PublisherKpis(forget_s=30.0)
    kpis.note(_pair("aa", 1, 1)[0], now=0.0)
    assert kpis.rows(now=29.0)
    assert kpis.rows(now=31.0) == ()


def test_a_publisher_kpi_without_its_id_or_period_is_refused_naming_the_field():
    doc = _pair("aa", 1, 1)[1].encode()
    for field in ("PublisherID", "Period", "Total"):
        with pytest.raises(ProtocolError, match=f"the {field} field"):
            decode_kpi_message([{k: v for k, v in doc.items() if k != field}])
    assert decode_kpi_message([doc]).rate == 0.5


def test_status_lists_the_busiest_publishers_and_says_how_many_more(monkeypatch):
    monkeypatch.setattr(limits, "status_publishers_shown_max", 2)
    kpis = PublisherKpis(kept_max=3)
    for n, pid in enumerate(("aa", "bb", "cc", "dd")):
        for kpi in _pair(pid, 1000 * (n + 1), 10 * (n + 1)):
            kpis.note(kpi, now=0.0)
    status = MonitorStatus.decode(_status_doc(kpis))
    lines = _publisher_lines(status)
    assert "publisher cc" in lines[0] and "3,000 sent" in lines[0] and "15 msg/s" in lines[0]
    assert "publisher bb" in lines[1]
    assert lines[2].startswith("    … 1 more publishers (the monitor tracks no more")


def _status_doc(kpis: PublisherKpis) -> dict[str, object]:
    doc = MONITOR_STATUS.encode()
    doc["Publishers"] = [row.fields() for row in kpis.rows(now=0.0)]
    doc["PublishersUntracked"] = kpis.untracked
    return doc


def test_the_analytics_record_reads_publisher_kpis_back(tmp_path):
    recorder = KpiRecorder(tmp_path, "test", 1 << 20)
    for kpi in _pair("aa", 7, 3):
        recorder.append_message([kpi.encode()])
    docs = [
        decode_kpi(bytes(record.payload))
        for _, batch, _ in recorder.log.segments[-1].scan(verify=True)
        for record in batchfmt.iter_records(batch)
    ]
    recorder.close()
    assert [(d["CMD"], d["PublisherID"]) for d in docs] == [(11, "aa"), (12, "aa")]
    with pytest.raises(CorruptRecord, match="PublisherID"):
        encode_kpi({"CMD": 11, "QName": "q1", "Time": 1.0, "TotalSent": 1})
