"""Message meta at the HTTP gateway: a v2 publish's `headers`, `id`, `ttl` and `delay` read into
each message's meta (api.py), carried in the gateway's record (records.py), kept by its index
(index.py) and answered by a v2 get (`meta_fields`); v1 reads none of it."""

from __future__ import annotations

import pytest

from roq import config, limits
from roq.http import records
from roq.http.api import BadRequest, Fields, Publish, meta_fields
from roq.http.index import TopicIndex
from roq.log.format import decode_meta, encode_meta
from roq.log.metatext import now_us

ID = "7d444840-9dc0-11d1-b245-5ffdce74fad2"


@pytest.fixture
def fields() -> Fields:
    return Fields(config.HttpSettings.from_settings(config.load_hcm(None)))


def _publish(fields: Fields, v2: bool = True, **body: object) -> Publish:
    return Publish.read(fields, {"owner": "o", "topic": "t", **body}, v2)


def test_a_publish_without_meta_has_none(fields: Fields) -> None:
    assert _publish(fields, msgs=["a", "b"]).metas == ()
    assert _publish(fields, msg="a").metas == ()


def test_meta_fields_beside_msg_are_the_messages(fields: Fields) -> None:
    before = now_us()
    published = _publish(fields, msg="a", headers={"k": "v"}, id=ID, ttl=60_000, delay=1_000)
    (raw,) = published.metas
    meta = decode_meta(raw)
    assert meta.headers == (("k", b"v"),)
    assert meta.message_id == bytes.fromhex(ID.replace("-", ""))
    assert meta.expires_at_us is not None and meta.not_before_us is not None
    assert before + 60_000_000 <= meta.expires_at_us <= now_us() + 60_000_000
    assert meta.expires_at_us - meta.not_before_us == 59_000_000


def test_a_message_object_overrides_the_bodys_fields_one_by_one(fields: Fields) -> None:
    published = _publish(
        fields, headers={"k": "v"}, ttl=5_000,
        msgs=["plain", {"msg": "own", "headers": {"x": "y"}, "id": "ab" * 16}, {"msg": "ttl"}],
    )  # fmt: skip
    assert published.messages == [b"plain", b"own", b"ttl"]
    first, second, third = (decode_meta(raw) for raw in published.metas)
    assert first.headers == third.headers == (("k", b"v"),)
    assert second.headers == (("x", b"y"),) and second.message_id == b"\xab" * 16
    assert first.expires_at_us is not None and first.message_id is None


def test_v1_reads_no_meta(fields: Fields) -> None:
    assert _publish(fields, v2=False, msg="a", headers={"k": "v"}, ttl=1).metas == ()


@pytest.mark.parametrize(
    ("body", "named"),
    [
        ({"msg": "a", "ttl": 0}, "'ttl' must be a whole number of milliseconds"),
        ({"msg": "a", "ttl": 1.5}, "'ttl' must be a whole number"),
        ({"msg": "a", "ttl": True}, "'ttl' must be"),
        ({"msg": "a", "ttl": limits.message_ttl_ms_max + 1}, "'ttl' must be"),
        ({"msg": "a", "delay": "5"}, "'delay' must be a whole number"),
        ({"msg": "a", "ttl": 10, "delay": 10}, "'delay' \\(10 ms\\) is not shorter than 'ttl'"),
        ({"msg": "a", "id": "xyz"}, "'id': 'xyz' is not a message id"),
        ({"msg": "a", "id": 7}, "'id' must be a string"),
        ({"msg": "a", "headers": ["k"]}, "'headers' must be an object of strings"),
        ({"msg": "a", "headers": {"k": 1}}, "'headers' must be an object of strings"),
        ({"msg": "a", "headers": {"": "v"}}, "'headers': header name '' must have 1 to 255"),
        ({"msg": "a", "headers": {"k": "\ud800"}}, "'headers'"),
        ({"msg": "a", "headers": {f"h{n}": "" for n in range(33)}}, "'headers': 33 headers"),
        ({"msg": "a", "headers": {"k": "v" * 8192}}, "'headers': headers of 8193 bytes"),
        ({"msgs": ["a", {"msg": "b", "ttl": -1}]}, "'msgs\\[1\\].ttl' must be"),
        ({"msgs": [{"msg": "b", "headers": {"k": 2}}]}, "'msgs\\[0\\].headers'"),
        ({"msgs": [{"msg": 3}]}, "'msgs\\[0\\].msg' must be a string"),
        ({"msgs": ["a", "b"], "id": ID}, "'id' names one message"),
    ],
)
def test_a_meta_field_out_of_bounds_is_a_400_naming_it(
    fields: Fields, body: dict[str, object], named: str
) -> None:
    with pytest.raises(BadRequest, match=named) as refused:
        _publish(fields, **body)
    assert refused.value.status == 400


def test_a_single_message_batch_may_carry_the_bodys_id(fields: Fields) -> None:
    (raw,) = _publish(fields, msgs=["a"], id=ID).metas
    assert decode_meta(raw).message_id is not None


def test_a_record_without_meta_is_written_as_before_and_one_with_meta_carries_it() -> None:
    plain = records.encode(b"news", 7, b"hello")
    assert plain == b"\x01" + (7).to_bytes(8, "big") + b"\x00\x04news" + b"hello"
    assert records.decode(plain) == ("news", 7, "hello", b"")
    meta = encode_meta({"k": "v"}, None, 10, 5)
    assert records.decode(records.encode(b"news", 8, b"hi", meta)) == ("news", 8, "hi", meta)


def test_a_record_with_unsound_meta_or_cut_short_is_not_the_gateways() -> None:
    good = records.encode(b"news", 8, b"hi", encode_meta({"k": "v"}))
    assert records.decode(good[: records.HEADER_META.size]) is None
    assert records.decode(b"\x02" + good[1:12]) is None  # its meta length cut off
    unsound = records.encode(b"news", 8, b"hi", b"\x40")  # an unknown meta flag
    assert records.decode(unsound) is None


def test_the_index_withholds_an_expired_message_once_keeping_its_place() -> None:
    index = TopicIndex(3, 1 << 20)
    meta = encode_meta(None, None, 1, None)
    index.add([("t", 1, "gone", "x1", 0, meta), ("t", 2, "kept", "x1", 0, b"")])
    assert index.withhold("t", 1) and not index.withhold("t", 1)
    assert index.lookup("t", 1) == (None, "x1", 0, meta)
    assert index.lookup("t", 2) == ("kept", "x1", 0, b"")
    assert not index.withhold("t", 9)


def test_a_get_answers_only_the_meta_a_message_has() -> None:
    assert meta_fields(None) == {}
    assert meta_fields(decode_meta(encode_meta(None, None, None, 1_700_000_000_123_456))) == {
        "notBefore": 1_700_000_000_123
    }
    full = decode_meta(encode_meta({"k": "v", "b": b"\xff"}, b"\x01" * 16, 2_000_999, None))
    assert meta_fields(full) == {
        "headers": {"k": "v", "b": "\ufffd"}, "id": "01" * 16, "expiresAt": 2_000,
    }  # fmt: skip


def test_the_largest_message_with_the_largest_meta_and_name_is_one_message() -> None:
    from roq.config.keys import HCM_KEYS
    from roq.log.format import META_BYTES_MAX

    largest = {key.name: key.bounds[1] for key in HCM_KEYS if key.bounds is not None}
    payload = records.HEADER_META.size + 4 * largest["maxNameLen"] + META_BYTES_MAX
    assert payload + largest["maxMsgSize"] <= limits.message_bytes_max
