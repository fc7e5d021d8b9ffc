"""`roq pub`, `roq sub` and `roq bench`: the message commands."""

from __future__ import annotations

import logging
import sys
import threading
import time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import typer

from roq import limits
from roq.cli.app import app
from roq.cli.common import (
    GCM_OPTION,
    ZK_OPTION,
    errors_to_exit,
    interruptible,
    setup_logging,
    stop_event,
)
from roq.cli.pubmeta import DURATION_HELP
from roq.errors import BadInput

if TYPE_CHECKING:  # imported where used: `roq --help` does not load the client
    from roq.log.format import Record

log = logging.getLogger("roq.cli")
NAMESPACE_OPTION = typer.Option("/roq", "--namespace", help="ZooKeeper namespace (with --zk).")


@app.command(rich_help_panel="Messages")
def pub(
    queue: str = typer.Argument(..., help="Queue to publish to."),
    key: str = typer.Option("", "--key", "-k", help="Routing key of every message."),
    count: int | None = typer.Option(
        None, "--count", "-n", min=0, help="Send N generated messages."
    ),
    rate: float = typer.Option(0, "--rate", help="Messages per second (0: as fast as possible)."),
    size: int = typer.Option(100, "--size", help="Payload bytes of generated messages."),
    acks: str = typer.Option("none", "--acks", help="none | leader | all."),
    linger_ms: float = typer.Option(
        2.0, "--linger-ms", help="Longest wait to fill a batch (0: send as soon as possible)."
    ),
    header: list[str] = typer.Option(
        [], "--header", "-H", help="NAME=VALUE on every message (repeatable; a name may repeat)."
    ),
    message_id: str | None = typer.Option(
        None,
        "--id",
        help="Message id of every message: 32 hex digits or a UUID; 'auto': a new random one "
        "for each message.",
    ),
    ttl: str | None = typer.Option(
        None, "--ttl", help=f"Each message expires this long after it is sent ({DURATION_HELP})."
    ),
    delay: str | None = typer.Option(
        None,
        "--delay",
        help=f"Each message is not due before this long after it is sent ({DURATION_HELP}).",
    ),
    gcm: str = GCM_OPTION,
    zk: str | None = ZK_OPTION,
    namespace: str = NAMESPACE_OPTION,
) -> None:
    """Publish messages: one per line of stdin, or --count generated ones of --size bytes.

    --header, --id, --ttl and --delay give every message meta (log format v2; `roq sub --meta`
    prints it); a fixed --id gives every message the same id. A malformed one exits 65 before
    anything is sent. Exits 0 once every message has reached an exchange (with --acks, been
    confirmed).
    """
    setup_logging("WARNING")
    with errors_to_exit():
        from roq.cli.pubmeta import PubMeta
        from roq.client.publisher import Publisher

        meta = PubMeta.read(header, message_id, ttl, delay)

        stop = stop_event()
        with interruptible(stop):  # finding the queue and its exchange: nothing sent yet
            publisher = Publisher(
                queue, gcm=None if zk else gcm, zk=zk, namespace=namespace,
                acks=acks, linger_ms=linger_ms,
            )  # fmt: skip
        sent = 0
        try:
            pacer = _Pacer(rate)
            for payload in _payloads(count, size, stop):
                if stop.is_set():
                    break
                publisher.send(payload, key.encode(), **meta.send_args())
                sent += 1
                pacer.wait(sent)
        finally:
            publisher.close()
        typer.echo(f"roq pub: {sent} messages sent to {queue}", err=True)


def _payloads(count: int | None, size: int, stop: threading.Event):  # type: ignore[no-untyped-def]
    if count is None:
        yield from _stdin_lines(sys.stdin.buffer, stop)
        return
    filler = b"x" * max(0, size - 12)
    for index in range(count):
        yield (b"%011d " % index + filler)[: max(size, 12)]


def _stdin_lines(stream: BinaryIO, stop: threading.Event) -> Iterator[bytes]:
    """Each line without its newline; a line longer than a message ends the command as bad input
    (exit 65), read no further than the bound: a 10 GB line costs no 10 GB of memory. Ctrl-C or
    SIGTERM ends the input even while a read waits for it (what was sent is then flushed)."""
    number = 0
    waiting = interruptible(stop)
    while True:
        try:
            with waiting:
                line = stream.readline(limits.message_bytes_max + 2)
        except KeyboardInterrupt:
            return
        if not line:
            return
        number += 1
        payload = line.removesuffix(b"\n")
        if len(payload) > limits.message_bytes_max:
            raise BadInput(
                f"stdin line {number} is longer than a message may be ({limits.message_bytes_max}"
                f" bytes, limits.message_bytes_max); the {number - 1} lines before it were sent"
            )
        yield payload


class _Pacer:
    """Keeps a send loop at `rate` messages per second (0 = unpaced)."""

    def __init__(self, rate: float):
        self.rate = rate
        self.start = time.monotonic()

    def wait(self, sent: int) -> None:
        if self.rate <= 0:
            return
        ahead = sent / self.rate - (time.monotonic() - self.start)
        if ahead > 0:
            time.sleep(ahead)


@app.command(rich_help_panel="Messages")
def sub(
    queue: str = typer.Argument(..., help="Queue to subscribe to."),
    key: str = typer.Option("", "--key", "-k", help="Routing-key prefix ('' = everything)."),
    count: int | None = typer.Option(None, "--count", "-n", min=1, help="Exit after N messages."),
    timeout: float | None = typer.Option(None, "--timeout", help="Exit after S seconds."),
    from_beginning: bool = typer.Option(
        False, "--from-beginning", help="Start with the oldest message the logs still hold."
    ),
    from_offset: int | None = typer.Option(
        None, "--from-offset", help="Start at this log offset (of every exchange)."
    ),
    from_time: str | None = typer.Option(
        None,
        "--from-time",
        help="Start with messages sent at or after this time (ISO 8601 or Unix seconds).",
    ),
    offsets: Path | None = typer.Option(
        None, "--offsets", help="Resume from and record the position in this file."
    ),
    meta: bool = typer.Option(
        False,
        "--meta",
        help="Print each message's meta (headers, id, times) as JSON, a tab, then the payload.",
    ),
    gcm: str = GCM_OPTION,
    zk: str | None = ZK_OPTION,
    namespace: str = NAMESPACE_OPTION,
) -> None:
    """Print messages, one per line on stdout, until --count messages or --timeout seconds.

    With --meta each line starts with a JSON object: "headers" (name → value, values as UTF-8
    with bad bytes escaped; a name given twice lists its values), "id" (hex, or null: the
    message is then identified by its producer and sequence number), "expires_at_us" and
    "not_before_us" (null when absent), then a tab.

    Exit code 0 when --count messages arrived (or on Ctrl-C / --timeout without --count),
    75 (try again) when --timeout ran out before --count messages.
    """
    setup_logging("WARNING")
    with errors_to_exit():
        from roq.client.subscriber import Subscriber

        stop = stop_event()
        received = requests = 0
        out = sys.stdout.buffer
        with interruptible(stop):  # finding and joining the queue: nothing received yet
            subscriber = Subscriber(
                queue, key.encode(), gcm=None if zk else gcm, zk=zk, namespace=namespace,
                start="beginning" if from_beginning else "now", from_offset=from_offset,
                from_time=_parse_time(from_time), offsets_file=offsets,
                # --timeout bounds the whole command, finding the queue included
                join_timeout_s=limits.placement_timeout_ms / 1000 if timeout is None else timeout,
            )  # fmt: skip
        with subscriber:
            typer.echo(f"roq sub: subscribed to {queue}", err=True)
            deadline = None if timeout is None else time.monotonic() + timeout
            while not stop.is_set() and (count is None or received < count):
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                window = 0.2 if left is None else min(0.2, left)
                wanted = None if count is None else count - received
                printed, skipped = _write(subscriber.messages(wanted, window), out, meta)
                received, requests = received + printed, requests + skipped
                out.flush()
                subscriber.commit()  # after the output is out: at-least-once across a kill
            _report_skipped(requests, subscriber.corrupt_records, subscriber.skipped_bytes)
        if count is not None and received < count and not stop.is_set():
            typer.echo(f"roq sub: only {received} of {count} messages before the timeout", err=True)
            raise typer.Exit(75)


def _write(records: Iterable[Record], out: BinaryIO, meta: bool) -> tuple[int, int]:
    """Print each message (its meta first with --meta); a service's request is counted, not
    printed. Returns (printed, requests)."""
    printed = requests = 0
    for record in records:
        if _is_request(record):
            requests += 1
            continue
        out.write(_meta_json(record) + record.payload + b"\n" if meta else record.payload + b"\n")
        printed += 1
    return printed, requests


def _report_skipped(requests: int, corrupt_records: int, skipped_bytes: int) -> None:
    """What `roq sub` read and did not print, on stderr."""
    if requests:
        typer.echo(f"roq sub: skipped {requests} requests of services (roq call; "
                   "`roq task show` reads one)", err=True)  # fmt: skip
    if corrupt_records or skipped_bytes:
        typer.echo(f"roq sub: skipped {corrupt_records} records of corrupt batches and "
                   f"{skipped_bytes} damaged log bytes", err=True)  # fmt: skip


def _is_request(record: Record) -> bool:
    """A request of `roq call` (a BSON task record keyed `<service>/`, docs/requests.md) rather
    than a message: `roq sub` prints payloads, one per line, for text tools; a request's BSON
    belongs to its service's workers, and its payload is read with `roq task show`."""
    if not record.key.endswith(b"/"):
        return False
    from roq.protocol.messages.tasks import request_of

    return request_of(record.key, record.payload) is not None


def _meta_json(record: Any) -> bytes:
    """`roq sub --meta`'s prefix: the record's meta as one JSON object and a tab."""
    import json

    headers: dict[str, Any] = {}
    for name, value in record.headers:
        text = value.decode(errors="backslashreplace")
        if name in headers:
            before = headers[name]
            headers[name] = [*before, text] if isinstance(before, list) else [before, text]
        else:
            headers[name] = text
    message_id = record.message_id
    doc = {
        "headers": headers,
        "id": None if message_id is None else message_id.hex(),
        "expires_at_us": record.expires_at_us,
        "not_before_us": record.not_before_us,
    }
    return json.dumps(doc, ensure_ascii=False).encode() + b"\t"


def _parse_time(text: str | None) -> float | None:
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        pass
    from datetime import datetime

    try:
        return datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise ValueError(f"--from-time {text!r}: expected ISO 8601 or Unix seconds") from None


@app.command(rich_help_panel="Messages")
def bench(
    queue: str = typer.Option("bench", "--queue", "-q", help="Queue to load (created if absent)."),
    load: Path | None = typer.Option(None, "--load", help="RoQ load description (JSON file)."),
    publishers: int = typer.Option(1, "--publishers", "--max-pub", help="Publisher processes."),
    subscribers: int = typer.Option(1, "--subscribers", "--max-sub", help="Subscriber processes."),
    rate: int = typer.Option(0, "--rate", help="msg/s per publisher (0: as fast as possible)."),
    payload: int = typer.Option(100, "--payload", "--size", help="Bytes per message."),
    seconds: float = typer.Option(10.0, "--seconds", help="How long publishers send."),
    linger_ms: float = typer.Option(
        2.0, "--linger-ms", help="Batch linger; 0 = unbatched (one send() per message)."
    ),
    batch_bytes: int = typer.Option(
        limits.publisher_batch_bytes_default,
        "--batch-bytes",
        help="A batch leaves at this many bytes; 1 = a frame per message.",
    ),
    acks: str = typer.Option("none", "--acks", help="none | leader | all."),
    headers: int = typer.Option(0, "--headers", min=0, help="Headers per message (log format v2)."),
    header_bytes: int = typer.Option(
        32, "--header-bytes", min=0, help="Bytes of each header's value."
    ),
    chart: Path | None = typer.Option(None, "--chart", help="Draw throughput/latency PNG."),
    gcm: str = GCM_OPTION,
    zk: str | None = ZK_OPTION,
    namespace: str = NAMESPACE_OPTION,
) -> None:
    """Load a queue and print one JSON line: msg/s and MB/s published and delivered, latency
    p50/p99/p99.9, lost and duplicated counts. Progress goes to stderr every second."""
    setup_logging("WARNING")
    with errors_to_exit():
        import json as _json

        from roq.client import bench as benchmod
        from roq.client.admin import AdminClient

        if load is not None:
            description = benchmod.LoadDescription.from_json(load.read_text(), str(load))
        else:
            description = benchmod.LoadDescription(
                seconds=seconds, maxPub=publishers, maxSub=subscribers, payload=payload,
                rate=rate, linger_ms=linger_ms, batch_bytes=batch_bytes, acks=acks,
                headers=headers, header_bytes=header_bytes,
            ).checked()  # fmt: skip
        client_args = ["--zk", zk, "--namespace", namespace] if zk else ["--gcm", gcm]
        with AdminClient(gcm=None if zk else gcm, zk=zk, namespace=namespace) as admin:
            if not admin.queue_exists(queue):
                admin.create_queue(queue)
                typer.echo(f"roq bench: created queue {queue}", err=True)
        # Ctrl-C or SIGTERM: its workers are ended and it exits 130, with no summary
        with interruptible(stop_event()):
            summary = benchmod.run(description, queue, client_args,
                                   lambda s: typer.echo(s, err=True))  # fmt: skip
        if chart is not None:
            benchmod.draw_chart(summary, str(chart))
            typer.echo(f"roq bench: chart written to {chart}", err=True)
        summary.pop("series")
        typer.echo(_json.dumps(summary))


@app.command("bench-worker", hidden=True)
def bench_worker(
    role: str = typer.Argument(..., help="pub | sub"),
    queue: str = typer.Argument(...),
    load: str = typer.Option(..., "--load", help="The load description as JSON."),
    gcm: str | None = typer.Option(None, "--gcm"),
    zk: str | None = ZK_OPTION,
    namespace: str = NAMESPACE_OPTION,
) -> None:
    """One publisher or subscriber of `roq bench` (JSON lines on stdout)."""
    setup_logging("WARNING")
    with errors_to_exit():
        from roq.client import bench as benchmod

        description = benchmod.LoadDescription.from_json(load, "--load")
        client = {"gcm": gcm, "zk": zk, "namespace": namespace}
        worker = benchmod.publisher_worker if role == "pub" else benchmod.subscriber_worker
        worker(description, queue, client)
