"""One batch read back from an exchange's log by its offset, outside any Subscriber: for a reader
that keeps where a message is rather than the message itself (the HTTP gateway's index beyond
its memory bound, http/index.py).

A read is one DEALER on the exchange's log port (F+3), as a feed's catch-up reads (feed.py),
asking for the batch at `offset` alone (`max_bytes` 1: the exchange answers at least one whole
batch). A socket per read: reads come from several worker threads, a socket belongs to one, and
the read is the slow path (a message the gateway no longer holds in memory). Every failure is a
`LogReadFailed` naming the exchange, the offset and why; nothing here retries.
"""

from __future__ import annotations

import functools
from typing import Any

from roq.errors import CorruptRecord, ProtocolError, RoqError, TransportError
from roq.log import format as batchfmt
from roq.protocol import dataplane
from roq.protocol.ports import ExchangePort, sibling
from roq.transport import (
    Kind,
    connect,
    new_context,
    open_socket,
    recv_nowait,
    send_nowait,
    wait_readable,
)


class LogReadFailed(RoqError):
    """The batch could not be read back (no answer, evicted, damaged): why, and where."""


@functools.cache
def _shared_context() -> Any:
    return new_context()  # contexts are thread-safe: one for every read of the process


def read_batch(back: str, offset: int, timeout_s: float) -> list[batchfmt.Record]:
    """The records of the batch at `offset` of the log of the exchange whose back (feed) address
    is `back`."""
    where = f"exchange at {back}, log offset {offset}"
    sock = open_socket(_shared_context(), Kind.DEALER, linger_ms=0)
    try:
        connect(sock, sibling(back, ExchangePort.BACK, ExchangePort.LOG))
        if not send_nowait(sock, dataplane.read_request(offset, max_bytes=1)):
            raise LogReadFailed(f"{where}: the read could not be sent")
        if not wait_readable(sock, int(timeout_s * 1000)):
            raise LogReadFailed(f"{where}: no answer within {timeout_s:.1f} s")
        frames = recv_nowait(sock)
        if frames is None:
            raise LogReadFailed(f"{where}: no answer")
        reply = dataplane.parse_read_reply(frames)
    except (ProtocolError, TransportError) as error:
        raise LogReadFailed(f"{where}: {error}") from None
    finally:
        sock.close(0)
    return _records(where, offset, reply)


def _records(where: str, offset: int, reply: dataplane.ReadReply) -> list[batchfmt.Record]:
    if reply.status == dataplane.READ_EVICTED:
        raise LogReadFailed(f"{where}: evicted by retention (the log starts at {reply.start})")
    if reply.status != dataplane.READ_BATCHES or not reply.data:
        reason = reply.data.decode(errors="replace") if reply.status == dataplane.READ_ERROR else ""
        raise LogReadFailed(f"{where}: nothing read (status {reply.status!r}) {reason}".rstrip())
    try:
        header = batchfmt.check_batch(memoryview(reply.data), 0)
        if header.base_offset != offset:
            raise LogReadFailed(f"{where}: the batch read starts at {header.base_offset}")
        batch = memoryview(reply.data)[: header.size]
        batchfmt.check_records(batch, header)
        return list(batchfmt.iter_records(batch))
    except CorruptRecord as error:
        raise LogReadFailed(f"{where}: the batch is damaged: {error}") from None
