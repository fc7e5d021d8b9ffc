"""Child processes of a host: start, wait until ready, restart with back-off, stop within bounds.

Why not supervisord: a host starts and stops children one at a time as queues come and go, and
must know at once whether a child bound its ports. supervisord needs a config file on disk per
program, an XML-RPC round trip per change, and with the one-file executable sees the bootloader
rather than the Python process (ecosystem notes §4). A `Popen` per child, a readiness PING on the
child's control port, and a restart schedule in the host's own loop give the same guarantees with
fewer moving parts; docs/architecture.md records the decision.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from roq import limits
from roq.backoff import backoff_s
from roq.coordination.registry import ChildState
from roq.errors import (
    EXIT_CONFIG,
    EXIT_FENCED,
    EXIT_RETIRED,
    EXIT_TEMPFAIL,
    PortInUse,
    ProtocolError,
    RoqError,
    TransportError,
)
from roq.protocol.bsonmsg import Document, Reply
from roq.protocol.messages.control import Ping, Shutdown
from roq.system import notify
from roq.system.spawn import child_environment, die_with_parent
from roq.transport.rpc import Requester

log = logging.getLogger(__name__)


class ChildFailed(RoqError):
    pass


@dataclass
class Child:
    """One monitor or exchange process and its restart bookkeeping. Owned by the host loop."""

    name: str
    role: str
    queue: str
    port: int
    control: str  # tcp://ip:port of its control socket
    argv: list[str]
    id: str = ""
    txid: str = ""
    process: subprocess.Popen[bytes] | None = None
    started_at: float = 0.0
    failures: int = 0
    restart_at: float | None = None
    given_up: bool = False
    retired: bool = False  # a log keeper that exited EXIT_RETIRED: done, never restarted
    # exited EXIT_FENCED (system/lease.py): not restarted in place; its host starts it again
    # once its lease is renewed, if ZooKeeper still assigns it there
    fenced_out: bool = False
    last_exit: str = ""  # how its last run or start ended
    restarts: int = 0  # restarts tried since the host started it (roq_host_child_restarts_total)
    state_at: float = 0.0  # wall clock: its next restart, or when it was given up
    meta: dict[str, Any] = field(default_factory=dict)


def start(child: Child, context: Any) -> None:
    """Start the process and wait until it answers PING; raise PortInUse or ChildFailed."""
    spawn(child)
    wait_ready(child, context)


def spawn(child: Child) -> None:
    """Start the process, not waiting for it (`wait_ready`): a host resuming many children
    spawns them all first, so their starts overlap."""
    child.process = subprocess.Popen(
        child.argv,
        env=child_environment(),
        stdin=subprocess.DEVNULL,
        preexec_fn=die_with_parent,  # noqa: PLW1509 (no threads start children concurrently)
    )
    child.started_at = time.monotonic()


def wait_ready(child: Child, context: Any) -> None:
    """Wait until a spawned child answers PING; raise PortInUse or ChildFailed (then it is
    stopped)."""
    assert child.process is not None
    _wait_ready(child, context)
    log.info("%s started (pid %d, control %s)", child.name, child.process.pid, child.control)


def _wait_ready(child: Child, context: Any) -> None:
    assert child.process is not None
    deadline = time.monotonic() + limits.child_ready_timeout_ms / 1000
    requester = Requester(context, child.control, timeout_ms=250)
    try:
        while time.monotonic() < deadline:
            notify.keepalive()  # a bounded wait that turns: the host's loop is not stuck
            code = child.process.poll()
            if code is not None:
                raise _exit_error(child, code)
            if _ping(requester):
                return
        stop(child, context)
        raise ChildFailed(f"{child.name} did not answer on {child.control} in time")
    finally:
        requester.close()


def _exit_error(child: Child, code: int) -> RoqError:
    if code == EXIT_TEMPFAIL:
        return PortInUse(f"{child.name} could not bind its ports (from {child.port})")
    if code == EXIT_CONFIG:
        return ChildFailed(f"{child.name} rejected its configuration (exit 78)")
    return ChildFailed(f"{child.name} exited with code {code} while starting")


def _ping(requester: Requester) -> bool:
    try:
        return Reply.decode(requester.request(Ping().encode())).ok
    except (TransportError, ProtocolError):  # not up yet, or not (yet) a child that answers
        return False


def tell(child: Child, context: Any, request: Document) -> bool:
    """One control request to a running child (bounded); whether it answered OK."""
    if child.process is None or child.process.poll() is not None:
        return False  # not running: it gets its new argv when it is restarted
    requester = Requester(context, child.control, timeout_ms=limits.child_tell_timeout_ms)
    try:
        return Reply.decode(requester.request(request)).ok
    except (TransportError, ProtocolError) as error:
        log.warning("%s did not take control request %s: %s", child.name, request["CMD"], error)
        return False
    finally:
        requester.close()


def stop(child: Child, context: Any) -> None:
    """SHUTDOWN on the control port, then SIGTERM, then SIGKILL, each within its bound."""
    process, child.process = child.process, None
    child.restart_at = None
    if process is None or process.poll() is not None:
        return
    _ask_shutdown(child, context)
    grace_s = limits.shutdown_grace_ms / 1000
    if _wait(process, grace_s):
        return
    log.warning("%s ignored SHUTDOWN for %.1f s; sending SIGTERM", child.name, grace_s)
    process.send_signal(signal.SIGTERM)
    if not _wait(process, grace_s):
        log.error("%s ignored SIGTERM; killing it", child.name)
        process.kill()
        process.wait(timeout=5)


def stop_all(children: Sequence[Child], context: Any) -> None:
    """Stop every child at once: SHUTDOWN to each (answered at once by a running child), then
    one grace for all, then SIGTERM to the rest, one more grace, then SIGKILL. The slowest
    child bounds the host's stop, not the sum of them all."""
    running = []
    for child in children:
        process, child.process = child.process, None
        child.restart_at = None
        if process is not None and process.poll() is None:
            running.append((child, process))
    for child, _ in running:
        _ask_shutdown(child, context)
    grace_s = limits.shutdown_grace_ms / 1000
    left = _wait_all(running, time.monotonic() + grace_s)
    for child, process in left:
        log.warning("%s ignored SHUTDOWN for %.1f s; sending SIGTERM", child.name, grace_s)
        process.send_signal(signal.SIGTERM)
    for child, process in _wait_all(left, time.monotonic() + grace_s):
        log.error("%s ignored SIGTERM; killing it", child.name)
        process.kill()
        process.wait(timeout=5)


def _ask_shutdown(child: Child, context: Any) -> None:
    requester = Requester(context, child.control, timeout_ms=limits.child_shutdown_ask_ms)
    try:
        requester.request(Shutdown().encode())
    except TransportError:
        pass  # still starting, or hung: the signals below
    finally:
        requester.close()


def _wait_all(
    running: list[tuple[Child, subprocess.Popen[bytes]]], deadline: float
) -> list[tuple[Child, subprocess.Popen[bytes]]]:
    """Wait until every process exited or the deadline passed; those still running."""
    for _, process in running:
        _wait(process, max(0.0, deadline - time.monotonic()))
    return [(c, p) for c, p in running if p.poll() is None]


def _wait(process: subprocess.Popen[bytes], timeout_s: float) -> bool:
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return False
    return True


def watch(child: Child, context: Any, now: float) -> None:
    """Called from the host loop: notice a crash, schedule and perform restarts with back-off."""
    if child.given_up or child.retired:
        return
    if child.process is not None:
        code = child.process.poll()
        if code is None:
            if now - child.started_at > limits.child_stable_after_ms / 1000:
                child.failures = 0
            return
        if child.role == "keeper" and code == EXIT_RETIRED:
            child.retired, child.process = True, None
            log.info("%s: retired (its logs have their copies on live exchanges)", child.name)
            return
        if code == EXIT_FENCED:
            child.fenced_out, child.process = True, None
            log.warning("%s: exited, fenced long past its lease; started again only if still "
                        "assigned here once the lease is renewed", child.name)  # fmt: skip
            return
        _schedule_restart(child, _ended(code), now)
        return
    if child.restart_at is not None and now >= child.restart_at:
        child.restart_at = None
        child.restarts += 1
        try:
            start(child, context)
        except RoqError as error:
            log.error("%s: restart failed: %s", child.name, error)
            code = None if child.process is None else child.process.poll()
            _schedule_restart(child, str(error) if code is None else _ended(code), time.monotonic())


def _ended(code: int) -> str:
    """A child's exit status as `Popen` gives it (negative: the signal that killed it)."""
    if code >= 0:
        return f"exit code {code}"
    try:
        return f"killed by signal {-code} ({signal.Signals(-code).name})"
    except ValueError:
        return f"killed by signal {-code}"


def _schedule_restart(child: Child, why: str, now: float) -> None:
    child.process = None
    child.failures += 1
    child.last_exit = why
    if child.failures > limits.child_restarts_max:
        child.given_up = True
        child.state_at = time.time()
        log.error(
            "%s: %d failures in a row (last: %s); giving up (`roq queue stop` and `start` retry)",
            child.name,
            child.failures,
            why,
        )
        return
    delay_s = backoff_s(
        child.failures,
        limits.child_restart_backoff_ms_min / 1000,
        limits.child_restart_backoff_ms_max / 1000,
    )
    child.restart_at = now + delay_s
    child.state_at = time.time() + delay_s
    log.warning("%s: %s; restart %d in %d ms", child.name, why, child.failures, delay_s * 1000)


def report(child: Child) -> ChildState | None:
    """What its host tells the cluster of a child that is not running; None while it runs."""
    if not child.given_up and child.restart_at is None:
        return None
    return ChildState(
        queue=child.queue,
        id=child.id,
        role=child.role,
        state="GIVEN_UP" if child.given_up else "RESTARTING",
        failures=child.failures,
        last_exit=child.last_exit,
        at=child.state_at,
    )


def pid_of(child: Child) -> int | None:
    return None if child.process is None else child.process.pid


def is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
