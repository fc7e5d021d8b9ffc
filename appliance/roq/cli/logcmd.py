"""`roq log inspect DIR|FILE`: print the batches of message-log segments and check them.

Read-only: it never repairs (an exchange's recovery on open does that). A corrupt span is
reported (with the records it skips, when its header says), counted, and the reading goes on
after it. Exit code 0 when every batch is valid, 65 (EX_DATAERR) when corrupt spans or gaps
between segments were found; the summary then says what was skipped and that the rest was read.
"""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import typer

from roq.cli.app import app
from roq.errors import EXIT_DATAERR, EXIT_NOINPUT, EXIT_OK
from roq.log import format as fmt
from roq.log.inspect import Batch, Corrupt, Gap, Summary, segment_files, walk

EXIT_IOERR = 74  # sysexits.h: reading failed

log_app = typer.Typer(name="log", help="Inspect message-log segment files.", no_args_is_help=True)
app.add_typer(log_app, name="log")

PAYLOAD_SHOWN_BYTES = 60


def _ts(us: int | None) -> str:
    if us is None:
        return "-"
    try:
        return datetime.fromtimestamp(us / 1e6, tz=UTC).isoformat(timespec="microseconds")
    except (OverflowError, OSError, ValueError):  # a v2 time may be any int64
        return f"{us}us"


def _key(key: bytes) -> str:
    try:
        return key.decode("utf-8")
    except UnicodeDecodeError:
        return repr(key)


def _print_batch(item: Batch, records: bool) -> None:
    h = item.header
    typer.echo(
        f"offset={item.offset} producer={uuid.UUID(bytes=h.producer_id)} "
        f"seq={h.first_seq}..{h.last_seq} count={h.count} key={_key(h.key)} "
        f"ts={_ts(h.first_ts_us)} bytes={h.size}"
    )
    if records:
        for record in fmt.iter_records(item.data):
            shown = record.payload[:PAYLOAD_SHOWN_BYTES]
            more = "..." if len(record.payload) > PAYLOAD_SHOWN_BYTES else ""
            typer.echo(
                f"  seq={record.seq} ts={_ts(record.timestamp_us)} "
                f"len={len(record.payload)}{_meta(record)} payload={shown!r}{more}"
            )


def _meta(record: fmt.Record) -> str:
    """A v2 record's meta as ` id=… expires=… not_before=… headers=[…]` ("" without)."""
    if record.meta is None:
        return ""
    shown = ""
    if record.message_id is not None:
        shown += f" id={record.message_id.hex()}"
    if record.expires_at_us is not None:
        shown += f" expires={_ts(record.expires_at_us)}"
    if record.not_before_us is not None:
        shown += f" not_before={_ts(record.not_before_us)}"
    if record.headers:
        pairs = ", ".join(
            f"{name}={value[:PAYLOAD_SHOWN_BYTES]!r}" for name, value in record.headers
        )
        shown += f" headers=[{pairs}]"
    return shown


def _print_problem(item: Corrupt | Gap) -> None:
    if isinstance(item, Corrupt):
        typer.echo(
            f"CORRUPT {item.path} offset={item.offset} byte={item.position} "
            f"bytes={item.length}: {item.reason}{_skipped(item)}"
        )
    else:
        typer.echo(f"GAP {item.directory} offsets {item.start}..{item.end}: no segment holds them")


def _print_summary(summary: Summary) -> None:
    typer.echo(
        f"summary: {summary.segments} segments, {summary.batches} batches, "
        f"{summary.records} records, {summary.total_bytes} bytes, "
        f"{len(summary.producers)} producers"
    )
    typer.echo(f"first ts: {_ts(summary.first_ts_us)}  last ts: {_ts(summary.last_ts_us)}")
    for corrupt in summary.corrupt:
        typer.echo(
            f"corrupt: {corrupt.path} at offset {corrupt.offset} (byte {corrupt.position}), "
            f"{corrupt.length} bytes: {corrupt.reason}{_skipped(corrupt)}"
        )
    for gap in summary.gaps:
        typer.echo(f"gap: {gap.directory} offsets {gap.start}..{gap.end}")
    if summary.clean:
        typer.echo("clean")
    else:
        typer.echo(
            f"CORRUPTION FOUND: skipped {len(summary.corrupt)} corrupt span(s) "
            f"({summary.skipped_records} records known) and {len(summary.gaps)} gap(s); "
            "every other batch was read"
        )


def _skipped(corrupt: Corrupt) -> str:
    return "" if corrupt.records is None else f" ({corrupt.records} records skipped)"


@log_app.command("inspect")
def inspect(
    path: Path = typer.Argument(..., help="A segment file or a directory of logs."),
    records: bool = typer.Option(False, "--records", help="Print every record too."),
    as_json: bool = typer.Option(False, "--json", help="Print only a JSON summary."),
) -> None:
    """Print each batch (offset, producer, sequence range, count, key, timestamp) and a
    summary; report corrupt spans with their file and offset. Exit 65 if any were found."""
    if not path.exists():
        typer.echo(f"roq: {path}: no such file or directory", err=True)
        raise typer.Exit(EXIT_NOINPUT)
    summary = Summary(str(path))
    try:
        summary.segments = sum(len(files) for files in segment_files(path))
        for item in walk(path):
            summary.add(item)
            if as_json:
                continue
            if isinstance(item, Batch):
                _print_batch(item, records)
            else:
                _print_problem(item)
    except OSError as error:
        typer.echo(f"roq: {path}: cannot read: {error}", err=True)
        raise typer.Exit(EXIT_IOERR) from None
    if as_json:
        typer.echo(json.dumps(summary.to_dict(), indent=2))
    else:
        _print_summary(summary)
    raise typer.Exit(EXIT_OK if summary.clean else EXIT_DATAERR)
