"""A client command whose GCM does not answer (issue 32): it says what it waits for within a
second, honours its --timeout for the whole command, and names the address it was given. Real
`roq` processes against a real port with nothing behind it (a bound, never-accepting socket)."""

from __future__ import annotations

import os
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

from roq.errors import EXIT_UNAVAILABLE
from roq.system.spawn import child_environment, roq_command

pytestmark = pytest.mark.integration

# Liveness bound for a 3 s --timeout on a loaded machine (it used to take 64 s: 10 attempts
# of 5 s plus the waits between them)
DONE_WITHIN_S = 20.0


@pytest.fixture
def silent_port() -> Iterator[int]:
    """A TCP port that is bound and listening but never accepts: a GCM that hangs."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(0)
        yield sock.getsockname()[1]


def test_sub_with_a_silent_gcm_says_what_it_waits_for_and_keeps_its_timeout(silent_port: int):
    given = f"127.0.0.1:{silent_port}"
    env = {**child_environment(), "ROQ_SECURITY": "off"}
    started = time.monotonic()
    done = subprocess.run(
        roq_command("sub", "q1", "--gcm", given, "--timeout", "3"),
        env=env, capture_output=True, text=True, timeout=DONE_WITHIN_S, check=False,
        cwd=os.path.dirname(__file__),
    )  # fmt: skip
    took = time.monotonic() - started
    assert done.returncode == EXIT_UNAVAILABLE, done.stderr
    assert f"waiting for the GCM at {given}: no answer yet" in done.stderr
    assert f"the GCM at {given} (admin endpoint" in done.stderr  # the address as given
    assert took < DONE_WITHIN_S
