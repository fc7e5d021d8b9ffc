"""What one Spark task does with one byte range of one segment (runs in an executor's Python).

It yields tagged tuples, already combined within the range (one row per producer and minute, not
per message), so the data that leaves the executor is small whatever the log's size:

    ("traffic", queue, exchange, producer, minute, messages, bytes, batches, first_ts_us,
                last_ts_us, min_seq, max_seq)
    ("range",   path, kind, queue, source, size, batches, records)
    ("corrupt", kind, path, queue, source, position, log_offset, bytes_skipped, reason)
    ("xload",   queue, exchange, host, minute, ts_us, period_s, msgs_per_s, bytes_per_s,
                producers, cpu_pct, mem_rss_bytes, loadavg)
    ("lat",     queue, exchange, subscriber, minute, count, sum_us, min_us, max_us, idx[], cnt[],
                mean_lat_ms, p99_lat_ms)
    ("qstat",   queue, minute, xchanges, producers, bytes_per_s, msgs_per_s)
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

from roq.analytics import kpi, scan
from roq.analytics.files import Task, resolve
from roq.errors import CorruptRecord
from roq.log import format as fmt
from roq.protocol.commands import StatCommand

Row = tuple[Any, ...]


def run(task: Task) -> Iterator[Row]:
    """Scan the task's range; see the module docstring for the rows."""
    filesystem, path = resolve(task.file.uri)
    rows: list[Row] = []  # KPI rows of this range: bounded by the range's size / 30 bytes
    counts: dict[bytes, dict[int, scan.ProducerMinute]] = {}
    if task.file.kind == "log":

        def handle(buf: bytes, i: int, header: fmt.BatchHeader) -> None:
            scan.count_records(buf, i, header, counts.setdefault(header.producer_id, {}))
    else:

        def handle(buf: bytes, i: int, header: fmt.BatchHeader) -> None:
            rows.extend(list(kpi_rows(task, buf, i, header)))  # all or nothing

    with filesystem.open_input_file(path) as stream:
        window = scan.Window(stream, task.file.size)
        result = scan.scan_range(window, task.file.base, task.start, task.end, handle)
    file = task.file
    for bad in result.corrupt:
        yield _corrupt(task, bad.position, bad.skipped, bad.reason)
    yield ("range", file.uri, file.kind, file.queue, file.source, file.size, result.batches,
           result.records)  # fmt: skip
    for producer, minutes in counts.items():
        name = str(uuid.UUID(bytes=producer))
        for minute, c in minutes.items():
            yield ("traffic", file.queue, file.source, name, minute, c.messages, c.payload_bytes,
                   c.batches, c.first_ts_us, c.last_ts_us, c.min_seq, c.max_seq)  # fmt: skip
    yield from rows


def _corrupt(task: Task, position: int, skipped: int, reason: str) -> Row:
    file = task.file
    return ("corrupt", file.kind, file.uri, file.queue, file.source, position,
            file.base + position, skipped, reason)  # fmt: skip


def kpi_rows(task: Task, buf: bytes, i: int, header: fmt.BatchHeader) -> Iterator[Row]:
    """Decode each KPI record; a bad document is a `corrupt` row, the others still count."""
    position = header.base_offset - task.file.base
    for record in fmt.iter_records(buf[i : i + header.size]):
        try:
            doc = kpi.decode_kpi(record.payload)
        except CorruptRecord as error:
            yield _corrupt(task, position, len(record.payload), f"KPI seq {record.seq}: {error}")
            continue
        row = kpi_row(doc)
        if row is not None:
            yield row


def _num(doc: dict[str, Any], name: str) -> float | None:
    value = doc.get(name)
    return None if value is None else float(value)


def kpi_row(doc: dict[str, Any]) -> Row | None:
    """The row of one checked KPI document (publisher documents and lone 20/22 frames are not
    analysed)."""
    cmd, queue, ts = doc["CMD"], kpi.queue_name(doc), kpi.ts_us(doc)
    minute = ts // scan.MICROS_PER_MINUTE
    if cmd == StatCommand.EXCHANGE_MIN:
        cpu, mem = _num(doc, "ProcessCPU"), _num(doc, "MEMORY")
        return ("xload", queue, doc["X_ID"], str(doc.get("Host", "")), minute, ts,
                _num(doc, "Period"), _num(doc, "Processed"), _num(doc, "Throughput"),
                _num(doc, "Producers"), None if cpu is None else cpu * 100.0,
                None if mem is None else mem * 2**20, _num(doc, "CPU"))  # fmt: skip
    if cmd == StatCommand.SUBSCRIBER_TOTAL:
        return ("lat", queue, str(doc.get("X_ID", "")), doc["SubscriberID"], minute,
                int(doc.get("LatCount", 0)), float(doc.get("LatSumUs", 0)),
                float(doc.get("LatMinUs", 0)), float(doc.get("LatMaxUs", 0)),
                [int(v) for v in doc.get("LatIdx", [])],
                [int(v) for v in doc.get("LatCnt", [])],
                _num(doc, "MeanLat"), _num(doc, "P99Lat"))  # fmt: skip
    if cmd == StatCommand.QUEUE:
        return ("qstat", queue, minute, _num(doc, "XChanges"), _num(doc, "Producers"),
                _num(doc, "Throughput"), _num(doc, "Msgs"))  # fmt: skip
    return None
