"""Issue 31: ZooKeeper closed to strangers (docs/security.md §4), the parts checked without a
server: the AMI's ZooKeeper bounded as `roq up`'s, principal znodes named by an HMAC, and one
rate limit for every refusal line of a process. The servers themselves:
tests/integration/test_zookeeper_closed.py."""

from __future__ import annotations

import logging
import re
from pathlib import Path

import pytest
import zmq

from roq import limits
from roq.coordination.principals import NODE_PREFIX, principal_node
from roq.local.zkserver import CLOSED_JVM_OPTIONS, closed_config
from roq.protocol import principals
from roq.transport import security

ROOT = Path(__file__).resolve().parents[2]


def test_the_images_zookeeper_is_closed_as_roq_ups() -> None:
    """ami/files/zoo.cfg is a static file: it must carry every line of the embedded server's
    closed block, and no second value of those keys (ZooKeeper would take the last)."""
    shipped = (ROOT / "ami" / "files" / "zoo.cfg").read_text().splitlines()
    for line in closed_config().splitlines():
        key = line.split("=", 1)[0]
        assert [s for s in shipped if s.startswith(key + "=")] == [line], key
    unit = (ROOT / "systemd" / "roq-zookeeper.service").read_text()
    for option in CLOSED_JVM_OPTIONS:
        assert option in unit


def test_only_ruok_is_left_among_the_four_letter_words() -> None:
    assert "4lw.commands.whitelist=ruok\n" in closed_config()
    # `roq up` asks only that one (local/zkserver.py::is_serving)
    source = (ROOT / "appliance" / "roq" / "local" / "zkserver.py").read_text()
    assert re.findall(r"sendall\(b\"(\w{4})\"\)", source) == ["ruok"]


def test_a_principals_znode_name_needs_the_credential() -> None:
    node = principal_node("alice", "roq:secret")
    assert node == principal_node("alice", "roq:secret")
    assert node != principal_node("alice", "roq:other")  # another cluster: another name
    assert node != principal_node("alicf", "roq:secret")
    assert node.startswith(NODE_PREFIX) and "alice" not in node
    with pytest.raises(ValueError):  # never the name of a principal written before
        principals.check_name(node)


def _refused_keys(count: int, caplog: pytest.LogCaptureFixture) -> list[str]:
    gate = security.Gate()
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger=security.__name__):
        for _ in range(count):
            public, _secret = zmq.curve_keypair()
            assert not gate.callback("roq", public)
    return [r.getMessage() for r in caplog.records]


def test_300_random_keys_make_a_bounded_number_of_refusal_lines(
    caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 31, finding 8: the limit was per key, so a holder of the cluster's public key made
    one line per random key (300 lines in 0.5 s)."""
    monkeypatch.setattr(security, "_refusals", security._RefusalLog())
    lines = _refused_keys(300, caplog)
    assert len(lines) == limits.refusal_log_lines_max, lines
    assert all("a client key unknown to this cluster" in line for line in lines)


def test_refusals_not_logged_are_counted_when_the_limit_reopens() -> None:
    refusals = security._RefusalLog()
    records: list[str] = []

    class Catch(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record.getMessage())

    handler = Catch()
    logging.getLogger(security.__name__).addHandler(handler)
    try:
        for n in range(300):
            refusals.refused(b"key%d" % n, "roq", "a stranger", now=100.0 + n / 600)
        assert len(records) == limits.refusal_log_lines_max
        # a minute later: the next refusal is said, with how many were not
        later = 100.0 + limits.refusal_log_interval_s + 1
        refusals.refused(b"another", "roq", "a stranger", now=later)
        suppressed = 300 - limits.refusal_log_lines_max
        wanted = f"at most {limits.refusal_log_lines_max} lines a minute"
        assert records[-1] == f"{suppressed} more refusals were not logged ({wanted})"
        assert "a stranger" in records[-2]
        # one key retrying is said once a minute, as before
        refusals.refused(b"another", "roq", "a stranger", now=later + 1)
        assert len(records) == limits.refusal_log_lines_max + 2
    finally:
        logging.getLogger(security.__name__).removeHandler(handler)
