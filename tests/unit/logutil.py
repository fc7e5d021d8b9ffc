"""Helpers shared by the log tests: real batches in the real format."""

from __future__ import annotations

import zlib

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


def torn(data: bytes, at: int = 0) -> bytes:
    """`data` with the batch at `at` torn: its record 0 claims 8 bytes more than it has, so
    record 1 is torn, and its CRC is made right again (what a broken publisher can send, or a
    disk error the CRC cannot see)."""
    out = bytearray(data)
    header = fmt.read_header(out, at)
    record0 = at + fmt.HEADER_BYTES + len(header.key)
    size = fmt.LENGTH.unpack_from(out, record0 + 4)[0]
    fmt.LENGTH.pack_into(out, record0 + 4, size + 8)
    crc = zlib.crc32(out[at + fmt.CRC_START : at + header.size])
    fmt.LENGTH.pack_into(out, at + 12, crc)
    return bytes(out)
