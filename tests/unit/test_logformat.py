"""log.format=json (issue 32): one JSON object per line, with the process's fields."""

from __future__ import annotations

import io
import json
import logging
from collections.abc import Iterator

import pytest

from roq.cli.logformat import JsonFormatter, use_log_format


@pytest.fixture
def stream() -> Iterator[io.StringIO]:
    out = io.StringIO()
    handler = logging.StreamHandler(out)
    root = logging.getLogger()
    saved = root.handlers[:]
    root.handlers = [handler]
    yield out
    root.handlers = saved
    logging.captureWarnings(False)


def _lines(out: io.StringIO) -> list[dict[str, object]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_each_record_is_one_object_with_the_process_fields(stream: io.StringIO) -> None:
    use_log_format("json", "exchange", host="h1", queue="q1", exchange="q1-x0")
    logging.getLogger("roq.exchange.service").warning("line %d\nand a second %s", 1, b"\x00")
    (line,) = _lines(stream)
    assert line["message"] == "line 1\nand a second b'\\x00'"
    assert line["level"] == "WARNING" and line["logger"] == "roq.exchange.service"
    assert (line["process"], line["host"], line["queue"], line["exchange"]) == (
        "exchange", "h1", "q1", "q1-x0",
    )  # fmt: skip
    assert str(line["time"]).endswith("Z") and isinstance(line["pid"], int)


def test_a_records_extra_fields_win_and_tracebacks_stay_inside(stream: io.StringIO) -> None:
    use_log_format("json", "gcm", host="")
    try:
        raise ValueError("bad")
    except ValueError:
        logging.getLogger("roq.gcm").exception("failed", extra={"queue": "q7"})
    (line,) = _lines(stream)
    assert line["queue"] == "q7" and "host" not in line  # an empty field is left out
    assert "ValueError: bad" in str(line["exception"])


def test_text_stays_text(stream: io.StringIO) -> None:
    logging.getLogger().handlers[0].setFormatter(logging.Formatter("%(message)s"))
    use_log_format("text", "host", host="h1")
    logging.getLogger("roq").warning("plain")
    assert stream.getvalue() == "plain\n"


def test_an_argument_json_cannot_encode_does_not_lose_the_line() -> None:
    record = logging.LogRecord("roq", logging.INFO, __file__, 1, "%s", (object(),), None)
    record.queue = {"not": "json-able", "set": {1}}  # a field's value too
    assert json.loads(JsonFormatter({"process": "host"}).format(record))["process"] == "host"
