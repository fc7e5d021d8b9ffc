"""`roq analytics`: run the Spark job over a message log and its KPI log (docs/analytics.md)."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

import typer

from roq.analytics.kpi import KpiRecorder
from roq.cli.app import app
from roq.cli.common import (
    GCM_OPTION,
    errors_to_exit,
    fail,
    interruptible,
    setup_logging,
    stop_event,
)
from roq.client.locate import locate_monitor
from roq.errors import CorruptRecord, ProtocolError, RoqError
from roq.protocol import bsonmsg
from roq.protocol.messages.kpi import decode_kpi_message
from roq.transport import Kind, connect, new_context, open_socket, wait_readable

log = logging.getLogger(__name__)


@app.command()
def analytics(
    log_dir: str = typer.Option(
        ..., "--log-dir", help="Holds <queue>/<exchange>/*.log (or s3a://)."
    ),
    out: str = typer.Option(..., "--out", help="Where the Parquet tables and the report go."),
    master: str = typer.Option("local[2]", "--master", help="Spark master URL."),
    kpi_dir: str | None = typer.Option(None, "--kpi-dir", help="Holds _kpi/ (default: log dir)."),
    split_mb: int = typer.Option(64, "--split-mb", min=1, help="MiB of segment per Spark task."),
    report_dir: str | None = typer.Option(None, "--report-dir", help="Local report directory."),
    driver_memory: str = typer.Option("1g", "--driver-memory", help="spark-submit's value."),
) -> None:
    """Throughput, latency, CPU and memory per queue, exchange, producer and minute."""
    from roq.analytics import submit

    job_args = ["--split-bytes", str(split_mb << 20)]
    if kpi_dir:
        job_args += ["--kpi-dir", kpi_dir]
    if report_dir:
        job_args += ["--report-dir", report_dir]
    with errors_to_exit():
        submit.check_input(log_dir, kpi_dir)  # refused at once, not after a Spark start
        code = submit.run(log_dir, out, master, job_args, driver_memory)
    if code != 0:
        raise fail(f"spark-submit exited with {code}", code)


KPI_WAIT_S = 60.0  # how long kpi-record waits for a queue that does not exist yet
KPI_POLL_MS = 200
KPI_SEGMENT_BYTES = 16 << 20


@app.command("kpi-record")
def kpi_record(
    queues: list[str] = typer.Option(..., "--queue", "-q", help="Queue whose KPI to record."),
    directory: str = typer.Option("roq-data/log", "--dir", help="Writes DIR/_kpi/<source>/."),
    source: str = typer.Option("kpi-record", "--source", help="Name of this recorder."),
    seconds: float = typer.Option(0.0, "--seconds", help="Stop after this long (0: Ctrl-C)."),
    gcm: str = GCM_OPTION,
) -> None:
    """Record queues' KPI streams into the KPI log that `roq analytics` reads."""
    setup_logging()
    stop = stop_event()
    with errors_to_exit():
        with interruptible(stop):  # finding the queues' monitors: nothing recorded yet
            streams = [_kpi_stream(queue, gcm, stop) for queue in queues]
        recorder = KpiRecorder(directory, source, KPI_SEGMENT_BYTES)
        try:
            recorded = _record(streams, recorder, stop, seconds)
        finally:
            recorder.close()
    typer.echo(f"recorded {recorded} KPI messages under {directory}/_kpi/{source}/")


def _kpi_stream(queue: str, gcm: str, stop: threading.Event) -> str:
    """The queue's KPI stream address (S+1) from the GCM; waits for the queue to be created."""
    deadline = time.monotonic() + KPI_WAIT_S
    while True:
        try:
            return locate_monitor(queue, gcm=gcm, need="subscribe").stat
        except RoqError:
            if time.monotonic() > deadline or stop.is_set():
                raise
            time.sleep(1)


def _record(
    streams: list[str], recorder: KpiRecorder, stop: threading.Event, seconds: float
) -> int:
    """This thread owns the SUB socket; every message becomes one KPI record."""
    context = new_context()
    sock = open_socket(context, Kind.SUB, subscribe=b"")
    for endpoint in streams:
        connect(sock, endpoint)
    end = time.monotonic() + seconds if seconds > 0 else float("inf")
    recorded = 0
    try:
        while not stop.is_set() and time.monotonic() < end:
            if not wait_readable(sock, KPI_POLL_MS):
                continue
            frames = sock.recv_multipart()
            try:
                docs: list[Mapping[str, Any]] = [bsonmsg.decode([frame]) for frame in frames]
                decode_kpi_message(docs)  # the stream's schema: the monitor checked it too
                recorder.append_message(docs)
            # A bad message is a bug (the monitor validates) and is skipped; a disk that refuses
            # the write (LogUnavailable) ends the command.
            except (ProtocolError, CorruptRecord, ValueError) as error:
                log.warning("KPI message of %d frames not recorded: %s", len(frames), error)
                continue
            recorded += 1
    finally:
        sock.close(0)
        context.term()
    return recorded
