"""The `roq` command line: one program, every mode and every client command."""

from __future__ import annotations

from roq.cli.app import app, main

__all__ = ["app", "main"]
