"""The CLI's tables (rich's Table as plain text): what a pipe or a test reads of them."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from pathlib import Path

import roq
from roq.cli.common import table

app_module = importlib.import_module("roq.cli.app")  # the module (roq.cli.app is the Typer too)


def test_columns_are_as_wide_as_their_widest_cell_and_numbers_can_align_right():
    text = table(("QUEUE", "LAG", "HOST"), [("q1", 5, "h1"), ("a-long-queue", 12345, "h2 (down)")],
                 right=("LAG",))  # fmt: skip
    assert text.splitlines() == [
        "QUEUE           LAG  HOST",
        "q1                5  h1",
        "a-long-queue  12345  h2 (down)",
    ]


def test_a_long_row_is_not_wrapped_and_no_cell_is_read_as_markup():
    long = "tcp://127.0.0.1:5100/" + "x" * 300
    text = table(("NAME", "ADDRESS"), [("[bold]q1[/bold]", long)], header=False, indent=2)
    assert text == f"  [bold]q1[/bold]  {long}"
    assert "\x1b" not in text  # no colour codes, tty or not


def test_the_daemon_commands_are_the_ones_roq_cli_daemons_registers():
    """`roq http`, `roq monitor`... import roq.cli.daemons alone (app.DAEMON_COMMANDS): each of
    them must be registered by it, and it must register no other."""
    probe = (
        "from roq.cli import daemons\n"
        "from roq.cli.app import app\n"
        "print(' '.join(sorted(c.name or c.callback.__name__ for c in app.registered_commands)))"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(roq.__file__).parents[1])}
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True,
                          env=env, timeout=60, check=True)  # fmt: skip
    assert set(done.stdout.split()) == set(app_module.DAEMON_COMMANDS)
    assert app_module.command_of(["--credentials", "x.json", "http", "-D", "a=b"]) == "http"
    assert app_module.command_of(["--version"]) is None
    assert app_module.command_of(["queue", "create", "q1"]) == "queue"
