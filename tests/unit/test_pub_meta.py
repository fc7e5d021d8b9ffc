"""`roq pub`'s meta options (cli/pubmeta.py) and the message id as text (log/metatext.py): what
each accepts, and a refusal that names the option and exits 65 (BadInput) for the rest."""

from __future__ import annotations

import uuid

import pytest

from roq import limits
from roq.cli.pubmeta import PubMeta, duration_ms, header
from roq.errors import EXIT_DATAERR, BadInput
from roq.log.metatext import after_ms, message_id_from_text, message_id_text

ID = "0123456789abcdef0123456789ABCDEF"


def test_a_message_id_is_32_hex_digits_or_a_uuid() -> None:
    assert message_id_from_text(ID) == bytes.fromhex(ID)
    drawn = uuid.uuid4()
    assert message_id_from_text(str(drawn)) == drawn.bytes
    assert message_id_from_text(str(drawn).upper()) == drawn.bytes
    assert message_id_text(drawn.bytes) == drawn.hex


@pytest.mark.parametrize(
    "text",
    ["", ID[:-1], ID + "0", "g" * 32, "{" + str(uuid.UUID(int=1)) + "}",
     "urn:uuid:" + str(uuid.UUID(int=1)), " " + ID, "0123-4567"],
)  # fmt: skip
def test_anything_else_is_no_message_id(text: str) -> None:
    with pytest.raises(ValueError, match="is not a message id: 32 hex digits or a UUID"):
        message_id_from_text(text)


def test_after_ms_is_microseconds_from_now() -> None:
    assert after_ms(1500, now=1_000_000) == 2_500_000


@pytest.mark.parametrize(
    ("text", "ms"),
    [("500ms", 500), ("30s", 30_000), ("5m", 300_000), ("1.5h", 5_400_000), ("2d", 172_800_000),
     (" 1s ", 1000), ("365d", limits.message_ttl_ms_max)],
)  # fmt: skip
def test_a_duration_is_a_number_and_a_unit(text: str, ms: int) -> None:
    assert duration_ms(text, "--ttl", limits.message_ttl_ms_max) == ms


@pytest.mark.parametrize("text", ["30", "s", "1 s", "-1s", "1e3s", "5min", "1h30m", "0.1ms"])
def test_a_bare_number_or_another_unit_is_refused_naming_the_option(text: str) -> None:
    with pytest.raises(BadInput, match=r"--ttl .*(expected a number and a unit|from 1ms)"):
        duration_ms(text, "--ttl", limits.message_ttl_ms_max)


def test_a_duration_past_a_year_or_of_nothing_is_refused() -> None:
    for text in ("366d", "0s", "0ms"):
        with pytest.raises(BadInput, match=r"--delay .*from 1ms to 365d"):
            duration_ms(text, "--delay", limits.message_delay_ms_max)


def test_a_header_is_name_equals_value() -> None:
    assert header("a=b") == ("a", "b")
    assert header("a=") == ("a", "")
    assert header("url=x?y=1") == ("url", "x?y=1")
    for bad in ("a", "=b", ""):
        with pytest.raises(BadInput, match=r"--header .*expected NAME=VALUE"):
            header(bad)


def test_pub_meta_is_read_once_and_gives_each_message_its_times() -> None:
    meta = PubMeta.read(["a=b", "a=c"], ID, "1h", "1s")
    args = meta.send_args()
    assert args["headers"] == (("a", "b"), ("a", "c"))
    assert args["message_id"] == bytes.fromhex(ID)
    assert args["expires_at_us"] - args["not_before_us"] == (3600 - 1) * 1_000_000
    auto = PubMeta.read([], "auto", None, None)
    assert auto.send_args()["message_id"] != auto.send_args()["message_id"]  # one per message
    assert PubMeta.read([], None, None, None).send_args() == {}  # no meta: a v1 record


def test_pub_meta_refusals_name_their_option_and_exit_65() -> None:
    too_many = [f"h{n}=v" for n in range(limits.record_headers_max + 1)]
    for args, option in [
        ((too_many, None, None, None), "--header: 33 headers"),
        ((["x=" + "v" * limits.record_headers_bytes_max], None, None, None), "--header: headers"),
        (([], "nope", None, None), "--id: 'nope' is not a message id"),
        (([], None, "30", None), "--ttl '30'"),
        (([], None, None, "soon"), "--delay 'soon'"),
        (([], None, "1s", "1s"), "--delay 1s is not shorter than --ttl 1s"),
    ]:
        with pytest.raises(BadInput, match=option) as refused:
            PubMeta.read(*args)
        assert refused.value.exit_code == EXIT_DATAERR == 65
