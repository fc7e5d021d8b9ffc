"""Port allocation on a host: blocks of consecutive ports from a free list, claimed in ZooKeeper.

Each role takes a fixed block (monitor 6, stat monitor 2, exchange 4) at `base + width × slot`
(`protocol.ports.host_block`: the port map owns the widths).
A slot is free when this host has not claimed it (the claims survive a host restart in
ZooKeeper) and every port of the block can be bound right now; a port held by another program
is reported and skipped, never collided with. Released slots are reused (a free list, unlike
RoQ's count-based allocation, which collided after deletes).
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any

from roq.errors import RoqError
from roq.protocol.ports import HOST_BLOCK_WIDTH, host_block

log = logging.getLogger(__name__)


class NoFreePort(RoqError):
    pass


class PortAllocator:
    """Owned by the host's main thread."""

    def __init__(self, registry: Any, host: str, address: str, bases: dict[str, int], slots: int):
        self.registry = registry
        self.host = host
        self.address = address
        self.bases = bases
        self.slots = slots
        self.in_use: set[int] = set()
        self._reported: set[int] = set()

    def allocate(self, role: str, owner: dict[str, Any], prefer: int = 0) -> int:
        """`prefer` if its block is free (a process re-adopted on its recorded ports), else the
        first port of a free block for `role`; the claim is recorded in ZooKeeper."""
        width = HOST_BLOCK_WIDTH[role]
        claimed = set(self.registry.port_claims(self.host))
        record = {**owner, "role": role, "width": width}
        if (
            prefer
            and self._free(prefer, width, claimed)
            and self.registry.claim_port(self.host, prefer, record)
        ):
            self.in_use.add(prefer)
            return prefer
        for slot in range(self.slots):
            block = host_block(role, self.bases[role], slot)
            port, width = block[0], len(block)
            if block[-1] > 65535:
                break
            if port in self.in_use or port in claimed or not self._bindable(block):
                continue
            if self.registry.claim_port(self.host, port, record):
                self.in_use.add(port)
                return port
        raise NoFreePort(
            f"no free {role} port block on {self.address} in {self.slots} slots from "
            f"{self.bases[role]}"
        )

    def _free(self, port: int, width: int, claimed: set[int]) -> bool:
        if port + width - 1 > 65535 or port in self.in_use or port in claimed:
            return False
        return self._bindable(range(port, port + width))

    def release(self, port: int) -> None:
        self.in_use.discard(port)
        self.registry.release_port(self.host, port)

    def _bindable(self, block: range) -> bool:
        for candidate in block:
            if not self._probe(candidate):
                if candidate not in self._reported:
                    self._reported.add(candidate)
                    log.warning(
                        "port %d on %s is in use by another program; skipping it",
                        candidate,
                        self.address,
                    )
                return False
        return True

    def _probe(self, port: int) -> bool:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((self.address, port))
            except OSError as error:
                if error.errno in (errno.EADDRINUSE, errno.EACCES):
                    return False
                raise
        return True
