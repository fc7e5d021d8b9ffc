"""Assembles the typer application from the command modules of `roq.cli`."""

from __future__ import annotations

import os
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
    add_completion=False,
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


def main() -> None:
    from roq.cli import commands  # noqa: F401  (registers the commands on `app`)

    app()
