"""`roq` commands: data."""

from __future__ import annotations

from roq.cli.app import app  # noqa: F401
