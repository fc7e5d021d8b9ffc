"""systemd readiness notification (sd_notify) without a dependency.

One datagram to $NOTIFY_SOCKET ('@' = abstract namespace). The shipped executable is one-dir, so
the notifying process is the unit's main PID and the units keep NotifyAccess=main; a one-file
build would notify from the bootloader's child and need NotifyAccess=all (MAINPID= is sent for
that case).
"""

from __future__ import annotations

import os
import socket


def notify(state: str) -> bool:
    """Send `state` (e.g. "READY=1") if systemd asked for it; True if a datagram was sent."""
    address = os.environ.get("NOTIFY_SOCKET")
    if not address:
        return False
    if address.startswith("@"):
        address = "\0" + address[1:]
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.connect(address)
            sock.sendall(state.encode())
    except OSError:
        return False
    return True


def ready(status: str) -> bool:
    return notify(f"READY=1\nSTATUS={status}\nMAINPID={os.getpid()}")


def stopping() -> bool:
    return notify("STOPPING=1")
