"""The pure segment scanner and KPI codec (no Spark): ranges agree on batch boundaries, corruption
is reported once with its position, and KPI documents round-trip or are refused with a reason."""

from __future__ import annotations

import os
import random
from pathlib import Path

import bson
import pytest
from segments import SegmentWriter, Written, producer_id

from roq.analytics import kpi, scan
from roq.errors import CorruptRecord
from roq.log import format as fmt
from roq.log import segment_name
from roq.protocol.latency import bucket_lower_us, bucket_upper_us, histogram_fields, latency_bucket

T0 = 1_700_000_000_000_000


def _write(root: Path, batches: int) -> Written:
    out = Written()
    writer = SegmentWriter(root, "q1", "x1", 1 << 30, out)
    rng = random.Random(7)
    for n in range(batches):
        payloads = [rng.randbytes(rng.randrange(0, 300)) for _ in range(5)]
        writer.append(producer_id("p"), n * 5, payloads, [T0 + n * 1000 + k for k in range(5)])
    return out


def _scan(path: Path, split: int) -> tuple[int, int, list[scan.Corruption]]:
    size = path.stat().st_size
    batches = records = 0
    corrupt: list[scan.Corruption] = []
    with open(path, "rb") as f:
        for start in range(0, size, split):
            window = scan.Window(f, size, window_bytes=4096)
            got = scan.scan_range(window, 0, start, min(start + split, size), lambda *_: None)
            batches, records = batches + got.batches, records + got.records
            corrupt += got.corrupt
    return batches, records, corrupt


@pytest.mark.parametrize("split", [97, 1000, 1 << 20])
def test_ranges_partition_the_batches(tmp_path: Path, split: int) -> None:
    _write(tmp_path, 60)
    assert _scan(tmp_path / "q1/x1/00000000000000000000.log", split) == (60, 300, [])


@pytest.mark.parametrize("split", [113, 1 << 20])
def test_bad_crc_and_torn_tail_are_reported_once(tmp_path: Path, split: int) -> None:
    out = _write(tmp_path, 40)
    path, at, size, _ = out.batch_positions[10]
    data = bytearray(path.read_bytes())
    data[at + size - 1] ^= 0xFF  # last payload byte of batch 10: CRC mismatch
    last_at = out.batch_positions[-1][1]
    path.write_bytes(bytes(data[: last_at + 30]))  # the last batch is torn
    batches, records, corrupt = _scan(path, split)
    assert (batches, records) == (38, 190)
    assert [(c.position, c.skipped) for c in corrupt] == [(at, size), (last_at, 30)]
    assert "CRC" in corrupt[0].reason


def test_count_records_by_minute(tmp_path: Path) -> None:
    batch = fmt.encode_batch(producer_id("p"), 5, b"k", [b"ab", b"cde"], [T0, T0 + 60_000_000])
    into: dict[int, scan.ProducerMinute] = {}
    scan.count_records(batch, 0, fmt.check_batch(batch), into)
    minutes = sorted(into)
    assert [into[m].messages for m in minutes] == [1, 1]
    assert [into[m].payload_bytes for m in minutes] == [2, 3]
    assert (into[minutes[1]].min_seq, into[minutes[1]].max_seq) == (6, 6)


def test_kpi_roundtrip_and_refusal(tmp_path: Path) -> None:
    latency = histogram_fields([5, 900])
    doc = {"CMD": 31, "TS": T0, "QName": "q1", "SubscriberID": "s", **latency}
    assert kpi.decode_kpi(kpi.encode_kpi(doc))["LatCnt"] == [1, 1]
    with pytest.raises(CorruptRecord, match="SubscriberID"):
        kpi.decode_kpi(bson.encode({"CMD": 31, "TS": T0, "QName": "q1"}))
    with pytest.raises(CorruptRecord, match="not BSON"):
        kpi.decode_kpi(b"\x05\x00\x00")
    recorder = kpi.KpiRecorder(tmp_path, "host-a", segment_bytes_max=400)
    for n in range(5):
        recorder.append([{**doc, "TS": T0 + n}])
    segments = sorted((tmp_path / "_kpi/host-a").iterdir())
    assert len(segments) > 1
    docs = [
        kpi.decode_kpi(record.payload)
        for seg in segments
        for at, _ in fmt.iter_batches(seg.read_bytes())
        for record in fmt.iter_records(seg.read_bytes(), at)
    ]
    assert [d["TS"] for d in docs] == [T0 + n for n in range(5)]
    assert int(segments[1].name[:20]) == segments[0].stat().st_size  # named by byte offset


def test_the_kpi_log_is_a_roq_log_cut_at_a_torn_tail(tmp_path: Path) -> None:
    doc = {"CMD": 23, "TS": T0, "QName": "q1"}
    recorder = kpi.KpiRecorder(tmp_path, "host-a", segment_bytes_max=1 << 20)
    for n in range(3):
        recorder.append([{**doc, "TS": T0 + n}])
    recorder.close()
    [segment] = sorted((tmp_path / "_kpi/host-a").iterdir())
    assert segment.name == segment_name(0)
    os.truncate(segment, segment.stat().st_size - 5)  # a crash in the middle of the third
    recorder = kpi.KpiRecorder(tmp_path, "host-a", segment_bytes_max=1 << 20)
    assert recorder.seq == 2  # after the two batches kept
    recorder.append([{**doc, "TS": T0 + 9}])
    recorder.close()
    data = segment.read_bytes()
    records = [r for at, _ in fmt.iter_batches(data) for r in fmt.iter_records(data, at)]
    assert [(r.seq, kpi.decode_kpi(r.payload)["TS"]) for r in records] == [
        (0, T0), (1, T0 + 1), (2, T0 + 9),
    ]  # fmt: skip


def test_latency_buckets_bound_the_sample() -> None:
    for sample in (1, 7, 100, 12_345, 10**9):
        index = latency_bucket(sample)
        assert bucket_lower_us(index) <= sample < bucket_upper_us(index)


def test_listing_and_planning(tmp_path: Path) -> None:
    from roq.analytics import files

    layout = [
        ("q/x/00000000000000000000.log", 10),
        ("q/x/00000000000000000010.log", 25),
        ("q/x/notes.txt", 3),  # not a segment
        ("q/x/123.log", 3),  # not a 20-digit name
        ("_kpi/h/00000000000000000000.log", 4),
        ("deep/er/x/00000000000000000000.log", 1),  # not <queue>/<exchange>/
    ]
    for rel, size in layout:
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(b"\0" * size)
    logs = files.list_segments(str(tmp_path), "log")
    assert [(f.queue, f.source, f.base, f.size) for f in logs] == [
        ("q", "x", 0, 10),
        ("q", "x", 10, 25),
    ]
    kpis = files.list_segments(str(tmp_path), "kpi")
    assert [(f.queue, f.source) for f in kpis] == [("_kpi", "h")]
    plan = files.plan(logs, 10)
    assert [(t.file.base, t.start, t.end) for t in plan] == [
        (0, 0, 10),
        (10, 0, 10),
        (10, 10, 20),
        (10, 20, 25),
    ]
    assert files.list_segments(str(tmp_path / "absent"), "log") == []
