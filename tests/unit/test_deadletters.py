"""`roq group dlq show`'s letters and filters (cli/deadletters.py), pure: a dead letter's fields
with when it was dead-lettered, the duration syntax, and the filters by age, key and count."""

from __future__ import annotations

import bson
import pytest

from roq.cli.deadletters import Filter, duration_s, letter, row, select

NOW = 1_800_000_000.0


def _letter(key: bytes, age_s: float, payload: bytes = b"p") -> dict[str, object]:
    document = {"Queue": "q1", "Group": "g", "Deliveries": 5, "Reason": "boom", "Key": key,
                "Payload": payload}  # fmt: skip
    return letter(bson.encode(document), int((NOW - age_s) * 1e6))


def test_durations_are_seconds_minutes_hours_days_and_anything_else_is_named():
    assert [duration_s(t) for t in ("90", "90s", "1.5m", "2h", "7d")] == [
        90.0, 90.0, 90.0, 7200.0, 604800.0
    ]  # fmt: skip
    for bad in ("", "m", "-5s", "2w", "1h30m"):
        with pytest.raises(ValueError, match="no duration"):
            duration_s(bad)


def test_a_letter_says_when_it_was_dead_lettered_and_keeps_a_binary_key_as_base64():
    fields = _letter(b"\xff\x00", 60.0)
    assert fields["DeadAt"] == pytest.approx(NOW - 60.0)
    assert fields["KeyBase64"] == "/wA=" and fields["Deliveries"] == 5
    when, attempts, key, reason, payload = row(fields)
    assert (attempts, key, reason, payload) == (5, "/wA=", "boom", "p")
    assert str(when).startswith("2027-01-15")


def test_filters_by_age_key_and_limit_keep_the_oldest_first():
    letters = [_letter(b"a", 3600), _letter(b"b", 1800), _letter(b"a", 60), _letter(b"a", 10)]
    ages = lambda wanted: [round(NOW - f["DeadAt"]) for f in select(letters, wanted, NOW)]  # noqa: E731
    assert ages(Filter()) == [3600, 1800, 60, 10]
    assert ages(Filter(older_than_s=120)) == [3600, 1800]
    assert ages(Filter(newer_than_s=120)) == [60, 10]
    assert ages(Filter(key=b"a")) == [3600, 60, 10]
    assert ages(Filter(key=b"a", newer_than_s=3000, limit=1)) == [60]
    assert ages(Filter(older_than_s=10_000)) == []


def test_a_message_that_is_no_dead_letter_is_shown_as_such_not_a_crash():
    fields = letter(b"not bson", 0)
    assert "not a dead letter" in str(fields["Error"])
    assert row(fields)[1] == "?"
