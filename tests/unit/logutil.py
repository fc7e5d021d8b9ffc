"""Helpers shared by the log tests: real batches in the real format."""

from __future__ import annotations

from roq.log import format as fmt

PRODUCER = bytes(range(16))


def batch(seq: int, records: int = 3, size: int = 20, ts_us: int | None = None) -> bytes:
    """A valid unstamped batch of `records` payloads of `size` bytes, sequence from `seq`."""
    ts = 1_700_000_000_000_000 + seq if ts_us is None else ts_us
    payloads = [f"{seq + i}:".encode().ljust(size, b".") for i in range(records)]
    return fmt.encode_batch(PRODUCER, seq, b"key", payloads, [ts + i for i in range(records)])


def seqs(data: bytes) -> list[int]:
    """Sequence numbers of every record in back-to-back batches."""
    out: list[int] = []
    for at, _ in fmt.iter_batches(data):
        out += [record.seq for record in fmt.iter_records(data, at)]
    return out
