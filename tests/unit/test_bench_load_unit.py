"""RoQ's load description (TestLoaderDecription, reference §6) as `roq bench --load` reads it."""

from __future__ import annotations

from typing import Any

import pytest

from roq import limits
from roq.client.bench import LoadDescription
from roq.errors import ConfigError

# RoQ's TestLoadControllerCase, with a payload roq can carry (it needs 12 bytes: the timestamp)
CASE = (
    '{"maxPub":2,"duration":3.0,"throughput":36000,"maxSub":6,"payload":20,"delay":5,"spawnRate":1}'
)


def test_roqs_test_load_controller_case_reads_as_roq_meant_it():
    load = LoadDescription.from_json(CASE, "case.json")
    assert (load.maxPub, load.maxSub, load.payload, load.delay, load.spawnRate) == (2, 6, 20, 5, 1)
    assert load.seconds == 180.0  # duration is in minutes
    assert load.rate == 36000 // (2 * 6)  # RoQ: rate = throughput / (maxPub x maxSub)


def test_a_fractional_duration_is_not_truncated_and_seconds_wins():
    assert LoadDescription.from_json('{"duration": 0.05}', "f").seconds == 3.0
    assert LoadDescription.from_json('{"duration": 1.0, "seconds": 2}', "f").seconds == 2.0


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ('{"maxPub": 2, "payload": 5}', "payload ≥ 12"),
        ('{"maxPubs": 2}', "unknown field 'maxPubs'"),
        ('{"rate": true}', "field 'rate'"),
        ("[1]", "expected a JSON object"),
        ("{", "not JSON"),
    ],
)
def test_a_bad_description_is_refused_naming_the_file_and_field(text, named):
    with pytest.raises(ConfigError, match=r"load\.json") as raised:
        LoadDescription.from_json(text, "load.json")
    assert named in str(raised.value)


class _Got:
    """A subscriber worker's counter as the drain rule reads it."""

    def __init__(self, messages: int, last: float) -> None:
        self.messages, self.last = messages, last


def _told(published: int | None, at: float | None, closed: bool = False) -> Any:
    from roq.client.bench import _Told

    told = _Told.__new__(_Told)  # no stdin reader: the state is set by hand
    told.published, told.at, told.closed = published, at, closed
    return told


def test_a_subscriber_told_the_count_reads_until_it_has_every_message():
    """A subscriber behind the publishers is not stopped by a quiet spell after the run's
    planned end (the bench then counted lag as loss: 1.2 M "lost" of 1.2 M at 20 producers)."""
    end = 100.0
    told = _told(1_000, at=110.0)
    assert not told.drained(_Got(999, last=111.0), end, now=115.0), "short, still arriving"
    assert told.drained(_Got(1_000, last=111.0), end, now=111.0), "has them all"
    stalled = 110.0 + limits.bench_drain_stall_s
    assert not told.drained(_Got(0, last=0.0), end, now=stalled - 0.1)
    assert told.drained(_Got(0, last=0.0), end, now=stalled), "nothing for the stall bound"
    late = 110.0 + limits.bench_drain_max_s
    assert told.drained(_Got(5, last=late - 1), end, now=late), "the drain's bound"


def test_a_subscriber_not_yet_told_waits_for_the_publishers_and_one_run_by_hand_stops_when_quiet():
    end = 100.0
    waiting = _told(None, None)
    assert not waiting.drained(_Got(0, last=0.0), end, now=end + 30)
    bound = end + limits.bench_publishers_grace_s + limits.bench_drain_max_s
    assert waiting.drained(_Got(0, last=0.0), end, now=bound + 0.1)
    by_hand = _told(None, None, closed=True)
    assert not by_hand.drained(_Got(10, last=end - 1), end, now=end - 0.5)
    assert by_hand.drained(_Got(10, last=end), end, now=end + limits.bench_drain_quiet_s)
