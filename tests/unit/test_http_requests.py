"""The HTTP calls' bodies (http/api.py), read once into their request classes: each field is
checked in the order the calls always checked them, v1 and v2 differ where the API does."""

from __future__ import annotations

import pytest

from roq import config, limits
from roq.http.api import Ack, BadRequest, Fields, Get, Publish, Register


@pytest.fixture
def fields() -> Fields:
    return Fields(config.HttpSettings.from_settings(config.load_hcm(None)))


def test_a_body_is_read_into_its_request(fields: Fields):
    assert Register.read(fields, {"owner": "o", "topic": "t"}, False) == Register("o", "t")
    batch = {"owner": "o", "topic": "t", "msgs": ["a", "b"], "msg": "ignored"}
    assert Publish.read(fields, batch, True) == Publish("o", "t", [b"a", b"b"])
    assert Publish.read(fields, {"owner": "o", "topic": "t", "msg": "a"}, False).messages == [b"a"]
    waiting = {"subscriber": "s", "topic": "t", "wait": 2}
    assert Get.read(fields, waiting, True).wait == 2.0
    assert Get.read(fields, waiting, False).wait == 0.0  # v1 does not wait
    assert Ack.read(fields, {"subscriber": "s", "topic": "t", "msgIdx": 7}, True).index == 7


def test_the_first_bad_field_is_named(fields: Fields):
    with pytest.raises(BadRequest, match="'owner'"):
        Register.read(fields, {"topic": 3}, False)
    with pytest.raises(BadRequest, match="'msg' must be a string"):
        Publish.read(fields, {"owner": "o", "topic": "t", "msgs": ["a"]}, False)  # v1: no msgs
    with pytest.raises(BadRequest, match="'msgIdx'"):
        Ack.read(fields, {"subscriber": "s", "topic": "t", "msgIdx": True}, True)


def test_a_call_declares_the_largest_body_it_can_need(fields: Fields):
    small = limits.http_small_body_bytes_max
    for call in ("topic/register", "topic/subscribe", "message/get", "message/ack"):
        assert fields.body_max(call, v2=True) == fields.body_max(call, v2=False) == small
    assert fields.body_max("message/publish", v2=True) == limits.http_body_bytes_max
    one = small + 6 * fields.settings.max_msg_size
    assert fields.body_max("message/publish", v2=False) == min(one, limits.http_body_bytes_max)
