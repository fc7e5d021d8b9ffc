"""What every command shares: logging, signals, and turning roq errors into exit codes."""

from __future__ import annotations

import io
import logging
import os
import signal
import sys
import threading
from collections.abc import Collection, Iterable, Iterator, Sequence
from contextlib import contextmanager

import typer

from roq import limits
from roq.client.stop import Grace, Stop
from roq.errors import RoqError

CONFIG_OPTION = typer.Option(
    None,
    "--config",
    "-c",
    help="Properties file (default: for roq gcm, host and http $ROQ_HOME/config/GCM.properties "
    "or HCM.properties if present; else the built-in defaults).",
)
DEFINE_OPTION = typer.Option(
    [], "--define", "-D", help="Override a key: -D key=value (repeatable)."
)
GCM_OPTION = typer.Option(
    "127.0.0.1:5000", "--gcm", envvar="ROQ_GCM", help="GCM HOST:PORT (PORT = ports.base)."
)
ZK_OPTION = typer.Option(None, "--zk", help="ZooKeeper connect string: find the leading GCM there.")


def table(
    columns: Sequence[str],
    rows: Iterable[Sequence[object]],
    *,
    right: Collection[str] = (),
    header: bool = True,
    indent: int = 0,
) -> str:
    """`rows` under their `columns` (those named in `right` right-aligned), each column as wide
    as its widest cell: rich's Table as plain text, with no colour, box or wrapping, so that a
    pipe, a log or a test reads what a terminal shows."""
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    grid = Table(
        box=None, show_header=header, header_style="", pad_edge=False, padding=(0, 2, 0, 0)
    )
    for name in columns:
        grid.add_column(name, justify="right" if name in right else "left", no_wrap=True)
    for row in rows:
        grid.add_row(*(Text(str(cell)) for cell in row))  # Text: no markup in names
    out = io.StringIO()
    Console(file=out, width=10_000, color_system=None, highlight=False).print(grid)
    return "\n".join(" " * indent + line.rstrip() for line in out.getvalue().splitlines())


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=os.environ.get("ROQ_LOG_LEVEL", level),
        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
        stream=sys.stderr,
    )
    # kazoo one level above the command's: a daemon (INFO) logs its warnings, a client command
    # (WARNING) not its connection retries, which came before its own error naming the address
    kazoo_level = max(logging.WARNING, logging.getLogger().getEffectiveLevel() + 10)
    logging.getLogger("kazoo").setLevel(kazoo_level)


def fail(message: str, code: int) -> typer.Exit:
    typer.echo(f"roq: {message}", err=True)
    return typer.Exit(code)


@contextmanager
def errors_to_exit() -> Iterator[None]:
    """A roq error ends the command with one line on stderr and its exit code."""
    try:
        yield
    except RoqError as error:
        raise fail(str(error), error.exit_code) from None
    except ValueError as error:
        raise fail(str(error), 2) from None


@contextmanager
def serving(what: str) -> Iterator[None]:
    """Around a daemon's main loop: an error that is not a roq error is a bug. Log it with its
    traceback (a one-line message hides where it came from) and exit 70 (EX_SOFTWARE), which
    systemd's Restart=on-failure restarts."""
    try:
        yield
    except (RoqError, KeyboardInterrupt, typer.Exit):
        raise
    except Exception as error:
        logging.getLogger("roq").exception("%s stopped by an unexpected error", what)
        raise fail(f"{what}: unexpected {type(error).__name__}: {error}", 70) from None


# "waiting" is set by `interruptible` while the main thread waits with nothing in flight to settle
_main_thread = {"waiting": False}


def stop_event() -> threading.Event:
    """An event set by SIGTERM or SIGINT (Ctrl-C): daemons drain and exit 0, a client command
    settles what it holds and exits 0. Inside `interruptible` the signal also ends the wait at
    once: KeyboardInterrupt, which typer makes exit 130."""
    event = Stop()  # the graces of what stops count from the signal

    def handler(signum: int, _frame: object) -> None:
        logging.getLogger("roq").info("received %s; stopping", signal.Signals(signum).name)
        event.set()
        if _main_thread["waiting"]:
            raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return event


class Interruptible:
    """Around a client's waits that hold nothing to settle (finding and joining a queue, reading
    stdin, waiting for a result): a signal of `stop_event` ends them at once rather than when
    they time out (issue 32: every client command stops within 1 s of Ctrl-C or SIGTERM). A
    class, not a generator, and reusable: `roq pub` enters one per line of stdin."""

    def __init__(self, stop: threading.Event):
        self.stop = stop

    def __enter__(self) -> None:
        if self.stop.is_set():
            raise KeyboardInterrupt
        _main_thread["waiting"] = True

    def __exit__(self, *exc: object) -> None:
        _main_thread["waiting"] = False


def interruptible(stop: threading.Event) -> Interruptible:
    return Interruptible(stop)


class StopGrace(Grace):
    """For an `--exec` command running when its worker is told to stop: it gets
    limits.exec_stop_finish_s from the stop to finish (its outcome kept: acked, or stored), then
    `over()` says end it and hand its work back, so that the stop takes less than a second."""

    def __init__(self, stop: threading.Event):
        super().__init__(stop, limits.exec_stop_finish_s)

    def slice_s(self) -> float:
        """How long to wait for the command before asking again."""
        return limits.exec_stop_check_s if self.stop.is_set() else limits.work_cli_stop_check_s
