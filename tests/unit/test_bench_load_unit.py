"""RoQ's load description (TestLoaderDecription, reference §6) as `roq bench --load` reads it."""

from __future__ import annotations

import pytest

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
