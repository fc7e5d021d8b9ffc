"""`roq group dlq show QUEUE GROUP`: a group's dead letters, filtered (issue 33, item 4).

A dead letter is a message of the group's dead-letter queue `<queue>.<group>.dlq` (a BSON
document: client/consumer.py `_publish_dead`); when it was dead-lettered is that message's
timestamp (its publish to the dead-letter queue). The letters are read from the beginning of
that queue's logs with a subscriber, so `show` changes nothing. Redrive and purge are not built
(docs/operations.md, "Dead letters").
"""

from __future__ import annotations

import datetime
import json
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import typer

from roq.cli.common import GCM_OPTION, ZK_OPTION, errors_to_exit, setup_logging, stop_event, table
from roq.cli.data import NAMESPACE_OPTION
from roq.cli.work import dead_letter_fields, group_app

dlq_app = typer.Typer(help="A consumer group's dead letters.", no_args_is_help=True)
group_app.add_typer(dlq_app, name="dlq")

_UNITS = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
_DURATION = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([smhd]?)\s*$")
_PAYLOAD_SHOWN = 40  # characters of a payload in the table (all of it with --json)


def duration_s(text: str) -> float:
    """`90`, `90s`, `15m`, `2h`, `7d` as seconds; anything else is a ValueError naming it."""
    found = _DURATION.match(text)
    if found is None:
        raise ValueError(f"{text!r} is no duration (a number with s, m, h or d: 90s, 15m, 2h)")
    return float(found.group(1)) * _UNITS[found.group(2)]


@dataclass(frozen=True)
class Filter:
    """Which letters to show: older / newer than so many seconds (dead-lettered then), with
    routing key `key` (None: any), at most `limit` of them (None: all)."""

    older_than_s: float | None = None
    newer_than_s: float | None = None
    key: bytes | None = None
    limit: int | None = None

    def matches(self, fields: dict[str, Any], now: float) -> bool:
        age = now - float(fields.get("DeadAt", now))
        if self.older_than_s is not None and age < self.older_than_s:
            return False
        if self.newer_than_s is not None and age > self.newer_than_s:
            return False
        return self.key is None or _key(fields) == self.key


def _key(fields: dict[str, Any]) -> bytes:
    """The letter's routing key as bytes (dead_letter_fields gives text, or base64)."""
    if "KeyBase64" in fields:
        import base64

        return base64.b64decode(str(fields["KeyBase64"]))
    return str(fields.get("Key", "")).encode()


def letter(payload: bytes, timestamp_us: int) -> dict[str, Any]:
    """A dead-letter queue message as fields, with `DeadAt`: when it was dead-lettered."""
    return {**dead_letter_fields(payload), "DeadAt": timestamp_us / 1e6}


def select(
    letters: Iterable[dict[str, Any]], wanted: Filter, now: float
) -> Iterator[dict[str, Any]]:
    """The letters `wanted` keeps, oldest first as they come, at most its limit."""
    shown = 0
    for fields in letters:
        if wanted.limit is not None and shown >= wanted.limit:
            return
        if wanted.matches(fields, now):
            shown += 1
            yield fields


def row(fields: dict[str, Any]) -> tuple[object, ...]:
    """WHEN (UTC), ATTEMPTS, KEY, REASON, PAYLOAD (cut): one letter in the table."""
    when = datetime.datetime.fromtimestamp(float(fields.get("DeadAt", 0)), datetime.UTC)
    payload = str(fields.get("Payload", f"<{fields.get('PayloadBase64', '')[:16]}… base64>"))
    if len(payload) > _PAYLOAD_SHOWN:
        payload = payload[: _PAYLOAD_SHOWN - 1] + "…"
    return (when.strftime("%Y-%m-%d %H:%M:%S"), fields.get("Deliveries", "?"),
            fields.get("Key", fields.get("KeyBase64", "")), fields.get("Reason", ""),
            payload)  # fmt: skip


@dlq_app.command("show")
def show(
    queue: str = typer.Argument(...),
    group: str = typer.Argument(...),
    limit: int | None = typer.Option(None, "--limit", "-n", min=1, help="At most N letters."),
    older_than: str | None = typer.Option(
        None, "--older-than", help="Only letters dead-lettered longer ago than this (90s, 2h, 7d)."
    ),
    newer_than: str | None = typer.Option(
        None, "--newer-than", help="Only letters dead-lettered within this (90s, 15m, 2h, 7d)."
    ),
    key: str | None = typer.Option(None, "--key", help="Only letters with this routing key."),
    as_json: bool = typer.Option(
        False, "--json", help="One JSON object per line, every field (payload text, else base64)."
    ),
    timeout: float = typer.Option(
        2.0, "--timeout", min=0.1, help="Stop once no letter came for S seconds."
    ),
    gcm: str = GCM_OPTION,
    zk: str | None = ZK_OPTION,
    namespace: str = NAMESPACE_OPTION,
) -> None:
    """The group's dead letters, oldest first: when each was dead-lettered (UTC), after how
    many deliveries, its key, why, and its payload."""
    setup_logging("WARNING")
    with errors_to_exit():
        wanted = Filter(
            None if older_than is None else duration_s(older_than),
            None if newer_than is None else duration_s(newer_than),
            None if key is None else key.encode(), limit,
        )  # fmt: skip
        from roq.client.admin import AdminClient
        from roq.client.subscriber import Subscriber

        with AdminClient(gcm=None if zk else gcm, zk=zk, namespace=namespace) as admin:
            letters = admin.get_group(queue, group).dead_letter_queue
            exists = admin.queue_exists(letters)
        if not exists:
            typer.echo(f"roq group dlq show: {queue}/{group} has no dead letters ({letters})",
                       err=True)  # fmt: skip
            return
        stop = stop_event()
        with Subscriber(
            letters, gcm=None if zk else gcm, zk=zk, namespace=namespace, start="beginning"
        ) as subscriber:
            read = _read(subscriber, timeout, stop)
            chosen = select((letter(r.payload, r.timestamp_us) for r in read), wanted, time.time())
            if as_json:
                for fields in chosen:
                    typer.echo(json.dumps(fields))
                return
            columns = ("WHEN (UTC)", "ATTEMPTS", "KEY", "REASON", "PAYLOAD")
            typer.echo(table(columns, [row(f) for f in chosen], right=("ATTEMPTS",)))


def _read(subscriber: Any, timeout: float, stop: Any) -> Iterator[Any]:
    """Every record of the dead-letter queue, until none came for `timeout` seconds."""
    while not stop.is_set():
        batch = list(subscriber.messages(None, timeout))
        if not batch:
            return
        yield from batch
