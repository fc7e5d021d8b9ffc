"""`roq call`, `roq serve` (request/response through a queue, client/requests.py) and
`roq task show|result|config`."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

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
)
from roq.cli.data import NAMESPACE_OPTION
from roq.errors import EXIT_INTERRUPTED, HandlerFailure, NoInput

task_app = typer.Typer(
    help="Tasks of request queues (roq call / roq serve): state, settings.", no_args_is_help=True
)
app.add_typer(task_app, name="task", rich_help_panel="Clients")

# Exit codes of `roq call` when the task ends without a result (sysexits-like, distinct).
_EXIT = {"failed": 1, "expired": 3, "no_worker": 4}


@app.command(rich_help_panel="Messages")
def call(
    queue: str = typer.Argument(..., help="Request queue (an existing roq queue)."),
    service: str = typer.Argument(..., help="Service the request is for."),
    request_id: str | None = typer.Option(
        None,
        "--request-id",
        help="Idempotency key: a request id known already returns its "
        "task (its stored result) instead of running again.",
    ),
    timeout: float | None = typer.Option(
        None, "--timeout", help="Give up waiting after S seconds (exit 75; the task goes on)."
    ),
    no_wait: bool = typer.Option(
        False,
        "--no-wait",
        help="Print QUEUE/TASK-ID once accepted and exit (wait for its result later "
        "with `roq task result QUEUE/TASK-ID`).",
    ),
    gcm: str = GCM_OPTION,
    zk: str | None = ZK_OPTION,
    namespace: str = NAMESPACE_OPTION,
) -> None:
    """Send stdin as a request to SERVICE's workers and print its result to stdout.

    Returns once a worker's result is stored (it is then acknowledged and removed). Exit 0 with
    the result; 1 if the task failed (its error on stderr); 3 expired; 4 no worker; 75 --timeout.
    """
    setup_logging("WARNING")
    with errors_to_exit():
        from roq.client.requests import Requester

        stop = stop_event()
        with interruptible(stop):  # nothing submitted yet
            payload = sys.stdin.buffer.read(limits.task_payload_bytes_max + 1)
        with Requester(queue, gcm=None if zk else gcm, zk=zk, namespace=namespace) as requester:
            task = requester.submit(service, payload, request_id)
            if no_wait:
                typer.echo(f"{queue}/{task.id}")
                return
            _print_result("roq call", f"{queue}/{task.id}", lambda: task.result(timeout), stop)


# `roq serve`'s options beyond the queue, service and command (module constants, as `roq work`'s)
_CONCURRENCY = typer.Option(
    1,
    "--concurrency",
    "-c",
    min=1,
    max=limits.worker_concurrency_max,
    help="Run up to N requests at once (one --exec process each).",
)
_PREFETCH = typer.Option(
    None,
    "--prefetch",
    min=1,
    help="Hold at most N requests handed out (default: the group's work.inflight); "
    "--prefetch equal to --concurrency leaves the rest to other workers.",
)
_CHECK_AVAILABLE = typer.Option(
    None,
    "--check-available",
    help="Shell command run every --check-every seconds (JLupin's checkAvailableScript): "
    f"exit 0 = available; non-zero, or running over {limits.worker_check_timeout_s:g} s, "
    "= the worker finishes what it runs and takes no request (leaves its group) until "
    "it exits 0 again.",
)
_CHECK_EVERY = typer.Option(
    limits.worker_check_period_s,
    "--check-every",
    min=limits.worker_check_period_min_s,
    max=limits.worker_check_period_max_s,
    help="Seconds between two --check-available runs.",
)
_MEMORY_MAX = typer.Option(
    None,
    "--memory-max",
    min=limits.serve_memory_mb_min,
    max=limits.serve_memory_mb_max,
    help="MB (JLupin's MEMORY_ERRORS): run the worker as a child process and, once it and "
    "its --exec commands use more resident memory, let it finish its running requests "
    "and start it again with the threshold raised by --memory-growth.",
)
_MEMORY_GROWTH = typer.Option(
    limits.serve_memory_growth_pct,
    "--memory-growth",
    min=0,
    max=limits.serve_memory_growth_pct_max,
    help="Percent the --memory-max threshold grows at each restart (percentageGrowth).",
)
_MEMORY_RESTARTS = typer.Option(
    limits.serve_memory_restarts,
    "--memory-restarts",
    min=0,
    max=limits.serve_memory_restarts_max,
    help="Restarts at most (howManyTimes); past them the worker is drained and roq serve exits 1.",
)


@app.command(rich_help_panel="Messages")
def serve(
    queue: str = typer.Argument(..., help="Request queue to take requests from."),
    service: str = typer.Argument(..., help="Service this worker runs."),
    exec_cmd: str = typer.Option(
        ...,
        "--exec",
        help="Shell command run per request: the payload on its stdin, its "
        "stdout the result; a non-zero exit is the task's error (with its stderr).",
    ),
    count: int | None = typer.Option(
        None, "--count", "-n", min=1, help="Exit after N requests run."
    ),
    timeout: float | None = typer.Option(
        None, "--timeout", help="Exit after S seconds without a request."
    ),
    concurrency: int = _CONCURRENCY,
    prefetch: int | None = _PREFETCH,
    check_available: str | None = _CHECK_AVAILABLE,
    check_every: float = _CHECK_EVERY,
    memory_max: float | None = _MEMORY_MAX,
    memory_growth: float = _MEMORY_GROWTH,
    memory_restarts: int = _MEMORY_RESTARTS,
    gcm: str = GCM_OPTION,
    zk: str | None = ZK_OPTION,
    namespace: str = NAMESPACE_OPTION,
) -> None:
    """Be a worker of SERVICE: run --exec per request and store its output as the result.

    Workers of one service share its requests (a consumer group); a worker that dies mid-task
    leaves the request to another after the group's lease (work.lease.ms). SIGTERM or Ctrl-C:
    no new request is taken, running commands get 0.4 s to finish (their results stored), then
    are ended and their requests handed back to the service's other workers, and it exits 0.
    """
    setup_logging("WARNING")
    with errors_to_exit():
        from roq.cli.supervise import MemoryRule, drain_on_usr1, supervise, supervised
        from roq.client.requests import Worker

        stop = stop_event()
        if memory_max is not None and not supervised():
            rule = MemoryRule(memory_max, memory_growth, memory_restarts)
            raise typer.Exit(supervise(rule, stop))
        drain = drain_on_usr1() if supervised() else None

        def run(payload: bytes) -> bytes:
            return _run(exec_cmd, payload, stop)

        with interruptible(stop):  # joining its group: no request taken yet
            worker = Worker(
                queue,
                service,
                run,
                gcm=None if zk else gcm,
                zk=zk,
                namespace=namespace,
                concurrency=concurrency,
                prefetch=prefetch,
                available=_checker(check_available) if check_available else None,
                check_period_s=check_every,
            )
        with worker:
            typer.echo(f"roq serve: {worker.name}", err=True)
            worker.run(stop, count, timeout, drain)


class CheckFailed(Exception):
    """--check-available exited non-zero, ran too long or could not run: why, for the log."""


def _checker(command: str) -> Callable[[], bool]:
    def available() -> bool:
        return check_available(command)

    return available


def check_available(command: str, timeout_s: float = limits.worker_check_timeout_s) -> bool:
    """True if `command` (a shell command line) exits 0 within `timeout_s`; CheckFailed naming
    its exit and output otherwise (a missing or non-executable script is the shell's 127/126,
    never an exception of ours), its process group ended past the timeout."""
    child = subprocess.Popen(  # noqa: S602 (the operator's own command line)
        command, shell=True, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    try:
        out, _ = child.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _end_group(child)
        raise CheckFailed(f"--check-available ran longer than {timeout_s:g} s") from None
    if child.returncode != 0:
        text = out.decode(errors="replace").strip()[-limits.worker_check_output_chars_max :]
        raise CheckFailed(f"--check-available {command!r}: exit {child.returncode}: {text}")
    return True


def _print_result(command: str, ref: str, wait: Callable[[], bytes], stop: threading.Event) -> None:
    """The result `wait` returns on stdout, or the exit code of its task's end (_EXIT, 75 for
    a timeout) with why on stderr. Ctrl-C or SIGTERM stops the wait at once (exit 130): the
    task goes on, its result kept for `roq task result`."""
    from roq.client.requests import TaskFailed, TaskTimeout

    try:
        with interruptible(stop):
            result = wait()
    except KeyboardInterrupt:
        typer.echo(f"{command}: stopped waiting; task {ref} goes on (roq task result {ref})",
                   err=True)  # fmt: skip
        raise typer.Exit(EXIT_INTERRUPTED) from None
    except TaskTimeout as error:
        typer.echo(f"{command}: {error}; task {ref}", err=True)
        raise typer.Exit(75) from None
    except TaskFailed as failure:
        typer.echo(f"{command}: {failure}", err=True)
        raise typer.Exit(_EXIT.get(failure.state, 1)) from None
    sys.stdout.buffer.write(result)
    sys.stdout.buffer.flush()


class CommandFailed(HandlerFailure):
    """--exec exited non-zero; its text (`exit N: stderr`) is the task's error."""


def _run(command: str, payload: bytes, stop: threading.Event) -> bytes:
    """--exec on one request (on a pool thread): its stdout, or CommandFailed with its exit and
    stderr. Stopped meanwhile (Ctrl-C, SIGTERM), the command gets limits.exec_stop_finish_s to
    finish (its result stored), then is ended and the request handed back (HandlerStopped), so
    that the worker stops within a second, not when the command is done."""
    from roq.client.requests import HandlerStopped

    child = subprocess.Popen(  # noqa: S602 (the operator's own command line, as with ssh)
        command, shell=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    deadline = time.monotonic() + limits.work_exec_timeout_s
    grace = StopGrace(stop)  # finished soon after the stop, its result is stored
    given: bytes | None = payload  # communicate takes the input once
    while True:
        try:
            out, err = child.communicate(given, timeout=grace.slice_s())
            break
        except subprocess.TimeoutExpired:
            given = None
            if grace.over() or time.monotonic() > deadline:
                _end_group(child)
                if stop.is_set():
                    raise HandlerStopped(command) from None
                raise CommandFailed(
                    f"--exec ran longer than {limits.work_exec_timeout_s} s"
                ) from None
    if child.returncode != 0:
        # the whole stderr, as far as the bound goes (its end: the error is usually last),
        # for request.retry.pattern to search, as JLupin searched the whole failure text
        head = f"exit {child.returncode}: "
        text = err.decode(errors="replace").strip()
        raise CommandFailed(head + text[-(limits.task_error_chars_max - len(head)) :])
    return out


def _end_group(child: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the command's process group, SIGKILL past limits.work_exec_stop_grace_s."""
    for signum in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(child.pid, signum)
        try:
            child.communicate(timeout=limits.work_exec_stop_grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def _split(ref: str, queue: str | None) -> tuple[str, str]:
    if "/" in ref:
        found, _, task = ref.partition("/")
        return found, task
    if not queue:
        raise ValueError("name the queue: QUEUE/TASK-ID or --queue QUEUE")
    return queue, ref


@task_app.command("show")
def task_show(
    ref: str = typer.Argument(
        ..., help="QUEUE/TASK-ID (as `roq call --no-wait` prints), or TASK-ID with --queue."
    ),
    queue: str | None = typer.Option(None, "--queue", "-q"),
    result: bool = typer.Option(
        False, "--result", help="Print the result (not acknowledged: it stays) to stdout."
    ),
    gcm: str = GCM_OPTION,
    zk: str | None = ZK_OPTION,
    namespace: str = NAMESPACE_OPTION,
) -> None:
    """A task's state: accepted, in_progress, done, failed, expired or no_worker.

    Exit 66 if the queue holds no record of the task (never submitted, acknowledged or
    collected)."""
    with errors_to_exit():
        from roq.client.requests import Requester

        name, task_id = _split(ref, queue)
        with Requester(name, gcm=None if zk else gcm, zk=zk, namespace=namespace) as requester:
            view = requester.task(task_id).view
        if view.gone:
            raise NoInput(f"task {name}/{task_id}: {view.error}")
        if result:
            sys.stdout.buffer.write(view.result)
            return
        typer.echo(f"task {name}/{view.task}: {view.state}")
        typer.echo(f"  service: {view.service}; attempt {view.attempt}; "
                   f"accepted {view.age_ms / 1000:.1f} s ago")  # fmt: skip
        if view.error:
            typer.echo(f"  error: {view.error}")
        if view.state == "done":
            typer.echo(f"  result: {len(view.result)} bytes")


@task_app.command("result")
def task_result(
    ref: str = typer.Argument(
        ..., help="QUEUE/TASK-ID (as `roq call --no-wait` prints), or TASK-ID with --queue."
    ),
    queue: str | None = typer.Option(None, "--queue", "-q"),
    timeout: float | None = typer.Option(
        None, "--timeout", help="Give up waiting after S seconds (exit 75; the task goes on)."
    ),
    keep: bool = typer.Option(
        False, "--keep", help="Do not acknowledge the result: it stays until fetched again."
    ),
    gcm: str = GCM_OPTION,
    zk: str | None = ZK_OPTION,
    namespace: str = NAMESPACE_OPTION,
) -> None:
    """Wait for a task's result and print it to stdout (then it is acknowledged and removed).

    The exit codes of `roq call`: 0 with the result; 1 failed (its error on stderr); 3 expired
    or unknown; 4 no worker; 75 --timeout.
    """
    setup_logging("WARNING")
    with errors_to_exit():
        from roq.client.requests import Requester

        name, task_id = _split(ref, queue)
        stop = stop_event()
        with Requester(name, gcm=None if zk else gcm, zk=zk, namespace=namespace) as requester:
            task = requester.task(task_id)
            _print_result("roq task result", f"{name}/{task_id}",
                          lambda: task.result(timeout, ack=not keep), stop)  # fmt: skip


@task_app.command("config")
def task_config(
    queue: str = typer.Argument(...),
    settings: list[str] = typer.Argument(
        None, help='KEY=VALUE to set (docs/configuration.md, "Request queues"); none: show.'
    ),
    gcm: str = GCM_OPTION,
    zk: str | None = ZK_OPTION,
    namespace: str = NAMESPACE_OPTION,
) -> None:
    """The queue's request settings (JLupin's queue parameters), set per queue."""
    with errors_to_exit():
        from roq.client.requests import Requester
        from roq.config.loader import parse_overrides

        changes = parse_overrides(settings or [])
        with Requester(queue, gcm=None if zk else gcm, zk=zk, namespace=namespace) as requester:
            now = requester.settings(changes)
        for key, value in sorted(now.items()):
            typer.echo(f"{key}={value}")
