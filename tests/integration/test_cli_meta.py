"""`roq pub --header/--id/--ttl/--delay` (issue 33 item 7) against a real cluster: what it
publishes, `roq sub --meta` prints; a malformed option exits 65 naming it before anything is
sent."""

from __future__ import annotations

import json
import subprocess
import time
import uuid

import pytest

from roq.errors import EXIT_DATAERR
from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import LocalCluster

pytestmark = pytest.mark.integration


def _roq(cluster: LocalCluster, *args: str, stdin: str = "") -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        roq_command(*args, "--gcm", cluster.gcm), env=child_environment(), input=stdin,
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip


def _read(cluster: LocalCluster, count: int) -> list[tuple[dict[str, object], str]]:
    read = _roq(cluster, "sub", "q1", "--from-beginning", "--meta", "--count", str(count),
                "--timeout", "30")  # fmt: skip
    assert read.returncode == 0, read.stderr
    lines = [line.split("\t", 1) for line in read.stdout.splitlines()]
    return [(json.loads(meta), payload) for meta, payload in lines]


def test_pub_gives_every_message_its_meta_and_sub_meta_prints_it(cluster: LocalCluster) -> None:
    cluster.start_with_queue()
    given = uuid.uuid4()
    before_us = time.time_ns() // 1000
    sent = _roq(cluster, "pub", "q1", "--acks", "leader", "--header", "a=b", "-H", "a=c=d",
                "--header", "trace=", "--id", str(given), "--ttl", "1h", "--delay", "1.5s",
                stdin="one\ntwo\n")  # fmt: skip
    after_us = time.time_ns() // 1000
    assert sent.returncode == 0, sent.stderr
    auto = _roq(cluster, "pub", "q1", "--acks", "leader", "--id", "auto", stdin="x\ny\n")
    assert auto.returncode == 0, auto.stderr
    plain = _roq(cluster, "pub", "q1", "--acks", "leader", stdin="plain\n")
    assert plain.returncode == 0, plain.stderr

    (one, first), (two, second), (x, _), (y, _), (none, last) = _read(cluster, 5)
    assert (first, second, last) == ("one", "two", "plain")
    for meta in (one, two):
        assert meta["headers"] == {"a": ["b", "c=d"], "trace": ""}
        assert meta["id"] == given.hex
        expires, due = meta["expires_at_us"], meta["not_before_us"]
        assert isinstance(expires, int) and isinstance(due, int)
        assert before_us + 3_600_000_000 <= expires <= after_us + 3_600_000_000
        assert expires - due == 3_600_000_000 - 1_500_000
    assert x["id"] != y["id"] and len(str(x["id"])) == 32  # --id auto: one per message
    assert x["expires_at_us"] is None and x["headers"] == {}
    assert none == {"headers": {}, "id": None, "expires_at_us": None, "not_before_us": None}


def test_a_malformed_meta_option_exits_65_naming_it_and_sends_nothing(
    cluster: LocalCluster,
) -> None:
    cluster.start_with_queue()
    for args, named in [
        (("--header", "novalue"), "--header 'novalue': expected NAME=VALUE"),
        (("--header", "=v"), "--header '=v': expected NAME=VALUE"),
        (("--ttl", "30"), "--ttl '30': expected a number and a unit"),
        (("--ttl", "2y"), "--ttl '2y': expected a number and a unit"),
        (("--delay", "400d"), "--delay '400d': from 1ms to 365d"),
        (("--id", "1234"), "--id: '1234' is not a message id"),
    ]:
        refused = _roq(cluster, "pub", "q1", "--acks", "leader", *args, stdin="never\n")
        assert refused.returncode == EXIT_DATAERR, (args, refused.stderr)
        assert named in refused.stderr, refused.stderr
    assert _roq(cluster, "pub", "q1", "--acks", "leader", stdin="only\n").returncode == 0
    [(_, payload)] = _read(cluster, 1)
    assert payload == "only"  # the refused commands sent nothing before it
