"""A gateway message as a record of a roq log: the payload carries its topic and index, and the
meta of a v2 publish (headers, id, expiry, not-before).

    version 1 = 1 (1 byte) | index (8 bytes, big-endian) | topic length (2) | topic | message
    version 2 = 2 (1 byte) | index (8) | topic length (2) | meta length (2) | topic | meta | message

`meta` is a log record's meta section as `format.encode_meta` writes it (docs/log-format.md §1),
so its bounds (`limits.record_headers_*`) and its checks are the log's. A message without meta is
written as version 1, byte for byte as before. Decision: the meta travels inside the gateway's
payload, not as the log record's own meta, because the gateway enforces expiry and delay itself,
per subscriber position (gateway.py), and its log readers must file every message whatever a
library subscriber does with those times: a message held back or dropped by its reader would be a
hole in a topic's indexes. An older gateway skips version 2 payloads as not its own.

Every topic shares one routing key (`KEY`): topics are not roq keys (a key holds at most
`limits.key_bytes_max` bytes, a topic name up to maxNameLen characters of UTF-8), and one key
lets the publisher batch the messages of many topics together. The index travels in the record,
so every gateway files a message under the same index whatever order the logs deliver it in.
"""

from __future__ import annotations

import struct

from roq.errors import CorruptRecord
from roq.log.format import decode_meta

KEY = b"mq"
VERSION, VERSION_META = 1, 2
HEADER = struct.Struct(">BQH")
HEADER_META = struct.Struct(">BQHH")


def encode(topic: bytes, index: int, message: bytes, meta: bytes = b"") -> bytes:
    if not meta:
        return HEADER.pack(VERSION, index, len(topic)) + topic + message
    return HEADER_META.pack(VERSION_META, index, len(topic), len(meta)) + topic + meta + message


def decode(payload: bytes) -> tuple[str, int, str, bytes] | None:
    """(topic, index, message, meta: b"" for none), or None for a record that is not a gateway
    message (or one whose meta is unsound)."""
    if len(payload) < HEADER.size:
        return None
    version, index, length = HEADER.unpack_from(payload)
    if version == VERSION:
        start, meta_length = HEADER.size, 0
    elif version == VERSION_META and len(payload) >= HEADER_META.size:
        start, meta_length = HEADER_META.size, HEADER_META.unpack_from(payload)[3]
    else:
        return None
    end = start + length + meta_length
    if len(payload) < end:
        return None
    meta = payload[start + length : end]
    try:
        if meta:
            decode_meta(meta)
        return payload[start : start + length].decode(), index, payload[end:].decode(), meta
    except (UnicodeDecodeError, CorruptRecord):
        return None
