"""The address a process binds and announces: an IP as given, or an interface's IPv4 address."""

from __future__ import annotations

import fcntl
import ipaddress
import socket
import struct

from roq.errors import ConfigError

_SIOCGIFADDR = 0x8915  # the ioctl(2) request for an interface's address (Linux ABI, not a bound)


def resolve_interface(value: str) -> str:
    """`network.interface` may hold an IP address or an interface name such as eth0."""
    try:
        return str(ipaddress.ip_address(value))
    except ValueError:
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            packed = fcntl.ioctl(
                sock.fileno(), _SIOCGIFADDR, struct.pack("256s", value[:15].encode())
            )
    except OSError:
        raise ConfigError(
            f"network.interface={value!r}: not an IP address nor an interface with an IPv4 address"
        ) from None
    return socket.inet_ntoa(packed[20:24])
