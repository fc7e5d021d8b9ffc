"""`log.format=json`: one JSON object per log line, for a log shipper (docs/operations.md).

Each object has `time` (UTC, ISO 8601 with milliseconds), `level`, `logger`, `message`, `process`
(the daemon's mode: gcm, host, monitor, exchange, http, up) and `pid`, then what the process knows
of itself (`host`, `queue`, `exchange`) and what a record brings (`extra={"queue": …}`), and
`exception` with the traceback when there is one. A record's own fields win over the process's.
"""

from __future__ import annotations

import datetime
import json
import logging

# Record attributes a call may set with extra=…, copied into the object when present.
RECORD_FIELDS = ("queue", "exchange", "host", "group")


class JsonFormatter(logging.Formatter):
    def __init__(self, fields: dict[str, str]) -> None:
        super().__init__()
        self.fields = {name: value for name, value in fields.items() if value}

    def format(self, record: logging.LogRecord) -> str:
        when = datetime.datetime.fromtimestamp(record.created, datetime.UTC)
        line: dict[str, object] = {
            "time": when.isoformat(timespec="milliseconds").replace("+00:00", "Z"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
            "pid": record.process,
            **self.fields,
        }
        for name in RECORD_FIELDS:
            value = record.__dict__.get(name)
            if value is not None:
                line[name] = value
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        # default=str: an argument json cannot encode (a path, bytes) must not lose the line
        return json.dumps(line, ensure_ascii=False, default=str)


def use_log_format(form: str, process: str, **fields: str) -> None:
    """Switch this process's log lines to `form` (text | json, the key log.format), naming the
    process and what it serves in every JSON object. Text stays as `setup_logging` made it."""
    if form != "json":
        return
    formatter = JsonFormatter({"process": process, **fields})
    for handler in logging.getLogger().handlers:
        handler.setFormatter(formatter)
    logging.captureWarnings(True)  # a Python warning, too, as an object rather than raw text
