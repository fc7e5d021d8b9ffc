"""Protocol tables: numbers are unique per channel and never reused; BSON decoding is bounded."""

from __future__ import annotations

import bson
import pytest

from roq import limits
from roq.errors import DecodeError, FrameTooLarge, ProtocolError
from roq.protocol import bsonmsg, commands, dataplane, rules
from roq.protocol.names import check_queue_name


def test_no_live_number_is_retired():
    for enum_name, retired in commands.RETIRED.items():
        live = {int(m) for m in getattr(commands, enum_name)}
        assert not live & retired, enum_name


def test_roq_admin_numbers_are_kept():
    assert commands.AdminCommand.GET_HOST_BY_QNAME == 2000
    assert commands.AdminCommand.CREATE_QUEUE_AUTOMATICALLY == 2010
    assert commands.AdminCommand.QUEUE_EXISTS == 2011
    assert commands.BroadcastCommand.MNGT_UPDATE_CONFIG == 1500
    assert commands.Result.FAIL == 1101


def test_decode_refuses_oversized_frames_before_parsing():
    with pytest.raises(FrameTooLarge):
        bsonmsg.decode([b"\0" * (limits.admin_frame_bytes_max + 1)])


@pytest.mark.parametrize("frame", [b"", b"\x05\x00\x00\x00", b"garbage!", bson.encode({"a": 1})])
def test_decode_errors_are_protocol_errors(frame):
    with pytest.raises(DecodeError):
        bsonmsg.decode([frame])


@pytest.mark.parametrize("name", ["", "a b", "../x", "-x", "x" * 65, "q/1", "é"])
def test_invalid_queue_names(name):
    with pytest.raises(DecodeError):
        check_queue_name(name)


def test_valid_queue_names():
    for name in ("q1", "orders.eu-west_1", "A" * 64):
        assert check_queue_name(name) == name


# RoQ's TestJVMStatus cases: the exact rule semantics.
def test_host_rule_semantics():
    assert rules.host_rule_fires(2, 35, cpu=4, ram=32)
    assert rules.host_rule_fires(2, 35, cpu=1.5, ram=37)
    assert not rules.host_rule_fires(2, 35, cpu=1.5, ram=34.5)
    assert not rules.host_rule_fires(2, 0, cpu=1.5, ram=10_000)


def test_queue_rule_semantics():
    assert rules.queue_rule_fires(1000, 1000, 20000, 1e6, exchanges=10)
    assert rules.queue_rule_fires(1000, 1000, 20000, 1e6, exchanges=100)
    assert not rules.queue_rule_fires(1000, 1000, 20000, 1e6, exchanges=1000)


@pytest.mark.parametrize(
    ("doc", "fragment"),
    [
        ({}, "AUTOSCALING_NAME"),
        ({"AUTOSCALING_NAME": "r"}, "no rule given"),
        (
            {"AUTOSCALING_NAME": "r", "AUTOSCALING_HOST": {"AUTOSCALING_HOST_CPU": -1}},
            "AUTOSCALING_HOST.AUTOSCALING_HOST_CPU must not be negative",
        ),
        (
            {"AUTOSCALING_NAME": "r", "AUTOSCALING_XCHANGE": {"AUTOSCALING_XCHANGE_THR": "9"}},
            "AUTOSCALING_XCHANGE.AUTOSCALING_XCHANGE_THR must be a number",
        ),
        ({"AUTOSCALING_NAME": "r", "AUTOSCALING_Q": 5}, "AUTOSCALING_Q field must be a document"),
    ],
)
def test_invalid_rules_name_the_field(doc, fragment):
    with pytest.raises(ValueError, match=fragment.replace(".", r"\.")):
        rules.validate_rules(doc)


def test_replay_requests_round_trip_with_and_without_a_leader():
    for leader in ("", "127.0.0.1-18000-72d6cf"):
        read = dataplane.parse_read_request(dataplane.read_request(40, 512, leader))
        assert (read.kind, read.offset, read.max_bytes, read.leader) == (b"R", 40, 512, leader)
        seek = dataplane.parse_read_request(dataplane.seek_request(123, leader))
        assert (seek.kind, seek.timestamp_us, seek.leader) == (b"T", 123, leader)
        position = dataplane.parse_read_request(dataplane.position_request(leader))
        assert (position.kind, position.leader) == (b"P", leader)


@pytest.mark.parametrize(
    ("frames", "fragment"),
    [
        ([], "empty"),
        ([b"Z"], "unknown replay request kind"),
        ([b"R", b"short"], "malformed"),
        ([b"T"], "malformed"),
        ([b"P", b"leader", b"extra"], "malformed"),
        ([b"P", b""], "leader id must be"),
        ([b"R", bytes(12), b"x" * 201], "leader id must be"),
    ],
)
def test_malformed_replay_requests_name_what_is_wrong(frames, fragment):
    with pytest.raises(ProtocolError, match=fragment):
        dataplane.parse_read_request(frames)
