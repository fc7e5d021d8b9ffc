"""A child its host cannot start again (issue 17, "visible"): `roq status` shows it restarting,
with its failure count and next try, then given up, with its last exit; the host logs the giving
up at ERROR; `roq queue stop` and `start` retry it."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

import pytest

from roq import limits
from roq.errors import EXIT_NOT_SERVING
from roq.testing.cluster import LocalCluster, processes_with, wait_for

pytestmark = pytest.mark.integration

# The back-off (0.25 s doubling to 10 s) before each of the 10 restarts adds up to 56 s; each
# failed start is a process that imports roq and exits.
GIVEN_UP_S = 120.0


def _roq(cluster: LocalCluster, *args: str) -> str:
    result = cluster.cli(*args, "--gcm", cluster.gcm, timeout_s=60)
    ok = (0, EXIT_NOT_SERVING) if args[:1] == ("status",) else (0,)  # 5: printed, NOT SERVING
    assert result.returncode in ok, f"roq {' '.join(args)}: {result.stderr}\n{cluster.logs()}"
    return result.stdout


def _children(cluster: LocalCluster) -> list[dict[str, Any]]:
    [host] = json.loads(_roq(cluster, "status", "--json"))["Hosts"]
    return list(host["Children"])


def _state(cluster: LocalCluster, want: str) -> dict[str, Any] | None:
    found = [c for c in _children(cluster) if c["State"] == want]
    return found[0] if found else None


def test_an_exchange_that_cannot_open_its_log_is_shown_restarting_then_given_up(
    cluster: LocalCluster,
):
    cluster.start_gcm()
    host = cluster.start_host("h1")
    cluster.wait_ready()
    _roq(cluster, "queue", "create", "q1")
    [queue] = json.loads(_roq(cluster, "status", "--json"))["Queues"]
    exchange_id = queue["Exchanges"][0]["Id"]
    assert _children(cluster) == []

    # A file where its log directory was: every start of the exchange fails (exit 73).
    log_dir = cluster.tmp / "h1" / "log" / "q1" / exchange_id
    aside = log_dir.with_name(exchange_id + ".aside")
    log_dir.rename(aside)
    log_dir.write_text("not a directory\n")
    [pid] = processes_with(f"--id {exchange_id}")
    os.kill(pid, signal.SIGKILL)

    restarting = wait_for(lambda: _state(cluster, "RESTARTING"), 20, "exchange restarting")
    assert (restarting["Queue"], restarting["Id"], restarting["Role"]) == (
        "q1", exchange_id, "exchange",
    )  # fmt: skip
    assert restarting["Failures"] >= 1
    text = _roq(cluster, "status")
    assert "      restarting (failure " in text, text

    given_up = wait_for(lambda: _state(cluster, "GIVEN_UP"), GIVEN_UP_S, "exchange given up")
    failures = limits.child_restarts_max + 1
    assert given_up["Failures"] == failures
    assert given_up["LastExit"] == "exit code 73"
    text = _roq(cluster, "status")
    assert f"      given up after {failures} failures (last: exit code 73, " in text, text
    giving_up = f"exchange q1/{exchange_id}: {failures} failures in a row (last: exit code 73)"
    [line] = [x for x in host.log_text().splitlines() if giving_up in x]
    assert " ERROR " in line, line

    # stop and start retry it, on its log, and the host's record is clean again
    _roq(cluster, "queue", "stop", "q1")
    assert wait_for(lambda: _children(cluster) == [], 10, "the given-up exchange forgotten")
    log_dir.unlink()
    aside.rename(log_dir)
    _roq(cluster, "queue", "start", "q1")
    assert processes_with(f"--id {exchange_id}")
    assert _children(cluster) == []
