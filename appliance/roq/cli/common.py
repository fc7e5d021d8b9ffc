"""What every command shares: logging, signals, and turning roq errors into exit codes."""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import typer

from roq.errors import RoqError

CONFIG_OPTION = typer.Option(
    None, "--config", "-c", help="Properties file (default: built-in defaults)."
)
DEFINE_OPTION = typer.Option(
    [], "--define", "-D", help="Override a key: -D key=value (repeatable)."
)
GCM_OPTION = typer.Option("127.0.0.1:5000", "--gcm", help="GCM HOST:PORT (PORT = ports.base).")
ZK_OPTION = typer.Option(None, "--zk", help="ZooKeeper connect string: find the leading GCM there.")


def setup_logging(level: str = "INFO") -> None:
    logging.basicConfig(
        level=os.environ.get("ROQ_LOG_LEVEL", level),
        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s",
        stream=sys.stderr,
    )
    logging.getLogger("kazoo").setLevel(logging.WARNING)


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


def stop_event() -> threading.Event:
    """An event set by SIGTERM or SIGINT (Ctrl-C): daemons drain and exit 0."""
    event = threading.Event()

    def handler(signum: int, _frame: object) -> None:
        logging.getLogger("roq").info("received %s; stopping", signal.Signals(signum).name)
        event.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
    return event
