"""The `roq http` process: the gateway (gateway.py) behind uvicorn, on a socket bound here.

Binding the socket before anything else makes a taken port exit 75 at once, like every roq
daemon, instead of uvicorn's exit 1 after the cluster was joined. uvicorn runs the h11 protocol
(pure Python, no C extension to freeze; with guard.py's head deadline and per-address cap) on
the standard asyncio loop, answers 503 past `limits.http_requests_max` requests in progress,
and on SIGTERM or Ctrl-C stops taking requests and gives those in progress
`limits.http_shutdown_s`; then the gateway closes (its publishers flush, bounded) and the
process exits 0.

With `http.tls.cert` and `http.tls.key` uvicorn serves HTTPS (Python's ssl, OpenSSL) on that
same socket. Both files are checked before anything else, so a missing, unreadable or
mismatched one is an error naming it and exit 78 (EX_CONFIG: systemd does not restart a unit
into the same mistake), not a traceback from inside uvicorn after the cluster was joined.
"""

from __future__ import annotations

import logging
import socket
import ssl
import threading
from collections.abc import Callable

import uvicorn

from roq import limits
from roq.config import HttpSettings
from roq.coordination.targets import Target, TargetKeeper
from roq.errors import EXIT_TEMPFAIL, ConfigError, RoqError
from roq.http import api, guard
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


def check_tls(cert: str, key: str) -> bool:
    """Whether to serve HTTPS; ConfigError naming the key and file when it cannot."""
    if not cert and not key:
        return False
    if not cert or not key:
        raise ConfigError("http.tls.cert and http.tls.key go together: set both or neither")
    for name, path in (("http.tls.cert", cert), ("http.tls.key", key)):
        try:
            with open(path, "rb"):
                pass
        except OSError as error:
            raise ConfigError(f"{name} {path}: cannot read it: {error.strerror}") from None
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        context.load_verify_locations(cafile=cert)  # parses the certificates alone
    except ssl.SSLError:
        raise ConfigError(f"http.tls.cert {cert}: holds no PEM certificate") from None
    try:
        # an empty passphrase: an encrypted key fails here instead of prompting on a terminal
        context.load_cert_chain(cert, key, password=lambda: b"")
    except ssl.SSLError as error:
        if error.reason == "KEY_VALUES_MISMATCH":
            raise ConfigError(
                f"http.tls.key {key} is not the key of the certificate in http.tls.cert {cert}"
            ) from None
        raise ConfigError(f"http.tls.key {key}: holds no unencrypted PEM private key") from None
    return True


def run(
    settings: HttpSettings,
    on_ready: Callable[[str], object],
    stopping: threading.Event | None = None,
) -> None:
    """Serve until SIGTERM or SIGINT (the caller's handlers are called once uvicorn is done).
    `stopping`, set by a SIGTERM that came while the gateway still started (before uvicorn
    took the signals over), ends it once it is up, or before it serves at all."""
    tls = check_tls(settings.tls_cert, settings.tls_key)
    address = resolve_interface(settings.interface)
    sock = bind(address, settings.port)
    where = f"{'https' if tls else 'http'}://{address}:{settings.port}"
    gateway = Gateway(settings)
    target: TargetKeeper | None = None
    try:
        gateway.open()
        # found by `roq metrics scrape-config` and `roq health` (its /metrics wants a token)
        listener = Target("http", f"{address}:{settings.port}", f"{address}:{settings.port}",
                          "https" if tls else "http", token=True)  # fmt: skip
        target = TargetKeeper(gateway.zk, gateway.paths, listener)
        target.start()
        if stopping is not None and stopping.is_set():
            return  # told to stop while it opened: never serve

        def ready() -> None:
            on_ready(where)
            if stopping is not None and stopping.is_set():
                server.should_exit = True  # the signal came before uvicorn's handlers

        app = api.build(gateway, settings, ready)
        server = uvicorn.Server(
            uvicorn.Config(
                app,
                http=guard.protocol(
                    guard.Guard(limits.http_connections_per_ip_max, limits.http_head_s)
                ),
                h11_max_incomplete_event_size=limits.http_head_bytes_max,
                loop="asyncio",
                ws="none",
                lifespan="on",
                log_config=None,
                access_log=False,
                server_header=False,
                limit_concurrency=limits.http_requests_max,
                timeout_keep_alive=limits.http_keepalive_s,
                timeout_graceful_shutdown=limits.http_shutdown_s,
                ssl_certfile=settings.tls_cert or None,
                ssl_keyfile=settings.tls_key or None,
            )
        )
        log.info("http: serving the mq API (v1, v2) on %s, messages in %s",
                 where, ", ".join(settings.queues))  # fmt: skip
        server.run(sockets=[sock])
        if not server.started:
            raise RoqError("http: the gateway did not start (see the log above)")
    finally:
        if target is not None:
            target.stop()
        gateway.close()
        sock.close()
