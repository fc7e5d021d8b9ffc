"""Runs generated cases against one socket of a live cluster and checks the cluster after them.

A `Target` is one socket of one daemon and the strategy for it. `run_cases` draws cases with
Hypothesis (generation only: shrinking a case that killed a process would only meet the dead
process) and sends each through a client socket of the kind a real peer uses. After every case
that expects a reply, the reply must come (a REP socket that stops answering is blocked) and
must not be `internal`; every `CHECK_EVERY` cases and at the end, every process of the cluster
must be alive with the PID it had. A failure raises `FuzzFailure` with a reproducer: the socket
and the last cases' frames in hex. The soak (`benchmarks/fuzz_soak.py`) runs the same targets.
"""

from __future__ import annotations

import collections
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import bson
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from roq.client.publisher import Publisher
from roq.client.subscriber import Subscriber
from roq.testing.cluster import LocalCluster, child_pids
from roq.transport import Kind, connect, open_socket

CHECK_EVERY = 25
REPLY_TIMEOUT_MS = 3000
JOIN_S = 0.3  # a PUB/PUSH/XSUB connection is up after this (ZeroMQ's slow joiner)


class FuzzFailure(AssertionError):
    pass


@dataclass
class Target:
    name: str  # "exchange F+3"
    endpoint: str
    kind: Kind  # the client socket a real peer uses
    strategy: st.SearchStrategy[list[bytes]]
    replies: bool = False  # every case is answered (REQ), or may be (DEALER: read, not required)


class Processes:
    """The cluster's processes: the GCM, the host and the host's children (monitor, exchange)."""

    def __init__(self, cluster: LocalCluster):
        self.roots = {d.name: d.process.pid for d in cluster.daemons}
        self.expected = self.snapshot()

    def snapshot(self) -> dict[int, str]:
        found = {}
        for name, pid in self.roots.items():
            found[pid] = name
            for child in child_pids(pid):
                found[child] = f"{name} child"
        return found

    def problem(self) -> str:
        now = self.snapshot()
        gone = sorted(set(self.expected) - set(now))
        new = sorted(set(now) - set(self.expected))
        if not gone and not new:
            return ""
        return f"processes gone: {gone}, new (restarted?): {new} (expected {self.expected})"


class Prober:
    def __init__(self, context: Any, target: Target):
        self.context, self.target = context, target
        self.sock: Any = None

    def _socket(self) -> Any:
        if self.sock is None:
            kind = self.target.kind
            self.sock = open_socket(self.context, kind, rcvtimeo_ms=REPLY_TIMEOUT_MS)
            connect(self.sock, self.target.endpoint)
            if kind in (Kind.PUB, Kind.PUSH, Kind.XSUB):
                time.sleep(JOIN_S)
        return self.sock

    def send(self, frames: list[bytes]) -> str:
        """Send one case; a problem ("" if none): no reply from a REP, or an `internal` one."""
        sock = self._socket()
        sock.send_multipart(frames)
        if self.target.kind is Kind.REQ:
            if not sock.poll(REPLY_TIMEOUT_MS):
                self.close()
                return f"no reply within {REPLY_TIMEOUT_MS} ms"
            return _internal(sock.recv_multipart())
        if self.target.kind is Kind.DEALER:
            while sock.poll(0):
                sock.recv_multipart()
        return ""

    def close(self) -> None:
        if self.sock is not None:
            self.sock.close(0)
            self.sock = None


def _internal(reply: list[bytes]) -> str:
    try:
        doc = bson.decode(reply[0])
    except Exception as error:
        return f"a reply that is not BSON: {error}"
    if doc.get("ERROR") == "internal":
        return f"answered internal: {doc.get('COMMENT')}"
    return ""


def reproducer(target: Target, cases: collections.deque[list[bytes]], problem: str) -> str:
    lines = [f"{problem}", f"socket: {target.name} at {target.endpoint} ({target.kind.name})",
             f"the last {len(cases)} cases, oldest first, frames in hex:"]  # fmt: skip
    lines += [f"  {[frame.hex() for frame in frames]}" for frames in cases]
    lines.append(f"  (send each case as one multipart message through a {target.kind.name})")
    return "\n".join(lines)


def run_cases(
    context: Any,
    target: Target,
    processes: Processes,
    examples: int,
    *,
    derandomize: bool = True,
    on_case: Callable[[], None] | None = None,
) -> int:
    """Draw and send `examples` cases; FuzzFailure on the first problem. Returns cases sent."""
    prober = Prober(context, target)
    recent: collections.deque[list[bytes]] = collections.deque(maxlen=CHECK_EVERY + 5)
    sent = [0]
    failed: list[str] = []  # the first failure; later cases are skipped, none is re-run

    @settings(max_examples=examples, deadline=None, database=None, derandomize=derandomize,
              phases=[Phase.generate], suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(target.strategy)
    def case(frames: list[bytes]) -> None:
        if failed:
            return
        recent.append(frames)
        problem = prober.send(frames)
        sent[0] += 1
        if on_case is not None:
            on_case()
        if not problem and sent[0] % CHECK_EVERY == 0:
            problem = processes.problem()
        if problem:
            failed.append(reproducer(target, recent, problem))

    try:
        case()
    finally:
        prober.close()
    if failed:
        raise FuzzFailure(failed[0])
    time.sleep(0.5)  # a crash can follow its cause (the monitor died 2 s after a bad report)
    problem = processes.problem()
    if problem:
        raise FuzzFailure(reproducer(target, recent, problem))
    return sent[0]


def publish_and_replay(cluster: LocalCluster, queue: str, count: int = 1000) -> None:
    """A normal publish of `count` messages, then a replay from the beginning: exact. The key is
    new each time: whatever valid batches the cases slipped in are filtered out by it."""
    key = f"check-{uuid.uuid4().hex}".encode()
    sent = [b"%d" % n for n in range(count)]
    with Publisher(queue, gcm=cluster.gcm, acks="leader") as publisher:
        for payload in sent:
            publisher.send(payload, key)
        publisher.flush()
    subscriber = Subscriber(queue, key, gcm=cluster.gcm, start="beginning")
    try:
        got = [r.payload for r in subscriber.messages(count=count, timeout_s=30)]
        got += [r.payload for r in subscriber.messages(timeout_s=0.3)]
    finally:
        subscriber.close()
    assert got == sent, f"replay of {len(got)} messages is not the {count} published"
