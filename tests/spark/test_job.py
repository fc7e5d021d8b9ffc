"""The Spark job end to end: real spark-submit on local[2] over segments this test writes (several
queues, exchanges, producers, segments split into several tasks, a bad CRC, a torn tail, a bad
KPI record), then the Parquet tables are checked against what was written. One job run
(pyspark starts slowly), checked by several functions of one test."""

from __future__ import annotations

import random
import statistics
import uuid
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from segments import SegmentWriter, Written, producer_id

from roq.analytics import kpi, submit
from roq.log import format as fmt
from roq.protocol.latency import histogram_fields

# one Spark JVM at a time (local[2] each): two at once on the 2-core CI machine, both timed
# out at 200 s in a clean-clone run, where each takes ~75 s alone
pytestmark = [pytest.mark.spark, pytest.mark.xdist_group("spark"), pytest.mark.timeout(240)]

T0 = 1_700_000_040_000_000  # a minute boundary (µs)
MINUTE = 60_000_000
SPLIT_BYTES = 7000  # several tasks per segment file, so ranges resynchronise inside files
LAYOUT = {"orders": ["x1", "x2"], "audit": ["x3"]}  # queue -> exchanges
PRODUCERS = {"orders": ["p1", "p2", "p3"], "audit": ["p4"]}


@dataclass
class Run:
    out: Path
    written: Written
    lost: Counter[tuple[str, str]]  # messages the test corrupted, per (queue, producer)
    lost_bytes: Counter[tuple[str, str]]
    corrupt: list[tuple[str, int, int]]  # (path, position, bytes skipped)
    samples: dict[str, list[int]]  # latency samples per queue
    cpu: dict[str, list[float]]  # per exchange


def _write_log(root: Path, rng: random.Random) -> tuple[Written, dict[Path, list[tuple]]]:
    written = Written()
    per_file: dict[Path, list[tuple]] = {}
    for queue, exchanges in LAYOUT.items():
        writers = [SegmentWriter(root, queue, x, 20_000, written) for x in exchanges]
        for k, name in enumerate(PRODUCERS[queue]):
            seq = 0
            for n in range(40):  # 40 batches over ~3 minutes; relocation: switch exchange midway
                writer = writers[(k + n // 20) % len(writers)]
                count = rng.randrange(1, 30)
                payloads = [rng.randbytes(rng.randrange(0, 200)) for _ in range(count)]
                ts = T0 + n * 4_000_000 + k * 1000
                before = len(written.batch_positions)
                # every third batch in log format v2: headers that are not payload bytes
                metas = None
                if n % 3 == 1:
                    meta = fmt.encode_meta({"trace": rng.randbytes(32)}, expires_at_us=ts)
                    metas = [meta if i % 2 else b"" for i in range(count)]
                stamps = [ts + i for i in range(count)]
                writer.append(producer_id(name), seq, payloads, stamps, metas)
                path, at, size, _ = written.batch_positions[before]
                per_file.setdefault(path, []).append((queue, name, at, size, count, payloads))
                seq += count
    return written, per_file


def _corrupt(per_file: dict[Path, list[tuple]], run: Run) -> None:
    """Flip a payload byte in one batch (bad CRC) and tear the tail of another file."""
    files = sorted(per_file)
    crc_file, torn_file = files[0], files[-1]
    queue, name, at, size, count, payloads = per_file[crc_file][3]
    data = bytearray(crc_file.read_bytes())
    data[at + size - 1] ^= 0x5A if payloads[-1] else 0  # the last payload is not empty
    if not payloads[-1]:
        data[at + 30] ^= 0x5A  # first_ts byte: covered by the CRC too
    crc_file.write_bytes(bytes(data))
    run.corrupt.append((str(crc_file), at, size))
    run.lost[(queue, producer_id(name).hex())] += count
    run.lost_bytes[(queue, producer_id(name).hex())] += sum(map(len, payloads))
    queue, name, at, size, count, payloads = per_file[torn_file][-1]
    with open(torn_file, "r+b") as f:
        f.truncate(at + size - 7)
    run.corrupt.append((str(torn_file), at, size - 7))
    run.lost[(queue, producer_id(name).hex())] += count
    run.lost_bytes[(queue, producer_id(name).hex())] += sum(map(len, payloads))


def _write_kpi(root: Path, rng: random.Random, run: Run) -> None:
    """KPI messages as the stream carries them (exchange.py's 20/21/22 envelope, the subscriber's
    CMD 31): `orders` subscribers add latency histograms, `audit`'s send only MeanLat/P99Lat."""
    recorder = kpi.KpiRecorder(root, "host-a", segment_bytes_max=4000)
    for minute in range(3):
        now = (T0 + minute * MINUTE + 59_000_000) / 1e6
        for queue, exchanges in LAYOUT.items():
            for x in exchanges:
                cpu = rng.uniform(0.05, 0.6)
                run.cpu.setdefault(x, []).append(cpu * 100)
                recorder.append_message([
                    {"CMD": 20, "X_ID": x, "QName": queue, "Time": now},
                    {"CMD": 21, "Period": 60.0, "Processed": 12.5, "Throughput": 900.0,
                     "TotalProcessed": 10, "TotalThroughput": 10, "Producers": 2},
                    {"CMD": 22, "CPU": 0.7, "ProcessCPU": cpu, "MEMORY": 50.0 + minute / 10},
                ])  # fmt: skip
            samples = [rng.randrange(800, 5000) for _ in range(400)]
            run.samples.setdefault(queue, []).extend(samples)
            ranked = sorted(samples)
            doc = {"CMD": 31, "Time": now, "QName": queue, "SubscriberID": f"s-{queue}",
                   "TotalReceived": 400 * (minute + 1), "Lost": 0, "Duplicates": 0,
                   "MeanLat": statistics.fmean(samples) / 1000,
                   "P99Lat": ranked[int(len(ranked) * 0.99)] / 1000}  # fmt: skip
            if queue == "orders":
                doc.update(histogram_fields(samples))
            recorder.append_message([doc])
    # a CRC-valid batch whose payload is not BSON: reported as a corrupt KPI record
    batch = bytearray(fmt.encode_batch(recorder.producer_id, 999, b"kpi", [b"junk"], [T0]))
    segment = sorted(recorder.path.iterdir())[-1]
    fmt.stamp_offset(batch, int(segment.name[:20]) + segment.stat().st_size)
    with open(segment, "ab") as f:
        f.write(batch)
    run.corrupt.append((str(segment), segment.stat().st_size - len(batch), 4))


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Run:
    root = tmp_path_factory.mktemp("log")
    rng = random.Random(11)
    written, per_file = _write_log(root, rng)
    run = Run(tmp_path_factory.mktemp("out"), written, Counter(), Counter(), [], {}, {})
    _corrupt(per_file, run)
    _write_kpi(root, rng, run)
    code = submit.run(
        str(root), str(run.out), "local[2]", ["--split-bytes", str(SPLIT_BYTES)], "512m", 200
    )
    assert code == 0
    return run


def _table(run: Run, name: str) -> list[dict]:
    return pq.read_table(run.out / name).to_pylist()


def _check_counts_per_producer_are_exact(job: Run) -> None:
    got = {(r["queue"], r["producer"]): r for r in _table(job, "producers")}
    for key, messages in job.written.messages.items():
        queue, hexid = key
        row = got[(queue, str(uuid.UUID(hex=hexid)))]
        assert row["messages"] == messages - job.lost[key]
        assert row["bytes"] == job.written.payload_bytes[key] - job.lost_bytes[key]
    assert len(got) == 4
    relocated = [r for r in got.values() if r["queue"] == "orders"]
    assert all(r["exchanges"] == 2 for r in relocated)  # each moved to the other exchange


def _check_counts_per_queue_and_minute_add_up(job: Run) -> None:
    per_queue: Counter[str] = Counter()
    for row in _table(job, "queue_minute"):
        per_queue[row["queue"]] += row["messages"]
    for queue in LAYOUT:
        expected = sum(m - job.lost[k] for k, m in job.written.messages.items() if k[0] == queue)
        assert per_queue[queue] == expected
    minutes = {row["minute"] for row in _table(job, "traffic")}
    assert len(minutes) == 3


def _check_corrupt_regions_are_reported_with_file_and_offset(job: Run) -> None:
    rows = _table(job, "corrupt")
    got = sorted((r["path"], r["position"], r["bytes_skipped"]) for r in rows)
    assert got == sorted(job.corrupt)
    reasons = " ".join(r["reason"] for r in rows)
    assert "CRC" in reasons and "not BSON" in reasons
    segments = {r["path"]: r for r in _table(job, "segments")}
    assert sum(r["corrupt_regions"] for r in segments.values()) == 3


def _check_latency_percentiles_within_the_measured_range(job: Run) -> None:
    rows = {r["queue"]: r for r in _table(job, "latency_total")}
    samples = job.samples["orders"]  # with histograms: merged percentiles
    row = rows["orders"]
    assert row["samples"] == len(samples)
    assert (row["min_us"], row["max_us"]) == (min(samples), max(samples))
    assert row["mean_us"] == pytest.approx(statistics.fmean(samples))
    true50 = statistics.median(samples)
    true99 = sorted(samples)[int(0.99 * len(samples)) - 1]
    assert true50 <= row["p50_us"] <= true50 * 1.1
    assert true99 <= row["p99_us"] <= max(samples)
    audit = rows["audit"]  # only what the subscriber reported: mean and p99 per period
    assert audit["samples"] == 0 and audit["p50_us"] is None
    assert min(job.samples["audit"]) < audit["reported_mean_us"] < max(job.samples["audit"])
    assert audit["reported_p99_us"] <= max(job.samples["audit"])


def _check_exchange_load_from_kpi(job: Run) -> None:
    rows = _table(job, "exchange_minute")
    for exchange, cpus in job.cpu.items():
        mine = sorted((r for r in rows if r["exchange"] == exchange), key=lambda r: r["minute"])
        assert [r["cpu_pct"] for r in mine] == pytest.approx(cpus)
        assert [r["mem_rss_mb"] for r in mine] == pytest.approx([50.0, 50.1, 50.2])
        assert all(r["loadavg"] == pytest.approx(0.7) for r in mine)
    evaluation = _table(job, "evaluation")
    assert {r["exchange"] for r in evaluation} == {"x1", "x2", "x3"}


def _check_report_and_charts(job: Run) -> None:
    report = (job.out / "report.md").read_text()
    assert "## Corrupt or truncated input" in report and job.corrupt[0][0] in report
    for chart in ("throughput", "latency", "load", "evaluation"):
        png = job.out / "charts" / f"{chart}.png"
        assert png.read_bytes()[:4] == b"\x89PNG" and png.stat().st_size > 10_000
        assert f"charts/{chart}.png" in report


def test_job_tables_match_the_written_segments(job: Run) -> None:
    """One test, so that the one spark-submit run happens once even under pytest-xdist (a
    session fixture runs once per worker)."""
    _check_counts_per_producer_are_exact(job)
    _check_counts_per_queue_and_minute_add_up(job)
    _check_corrupt_regions_are_reported_with_file_and_offset(job)
    _check_latency_percentiles_within_the_measured_range(job)
    _check_exchange_load_from_kpi(job)
    _check_report_and_charts(job)
