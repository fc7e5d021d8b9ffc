"""The HTTP listener of a GCM or a host: `GET /metrics`, `/healthz` and `/readyz`.

A standard-library server in a thread of its own (`metrics-listener`), never the process's
main loop: a scrape or a health check never delays a request of the cluster, and `/healthz`
can tell that the main loop stopped turning. Bounded: `limits.metrics_connections_max`
requests at once (past it a 503 at once), each given `limits.metrics_request_timeout_s` to send
its request. No authentication: it shows counts and queue names, never a message; bind it where
only the monitoring network reaches (docs/security.md).
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from roq import limits
from roq.errors import PortInUse, RoqError
from roq.metrics.exposition import CONTENT_TYPE, bound_queues, render
from roq.protocol.metrics import Sample, sample

log = logging.getLogger(__name__)


class Health:
    """What /healthz and /readyz answer. The main loop calls `beat()` every turn; `ready`
    returns what keeps the process from serving ([] when it serves), called per request from
    the listener's threads (it must be thread-safe and bounded)."""

    def __init__(self, ready: Callable[[], list[str]] = list):
        self.turned = time.monotonic()  # a float: written by the main loop, read here
        self.ready = ready

    def beat(self) -> None:
        self.turned = time.monotonic()

    def live(self) -> str | None:
        """Why the process is not alive (its loop has stalled), or None."""
        stalled = time.monotonic() - self.turned
        if stalled > limits.health_loop_stall_s:
            return f"the main loop has not turned for {stalled:.0f} s"
        return None


class Listener:
    def __init__(
        self,
        address: str,
        port: int,
        role: str,
        collect: Callable[[], Sequence[Sample]],
        health: Health,
    ):
        self.address, self.port, self.role = address, port, role
        self.collect, self.health = collect, health
        self.dropped = 0  # samples left out by the queue bound, since the start
        self._slots = threading.BoundedSemaphore(limits.metrics_connections_max)
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://{self.address}:{self.port}"

    def start(self) -> None:
        """Bind (PortInUse if the port is taken: exit 75, as for every port) and serve."""
        handler = type("Handler", (_Handler,), {"listener": self})
        try:
            self._server = ThreadingHTTPServer((self.address, self.port), handler)
        except OSError as error:
            if error.errno == errno.EADDRINUSE:
                raise PortInUse(f"metrics port {self.address}:{self.port} is in use") from None
            raise RoqError(f"metrics port {self.address}:{self.port}: {error}") from None
        self._server.daemon_threads = True
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="metrics-listener", daemon=True
        )
        self._thread.start()
        log.info("%s: metrics and health on %s", self.role, self.url)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

    def metrics(self) -> bytes:
        kept, dropped = bound_queues(self.collect(), limits.metrics_queues_max)
        self.dropped += dropped
        own = [sample("roq_series_dropped_total", self.dropped, self.role)]
        return render([*kept, *own])


class _Handler(BaseHTTPRequestHandler):
    listener: Listener
    timeout = limits.metrics_request_timeout_s  # the request's socket (slow senders)
    protocol_version = "HTTP/1.0"  # one request per connection: nothing idles here

    def do_GET(self) -> None:
        if not self.listener._slots.acquire(blocking=False):
            self._answer(503, b"busy: too many requests at once\n")
            return
        try:
            self._route()
        except Exception as error:  # a bad sample or a failed read: the process goes on
            log.warning("%s: %s failed: %r", self.listener.role, self.path, error)
            self._answer(500, f"{type(error).__name__}: {error}\n".encode())
        finally:
            self.listener._slots.release()

    def _route(self) -> None:
        path = self.path.split("?", 1)[0]
        if path == "/metrics":
            self._answer(200, self.listener.metrics(), CONTENT_TYPE)
        elif path == "/healthz":
            problem = self.listener.health.live()
            self._answer(503 if problem else 200, f"{problem or 'ok'}\n".encode())
        elif path == "/readyz":
            problems = self.listener.health.live() or "\n".join(self.listener.health.ready())
            text = problems or "ready"
            self._answer(503 if problems else 200, f"{text}\n".encode())
        else:
            self._answer(404, b"not found: /metrics, /healthz or /readyz\n")

    def _answer(self, status: int, body: bytes, kind: str = "text/plain; charset=utf-8") -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        log.debug("%s: %s", self.listener.role, format % args)
