"""The `roq http` process: the gateway (gateway.py) behind uvicorn, on a socket bound here.

Binding the socket before anything else makes a taken port exit 75 at once, like every roq
daemon, instead of uvicorn's exit 1 after the cluster was joined. uvicorn runs the h11 protocol
(pure Python, no C extension to freeze) on the standard asyncio loop, answers 503 past
`limits.http_requests_max` requests in progress, and on SIGTERM or Ctrl-C stops taking
requests and gives those in progress `limits.http_shutdown_s`; then the gateway closes (its
publishers flush, bounded) and the process exits 0.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from roq import limits
from roq.config import HttpSettings
from roq.errors import EXIT_TEMPFAIL, RoqError
from roq.http import api
from roq.http.gateway import Gateway
from roq.system.netaddr import resolve_interface

log = logging.getLogger(__name__)


class PortTaken(RoqError):
    exit_code = EXIT_TEMPFAIL


def bind(address: str, port: int) -> socket.socket:
    # IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on an accepted connection only when its
    # proto says TCP, and uvicorn writes a response's head and body apart; with Nagle on, the
    # body waited for the client's delayed ACK: 40 ms per keep-alive request
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((address, port))
    except OSError as error:
        sock.close()
        raise PortTaken(f"http.port {port} on {address}: {error.strerror}") from None
    return sock


def run(settings: HttpSettings, on_ready: Callable[[str], object]) -> None:
    """Serve until SIGTERM or SIGINT (the caller's handlers are called once uvicorn is done)."""
    address = resolve_interface(settings.interface)
    sock = bind(address, settings.port)
    where = f"http://{address}:{settings.port}"
    gateway = Gateway(settings)
    try:
        gateway.open()
        app = api.build(gateway, settings, lambda: on_ready(where))
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                http=H11Protocol,
                loop="asyncio",
                ws="none",
                lifespan="on",
                log_config=None,
                access_log=False,
                server_header=False,
                limit_concurrency=limits.http_requests_max,
                timeout_keep_alive=limits.http_keepalive_s,
                timeout_graceful_shutdown=limits.http_shutdown_s,
            )
        )
        log.info("http: serving the mq API (v1, v2) on %s, messages in %s",
                 where, ", ".join(settings.queues))  # fmt: skip
        server.run(sockets=[sock])
        if not server.started:
            raise RoqError("http: the gateway did not start (see the log above)")
    finally:
        gateway.close()
        sock.close()
