"""What a short-lived client pays per connection with CurveZMQ (issue 35): a ROUTER bound the way
every roq server binds (CURVE, and pyzmq's ZAP handler thread asking roq's gate), and a DEALER
that connects, sends one request, reads the answer and closes, --connections times; the same
with security off. Prints the median and p90 wall time per connection, in milliseconds.

    python benchmarks/curve_handshake.py --connections 200
"""

from __future__ import annotations

import argparse
import socket
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from roq.transport import Kind, bind, connect, new_context, open_socket, security


def serve(server: Any, stop: threading.Event) -> None:
    while not stop.is_set():
        if server.poll(100):
            who, body = server.recv_multipart()
            server.send_multipart([who, body])


def connections(count: int) -> list[float]:
    context = new_context()
    server = open_socket(context, Kind.ROUTER)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    bind(server, "127.0.0.1", port)
    stop = threading.Event()
    thread = threading.Thread(target=serve, args=(server, stop), daemon=True)
    thread.start()
    times = []
    try:
        for _ in range(count):
            started = time.perf_counter()
            client_context = new_context()
            client = open_socket(client_context, Kind.DEALER, rcvtimeo_ms=10_000)
            connect(client, f"tcp://127.0.0.1:{port}")
            client.send(b"ping")
            assert client.recv() == b"ping"
            client.close(0)
            client_context.term()
            times.append((time.perf_counter() - started) * 1000)
    finally:
        stop.set()
        thread.join()
        server.close(0)
        context.term()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=200)
    args = parser.parse_args()
    secrets = security.generate(Path(tempfile.mkdtemp(prefix="roq-handshake-")))
    for side in ("on", "off", "on", "off"):
        security.reset()
        if side == "on":
            security.use(secrets.identity(), secrets.principals)
        else:
            security.use_off("the benchmark's off side")
        times = sorted(connections(args.connections))
        p90 = times[int(len(times) * 0.9)]
        print(f"security {side:3}: {len(times)} connections, per connection "
              f"median {statistics.median(times):.2f} ms, p90 {p90:.2f} ms")  # fmt: skip


if __name__ == "__main__":
    main()
