"""Assembles the typer application from the command modules of `roq.cli`."""

from __future__ import annotations

import atexit
import gc
import os
import sys
from pathlib import Path

import typer

import roq

app = typer.Typer(
    name="roq",
    help="roq: an elastic, persistent message queue.\n\n"
    "Start a one-machine cluster with `roq up`; create a queue with `roq queue create q1`; "
    "publish with `roq pub q1` and subscribe with `roq sub q1`.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=True,  # --install-completion, --show-completion (docs/operations.md)
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"roq {roq.__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", callback=_version, is_eager=True, help="Print the version and exit."
    ),
    credentials: Path | None = typer.Option(
        None,
        "--credentials",
        help="Credentials file of a principal (default: $ROQ_CREDENTIALS, else "
        "$ROQ_HOME/security/admin.json, else roq-data/security/admin.json).",
    ),
) -> None:
    """roq: an elastic, persistent message queue."""
    if credentials is not None:
        # Through the environment, so the processes a command starts (roq bench) use it too.
        os.environ["ROQ_CREDENTIALS"] = str(credentials.resolve())


# What the host, `roq up` and systemd start: these need roq.cli.daemons alone, and importing
# every other command module costs each start ~0.3-0.5 s of CPU (a host restarting its monitors
# and exchanges starts several at once: docs/benchmarks.md, "Restart is resume").
DAEMON_COMMANDS = frozenset({"gcm", "host", "http", "up", "monitor", "exchange"})
_VALUED_OPTIONS = frozenset({"--credentials"})  # the root options that take a value


def command_of(argv: list[str]) -> str | None:
    """The subcommand `argv` (without the program) names, if any."""
    args = iter(argv)
    for arg in args:
        if arg in _VALUED_OPTIONS:
            next(args, None)
        elif not arg.startswith("-"):
            return arg
    return None


def main() -> None:
    # Registered first, so run last: the interpreter's final collection walks every object the
    # imports made (80 ms here, 0.4 s on a loaded machine) to find cycles a process about to end
    # need not free; frozen, they are left to the OS. A client's stop has a second (README).
    atexit.register(gc.freeze)
    # each module registers its commands on `app` as it is imported
    if command_of(sys.argv[1:]) in DAEMON_COMMANDS:
        from roq.cli import daemons  # noqa: F401
    else:
        from roq.cli import commands  # noqa: F401
    # One name however it runs (the `roq` script, `python -m roq`, the frozen binary): shell
    # completion keys its script and its variable (_ROQ_COMPLETE) on it.
    app(prog_name="roq")
