"""A gateway message as a record of a roq log: the payload carries its topic and index.

    payload = version (1 byte) | index (8 bytes, big-endian) | topic length (2) | topic | message

Every topic shares one routing key (`KEY`): topics are not roq keys (a key holds at most
`limits.key_bytes_max` bytes, a topic name up to maxNameLen characters of UTF-8), and one key
lets the publisher batch the messages of many topics together. The index travels in the record,
so every gateway files a message under the same index whatever order the logs deliver it in.
"""

from __future__ import annotations

import struct

KEY = b"mq"
VERSION = 1
HEADER = struct.Struct(">BQH")


def encode(topic: bytes, index: int, message: bytes) -> bytes:
    return HEADER.pack(VERSION, index, len(topic)) + topic + message


def decode(payload: bytes) -> tuple[str, int, str] | None:
    """(topic, index, message), or None for a record that is not a gateway message."""
    if len(payload) < HEADER.size:
        return None
    version, index, length = HEADER.unpack_from(payload)
    end = HEADER.size + length
    if version != VERSION or len(payload) < end:
        return None
    try:
        return payload[HEADER.size : end].decode(), index, payload[end:].decode()
    except UnicodeDecodeError:
        return None
