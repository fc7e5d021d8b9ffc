"""`roq work` (a consumer of a group) and `roq group list|show|delete` (admin 2020–2022); `roq
group dlq ...` is cli/deadletters.py."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO, TYPE_CHECKING

import typer

from roq import limits
from roq.cli.app import app
from roq.cli.common import (
    GCM_OPTION,
    ZK_OPTION,
    StopGrace,
    errors_to_exit,
    interruptible,
    setup_logging,
    stop_event,
    table,
)
from roq.cli.data import NAMESPACE_OPTION
from roq.errors import RoqError

if TYPE_CHECKING:  # imported where used: `roq --help` does not load the client
    from roq.client.consumer import Consumer, Delivery

group_app = typer.Typer(help="Consumer groups of a queue (work queues).", no_args_is_help=True)
app.add_typer(group_app, name="group", rich_help_panel="Clients")


# how a consumer joins and what a new group is (the options of `roq work` past the basics)
_KEY_ORDERED = typer.Option(
    False,
    "--key-ordered",
    help="A new group hands out each routing key's messages in order, each key on one "
    "consumer at a time, the keys spread over the consumers.",
)
_PREFETCH = typer.Option(
    None,
    "--prefetch",
    min=1,
    help="Hold at most N messages handed out and not yet acked (RabbitMQ's basic.qos; at "
    "most the group's work.inflight). Default: 1 with --exec, 100 otherwise. The rest of "
    "a burst is left to the group's other consumers.",
)
_PRIORITY = typer.Option(
    0,
    "--priority",
    min=-limits.work_consumer_priority_max,
    max=limits.work_consumer_priority_max,
    help="While a consumer of a higher priority has room (fewer messages in flight than "
    "its --prefetch), this one gets no new work (RabbitMQ's consumer priorities).",
)
_SINGLE_ACTIVE = typer.Option(
    False,
    "--single-active",
    help="A new group hands out to one consumer at a time; when it dies or leaves, the "
    "next by priority, then join order, takes over.",
)


@app.command(rich_help_panel="Messages")
def work(
    queue: str = typer.Argument(..., help="Queue to take work from."),
    group: str = typer.Option(..., "--group", "-g", help="Consumer group (created if new)."),
    count: int | None = typer.Option(None, "--count", "-n", min=1, help="Exit after N messages."),
    timeout: float | None = typer.Option(
        None, "--timeout", help="Exit after S seconds without a message."
    ),
    exec_cmd: str | None = typer.Option(
        None,
        "--exec",
        help="Run this shell command per message (payload on stdin): ack on "
        "exit 0, nack otherwise.",
    ),
    from_now: bool = typer.Option(
        False, "--from-now", help="A new group starts with what is published from now on."
    ),
    ordered: bool = typer.Option(
        False, "--ordered", help="A new group hands out each routing key's messages in order."
    ),
    prefix: str = typer.Option(
        "", "--prefix", help="A new group takes only messages whose routing key starts so."
    ),
    key_ordered: bool = _KEY_ORDERED,
    prefetch: int | None = _PREFETCH,
    priority: int = _PRIORITY,
    single_active: bool = _SINGLE_ACTIVE,
    gcm: str = GCM_OPTION,
    zk: str | None = ZK_OPTION,
    namespace: str = NAMESPACE_OPTION,
) -> None:
    """Take messages of the group: print each on its own line and ack it once the line is
    written (or run --exec per message). Each message goes to one consumer of the group.

    Exit code 0 after --count messages (or Ctrl-C, or --timeout without --count); 75 when
    --timeout ran out before --count messages.
    """
    setup_logging("WARNING")
    with errors_to_exit():
        from roq.client.consumer import Consumer

        stop = stop_event()
        done = 0
        out = sys.stdout.buffer
        with interruptible(stop):  # joining the group: nothing handed out yet
            consumer = Consumer(
                queue, group, gcm=None if zk else gcm, zk=zk, namespace=namespace,
                start="now" if from_now else "beginning", ordered=ordered,
                prefix=prefix.encode(), inflight=prefetch or (1 if exec_cmd else 100),
                priority=priority, single_active=single_active, key_ordered=key_ordered,
            )  # fmt: skip
        consumer.stop_with(stop)  # its monitor gone (queue deleted), the stop still takes < 1 s
        with consumer:
            typer.echo(f"roq work: consuming {queue} as {consumer.name}", err=True)
            while not stop.is_set() and (count is None or done < count):
                delivery = _next(consumer, timeout, stop)
                if delivery is None:
                    break
                if exec_cmd is None:
                    out.write(delivery.payload + b"\n")
                    out.flush()
                    delivery.ack()
                else:
                    _run(exec_cmd, delivery, stop)
                done += 1
        if count is not None and done < count and not stop.is_set():
            typer.echo(f"roq work: only {done} of {count} messages before the timeout", err=True)
            raise typer.Exit(75)


def _next(consumer: Consumer, timeout: float | None, stop: threading.Event) -> Delivery | None:
    """The next message; None after `timeout` without one, or once stopped. Waited for in
    slices of `limits.work_cli_stop_check_s`, so Ctrl-C and SIGTERM stop an idle consumer
    within one; the `with` block then gives its slots back."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while not stop.is_set():
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            return None
        step = limits.work_cli_stop_check_s
        window = step if left is None else min(step, left)
        try:
            delivery = consumer.next(window)
        except RoqError:
            if stop.is_set():
                return None  # stopped while its monitor did not answer (`stop_with`)
            raise
        if delivery is not None:
            return delivery
    return None


def _run(command: str, delivery: object, stop: threading.Event) -> None:
    """--exec on one message: ack on exit 0, nack otherwise. Stopped (Ctrl-C, SIGTERM) while it
    runs, the command gets limits.exec_stop_finish_s to finish, then is ended and the message
    released at once (nack with no delay): another consumer takes it, rather than this one
    waiting out the command (issue 32)."""
    from roq.client.consumer import Delivery

    assert isinstance(delivery, Delivery)
    child = subprocess.Popen(  # noqa: S602 (the operator's own command line, as with ssh)
        command, shell=True, stdin=subprocess.PIPE, start_new_session=True
    )
    code = _fed_and_waited(child, delivery.payload, stop)
    if code == 0:
        delivery.ack()
    elif stop.is_set():
        delivery.nack(delay_s=0, reason="its consumer was stopped while --exec ran")
    else:
        delivery.nack(reason=f"--exec exited {code}")


def _fed_and_waited(child: subprocess.Popen[bytes], payload: bytes, stop: threading.Event) -> int:
    """The payload on the child's stdin, then its exit code: -1 past limits.work_exec_timeout_s
    or past the stop's grace (StopGrace), when its process group is ended (TERM, then KILL)."""
    assert child.stdin is not None
    feeder = threading.Thread(
        target=_feed, args=(child.stdin, payload), name="roq-work-feed", daemon=True
    )
    feeder.start()  # a payload larger than the pipe must not block the wait
    deadline = time.monotonic() + limits.work_exec_timeout_s
    grace = StopGrace(stop)  # finished soon after the stop, its message is acked
    while not grace.over() and time.monotonic() < deadline:
        try:
            return child.wait(grace.slice_s())
        except subprocess.TimeoutExpired:
            continue
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)
        try:
            child.wait(limits.work_exec_stop_grace_s)
            break
        except subprocess.TimeoutExpired:
            continue
    return -1


def _feed(pipe: IO[bytes], payload: bytes) -> None:
    with contextlib.suppress(OSError):  # the command need not read it all
        pipe.write(payload)
        pipe.close()


def _admin(gcm: str, zk: str | None, namespace: str):  # type: ignore[no-untyped-def]
    from roq.client.admin import AdminClient

    return AdminClient(gcm=None if zk else gcm, zk=zk, namespace=namespace)


@group_app.command("list")
def group_list(
    queue: str = typer.Argument(...),
    gcm: str = GCM_OPTION,
    zk: str | None = ZK_OPTION,
    namespace: str = NAMESPACE_OPTION,
) -> None:
    """The queue's groups: lag, slots, in flight, acked and dead letters."""
    with errors_to_exit(), _admin(gcm, zk, namespace) as admin:
        groups = admin.list_groups(queue)
    rows = [
        (
            g.name, f"{g.lag}+" if g.uncounted or g.uncut else g.lag, g.slots, g.leased,
            g.in_flight, g.acked, g.dead_letters, len(g.consumers),
        )
        for g in groups
    ]  # fmt: skip
    columns = ("GROUP", "LAG", "SLOTS", "LEASED", "IN FLIGHT", "ACKED", "DEAD", "CONSUMERS")
    typer.echo(table(columns, rows, right=columns[1:]))


@group_app.command("show")
def group_show(
    queue: str = typer.Argument(...),
    group: str = typer.Argument(...),
    gcm: str = GCM_OPTION,
    zk: str | None = ZK_OPTION,
    namespace: str = NAMESPACE_OPTION,
) -> None:
    """One group, per consumer."""
    with errors_to_exit(), _admin(gcm, zk, namespace) as admin:
        g = admin.get_group(queue, group)
        typer.echo(f"group {g.name} of {queue}{' (ordered)' if g.ordered else ''}"
                   + (f", key prefix {g.prefix!r}" if g.prefix else "")
                   + (", single active consumer" if g.single_active else ""))  # fmt: skip
        typer.echo(f"  lag: {g.lag} messages in {g.slots} slots ({g.uncounted} slots not read "
                   f"yet, {g.uncut} bytes not cut into slots yet)")  # fmt: skip
        typer.echo(f"  in flight: {g.in_flight}; acked: {g.acked}; dead letters: "
                   f"{g.dead_letters} (queue {g.dead_letter_queue})")  # fmt: skip
        if g.duplicates:
            typer.echo(f"  duplicates: {g.duplicates} (copies of a message id read within "
                       "dedup.window.ms: settled, not handed out)")  # fmt: skip
        for c in g.consumers:
            typer.echo(f"  consumer {c.consumer}: {c.slots} slot(s), {c.in_flight} in flight, "
                       f"{c.acked} acked, last seen {c.idle_s:.1f} s ago"
                       + (f", priority {c.priority}" if c.priority else "")
                       + (" (active)" if c.active else ""))  # fmt: skip


def dead_letter_fields(payload: bytes) -> dict[str, object]:
    """A dead letter (client/consumer.py `_publish_dead`) as JSON-able fields; one that is
    not a dead letter's BSON says so rather than stopping the listing."""
    import bson  # here: `roq --help` loads no codec
    from bson.errors import BSONError

    try:
        document = bson.decode(payload)
    except (BSONError, ValueError) as error:
        return {"Error": f"not a dead letter ({error})", "Bytes": len(payload)}
    fields: dict[str, object] = {}
    for name, value in document.items():
        if isinstance(value, bytes):
            try:
                fields[name] = value.decode("utf-8")
            except UnicodeDecodeError:
                fields[f"{name}Base64"] = base64.b64encode(value).decode("ascii")
        else:
            fields[name] = value if isinstance(value, (int, float, str, bool)) else str(value)
    return fields


@group_app.command("delete")
def group_delete(
    queue: str = typer.Argument(...),
    group: str = typer.Argument(...),
    gcm: str = GCM_OPTION,
    zk: str | None = ZK_OPTION,
    namespace: str = NAMESPACE_OPTION,
) -> None:
    """Forget a group and its state (its dead-letter queue stays)."""
    with errors_to_exit(), _admin(gcm, zk, namespace) as admin:
        admin.delete_group(queue, group)
        typer.echo(f"group {group} of {queue} deleted")
