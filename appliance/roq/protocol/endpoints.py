"""Endpoints peers send each other (`tcp://<ip or host name>:<port>`), checked where they enter.

A report, a notice or a reply names the sockets of other processes: an exchange's `Front`, a
replica's `Endpoint`, a copy's `Log`. A string that is not an endpoint must be refused when the
message is decoded, not found out later when a socket connects to it or a port is computed
from it (issue 16: `Front: "fuzz-front"` crashed the subscribers' feeds and then the monitor).
`parse_endpoint` is the one place that turns such a string into a host and a port; nothing
downstream calls `int()` on an endpoint it was sent. Pure: no sockets, no name lookups.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Final

from roq.errors import DecodeError

PORT_MAX: Final = 65_535  # TCP's
ENDPOINT_CHARS_MAX: Final = 6 + 255 + 2 + 6  # tcp:// + a host name (RFC 1035) + [] + :port
# A host name label (RFC 1123: letters, digits, hyphens inside), or a dotted IPv4 address.
_LABEL = re.compile(r"^[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?$")
_PORT = re.compile(r"^[0-9]{1,5}$")  # ASCII digits only: int() also takes "٣" and " 3_0"


@dataclass(frozen=True)
class Endpoint:
    host: str  # an IPv4 address, a host name, or an IPv6 address without its brackets
    port: int  # 1..65535

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"tcp://{host}:{self.port}"


def _check_host(host: str, text: str) -> str:
    if host.startswith("[") and host.endswith("]"):
        try:
            return str(ipaddress.IPv6Address(host[1:-1]))
        except ValueError:
            raise DecodeError(f"{text!r} is not an endpoint: bad IPv6 address") from None
    labels = host.split(".")
    if not host or len(host) > 253 or not all(_LABEL.match(label) for label in labels):
        raise DecodeError(f"{text!r} is not an endpoint: {host!r} is not an address or host name")
    if all(label.isdigit() for label in labels):  # looks like IPv4: must be one
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise DecodeError(f"{text!r} is not an endpoint: bad IPv4 address") from None
    return host


def parse_endpoint(text: str, *, room: int = 0) -> Endpoint:
    """`tcp://<IPv4, [IPv6] or host name>:<port>`, port 1..65535; `room`: the block of ports
    that starts there must fit too (an exchange's `Front` is F of F..F+3: room 3)."""
    if type(text) is not str or len(text) > ENDPOINT_CHARS_MAX:  # not BSON Code
        raise DecodeError("an endpoint must be a string of at most "
                          f"{ENDPOINT_CHARS_MAX} characters")  # fmt: skip
    if not text.startswith("tcp://"):
        raise DecodeError(f"{text[:80]!r} is not an endpoint: it must start with tcp://")
    host, colon, port = text[len("tcp://") :].rpartition(":")
    if not colon or not _PORT.match(port):
        raise DecodeError(f"{text!r} is not an endpoint: it must end in :<port>")
    number = int(port)
    if not 1 <= number <= PORT_MAX - room:
        raise DecodeError(f"{text!r} is not an endpoint: port must be from 1 to {PORT_MAX - room}")
    return Endpoint(_check_host(host, text), number)


def check_endpoint(text: str, *, room: int = 0) -> str:
    """`text` itself, once `parse_endpoint` accepts it (DecodeError otherwise)."""
    parse_endpoint(text, room=room)
    return text


def check_host(host: str) -> str:
    """An IPv4 address or a host name (what `tcp://…:port` holds before the port)."""
    if host.startswith("["):
        raise DecodeError(f"{host[:80]!r} is not an address or host name")
    return _check_host(host, host)


def port_plus(endpoint: str, delta: int) -> str:
    """The endpoint `delta` ports above (or below) `endpoint`, on the same host: DecodeError if
    `endpoint` is not one or the port leaves 1..65535."""
    parsed = parse_endpoint(endpoint)
    port = parsed.port + delta
    if not 1 <= port <= PORT_MAX:
        raise DecodeError(f"{endpoint!r} has no port {delta:+d}")
    return f"{endpoint.rpartition(':')[0]}:{port}"
