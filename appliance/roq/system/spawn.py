"""How roq starts roq: the same program, frozen or not, as a child that dies with its parent."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

_PR_SET_PDEATHSIG = 1  # prctl(2)'s option number (Linux ABI, not a bound)


def is_frozen() -> bool:
    return bool(getattr(sys, "frozen", False))


def roq_command(*args: str) -> list[str]:
    """The argv that runs `roq ARGS…` with this very program."""
    if is_frozen():
        return [sys.executable, *args]
    return [sys.executable, "-m", "roq", *args]


def child_environment() -> dict[str, str]:
    env = dict(os.environ)
    # A one-file child would otherwise reuse its parent's unpack directory, which the parent
    # deletes when it exits (ecosystem notes §3).
    env["PYINSTALLER_RESET_ENVIRONMENT"] = "1"
    env.setdefault("PYTHONUNBUFFERED", "1")
    return env


def die_with_parent() -> None:
    """preexec_fn: the kernel sends SIGTERM to the child if its parent dies, even by SIGKILL,
    so a killed host leaves no orphan monitors or exchanges behind."""
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass
