"""What a caller of the HTTP gateway can hold before and after it shows a token (issue 31,
finding 5): a real `roq http` process on a real cluster, talked to over raw TCP connections
(the clients here are the ones a well-behaved HTTP library would never be: half a head, a
body declared and never sent, thousands of idle connections).

Clients bind their own loopback addresses (127.0.0.2, ...) to stand for other machines: the
gateway listens on 127.0.0.1 and tells callers apart by their address.
"""

from __future__ import annotations

import re
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest
from test_http import Api, keys, principal_with_token, start_gateway

from roq import limits
from roq.testing.cluster import LocalCluster, PortBlocks, wait_for

pytestmark = pytest.mark.integration

MiB = 1024 * 1024


@pytest.fixture(scope="module")
def gateway(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: str, port_blocks: PortBlocks
) -> Iterator[tuple[LocalCluster, Any, Api]]:
    cluster = LocalCluster(tmp_path_factory.mktemp("http-guard"), zookeeper, port_blocks)
    try:
        cluster.start_gcm()
        cluster.start_host()
        cluster.wait_ready()
        daemon, api = start_gateway(cluster)
        yield cluster, daemon, api
    finally:
        cluster.stop()


def _connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def _head(path: str, token: str, length: int) -> bytes:
    head = (f"POST {path} HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer {token}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {length}\r\n\r\n")  # fmt: skip
    return head.encode()


def _status(sock: socket.socket, within_s: float) -> int:
    """The status of the response that arrives on `sock` within `within_s` (0: none came)."""
    sock.settimeout(within_s)
    try:
        line = sock.recv(64)
    except (TimeoutError, ConnectionResetError):
        return 0
    return int(line.split()[1]) if line.startswith(b"HTTP/1.1 ") else 0


def _closed_within(sock: socket.socket, within_s: float) -> float | None:
    """Seconds until the gateway closed `sock` (reading and dropping what it sent), or None."""
    started = time.monotonic()
    deadline = started + within_s
    while (left := deadline - time.monotonic()) > 0:
        sock.settimeout(left)
        try:
            if not sock.recv(4096):
                return time.monotonic() - started
        except TimeoutError:
            return None
        except ConnectionResetError:
            return time.monotonic() - started
    return None


def _memory(pid: int, field: str) -> int:
    """VmRSS (resident now) or VmHWM (the peak so far) of the process, bytes."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(f"{field}:"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field}")


def _principal_without_grants(cluster: LocalCluster, api: Api, name: str) -> str:
    keys(cluster, "create", name, "--out", str(cluster.tmp / f"{name}.json"))
    token = keys(cluster, "token", name).stdout.strip()
    probe = Api(api.port, token)
    wait_for(lambda: probe.client.get("/metrics").status_code == 200, 10, f"{name}'s token known")
    return token


def test_a_token_without_the_grant_is_refused_before_its_body_is_read(
    gateway: tuple[LocalCluster, Any, Api],
) -> None:
    """Before: a token with no grant made the gateway buffer and parse 16 MiB bodies, 8 at once
    took it from 54 to 263 MB. Now the 403 comes from the head alone."""
    cluster, daemon, api = gateway
    token = _principal_without_grants(cluster, api, "nogrant")
    with _connect(api.port) as sock:  # the body is declared and never sent
        sock.sendall(_head("/v2/message/publish", token, limits.http_body_bytes_max))
        assert _status(sock, 5) == 403
    before = _memory(daemon.process.pid, "VmRSS")
    body = b"[" + b" " * (limits.http_body_bytes_max - 2) + b"]"
    statuses: list[int] = []

    def send_whole() -> None:
        with _connect(api.port) as sock:
            sock.sendall(_head("/v2/message/publish", token, len(body)))
            try:
                sock.sendall(body)  # the gateway may close before it is all sent
            except (BrokenPipeError, ConnectionResetError):
                pass
            statuses.append(_status(sock, 10))

    senders = [threading.Thread(target=send_whole) for _ in range(8)]
    for sender in senders:
        sender.start()
    for sender in senders:
        sender.join(60)
    peak = _memory(daemon.process.pid, "VmHWM")
    assert statuses == [403] * 8, statuses
    grew = peak - before
    print(f"gateway memory: {before / MiB:.0f} MiB before, peak {peak / MiB:.0f} MiB after")
    assert grew < 24 * MiB, f"the gateway's peak memory grew by {grew / MiB:.1f} MiB"


def test_a_body_larger_than_its_call_can_need_is_refused_by_its_length(
    gateway: tuple[LocalCluster, Any, Api],
) -> None:
    cluster, _, api = gateway
    token = principal_with_token(cluster, "sizer", "topic:news", "subscribe")
    wait_for(lambda: _asked(api.port, token, "/v1/topic/subscribe", 2) != 401, 10, "token known")
    for path, status in (("/v2/topic/subscribe", 413), ("/v1/message/get", 400)):
        with _connect(api.port) as sock:  # 1 MiB declared, none sent: answered at once
            sock.sendall(_head(path, token, MiB))
            assert _status(sock, 5) == status, path
    # a v1 publish needs at most one message of maxMsgSize (16 here), escaped
    publish = limits.http_small_body_bytes_max + 6 * 16 + 1
    with _connect(api.port) as sock:
        sock.sendall(_head("/v1/message/publish", api.token, publish))
        assert _status(sock, 5) == 400


def _asked(port: int, token: str, path: str, within_s: float) -> int:
    body = b'{"subscriber": "s", "topic": "news1"}'
    with _connect(port) as sock:
        sock.sendall(_head(path, token, len(body)) + body)
        return _status(sock, within_s)


def test_idle_connections_and_half_sent_heads_are_closed_after_the_head_deadline(
    gateway: tuple[LocalCluster, Any, Api],
) -> None:
    _, _, api = gateway
    bound = limits.http_head_s + 3  # slack for a loaded machine
    with ExitStack() as stack:
        idle = stack.enter_context(_connect(api.port))
        half = stack.enter_context(_connect(api.port))
        half.sendall(b"POST /v1/topic/register HTTP/1.1\r\nHost: gw\r\n")
        after = stack.enter_context(_connect(api.port))  # a request, then half of the next
        after.sendall(b"GET /metrics HTTP/1.1\r\nHost: gw\r\nAuthorization: Bearer "
                      + api.token.encode() + b"\r\n\r\n")  # fmt: skip
        assert _status(after, 5) == 200
        after.sendall(b"GET /metrics HTTP/1.1\r\n")
        for name, sock in (("idle", idle), ("half a head", half), ("after a response", after)):
            took = _closed_within(sock, bound)
            assert took is not None, f"{name}: still open {bound:.0f} s later"


def test_idle_connections_from_one_address_do_not_deny_the_others(
    gateway: tuple[LocalCluster, Any, Api],
) -> None:
    """Before: 2,000 idle connections without a token made every request a 503."""
    _, _, api = gateway
    with ExitStack() as stack:
        crowd = [stack.enter_context(_connect(api.port, "127.0.0.2")) for _ in range(2_000)]
        assert api.client.get("/metrics").status_code == 200
        assert api.v1("topic/register", owner="o", topic="guard1")[0] == 200
        # the gateway kept at most its per-address bound of them; it closed the others at once

        def kept() -> int:
            crowd[:] = [sock for sock in crowd if _closed_within(sock, 0.01) is None]
            return len(crowd)

        wait_for(lambda: kept() <= limits.http_connections_per_ip_max, 10, "the rest closed")


def _in_progress(api: Api) -> int:
    text = api.client.get("/metrics").text
    return int(float(re.search(r"^roq_http_requests_in_progress (\S+)$", text, re.M)[1]))


def test_one_principal_cannot_take_every_request(gateway: tuple[LocalCluster, Any, Api]) -> None:
    cluster, _, api = gateway
    crowd_token = principal_with_token(cluster, "crowd", "topic:crowd", "subscribe")
    crowd = Api(api.port, crowd_token)
    assert api.v1("topic/register", owner="o", topic="crowd1")[0] == 200
    wait_for(lambda: crowd.v1("topic/subscribe", subscriber="s", topic="crowd1")[0] == 200,
             10, "the crowd's token known")  # fmt: skip
    # the longest poll, so that none ends while the rest are sent on a loaded machine
    body = b'{"subscriber": "s", "topic": "crowd1", "wait": %d}' % limits.http_wait_s_max
    most = limits.http_principal_requests_max
    per_address = limits.http_connections_per_ip_max - 6
    with ExitStack() as stack:
        for n in range(most):  # long polls, parked: nothing is published to crowd1
            sock = stack.enter_context(_connect(api.port, f"127.0.0.{3 + n // per_address}"))
            sock.sendall(_head("/v2/message/get", crowd_token, len(body)) + body)
        # every poll taken before the probe: a probe sent among the last polls took one's
        # place (that poll got the 429, and each probe after found room: CI failed twice)
        wait_for(lambda: _in_progress(api) == most, 20, f"the crowd's {most} polls in progress")
        status, problem = crowd.v2("message/get", subscriber="s", topic="crowd1")
        assert status == 429 and "crowd" in problem["detail"], problem
        assert api.v1("topic/register", owner="o", topic="crowd2")[0] == 200  # others go on
        assert api.client.get("/metrics").status_code == 200
    polls_end_s = limits.http_wait_s_max + 15
    wait_for(lambda: crowd.v1("message/get", subscriber="s", topic="crowd1")[0] == 231,
             polls_end_s, "the crowd served again once its polls ended")  # fmt: skip
