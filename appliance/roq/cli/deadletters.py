"""`roq group dlq show|redrive|purge QUEUE GROUP`: a group's dead letters, filtered (issue 33,
item 4).

A dead letter is a message of the group's dead-letter queue `<queue>.<group>.dlq` (a BSON
document: client/consumer.py `_publish_dead`); when it was dead-lettered is that message's
timestamp (its publish to the dead-letter queue). The letters are read from the beginning of
that queue's logs with a subscriber; the group's monitor says which of them are removed
(redriven or purged: monitor/deadletters.py), and those are left out. `show` changes nothing;
`redrive` and `purge` send the chosen letters to the monitor in steps (admin 2023), each stored
in one commit of the group's state (docs/operations.md, "Dead letters").
"""

from __future__ import annotations

import datetime
import itertools
import json
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import typer

from roq import limits
from roq.cli.common import (
    GCM_OPTION,
    ZK_OPTION,
    errors_to_exit,
    fail,
    setup_logging,
    stop_event,
    table,
)
from roq.cli.data import NAMESPACE_OPTION
from roq.cli.work import dead_letter_fields, group_app
from roq.protocol.messages.deadletters import Action, Letter, letter_id

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


def letter(payload: bytes, timestamp_us: int, letter_id: str = "") -> dict[str, Any]:
    """A dead-letter queue message as fields, with `DeadAt`: when it was dead-lettered, and
    `Id`: its id on the dead-letter queue (its publisher and sequence number)."""
    found = {**dead_letter_fields(payload), "DeadAt": timestamp_us / 1e6}
    return {**found, "Id": letter_id} if letter_id else found


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


_LIMIT = typer.Option(None, "--limit", "-n", min=1, help="At most N letters.")
_OLDER = typer.Option(
    None, "--older-than", help="Only letters dead-lettered longer ago than this (90s, 2h, 7d)."
)
_NEWER = typer.Option(
    None, "--newer-than", help="Only letters dead-lettered within this (90s, 15m, 2h, 7d)."
)
_KEY = typer.Option(None, "--key", help="Only letters with this routing key.")
_TIMEOUT = typer.Option(
    2.0, "--timeout", min=0.1, help="Stop reading once no letter came for S seconds."
)
_DRY_RUN = typer.Option(
    False, "--dry-run", help="Print the letters it would change, and change nothing."
)
_STEP = limits.work_dlq_step_max


def _filter(limit: int | None, older: str | None, newer: str | None, key: str | None) -> Filter:
    return Filter(None if older is None else duration_s(older),
                  None if newer is None else duration_s(newer),
                  None if key is None else key.encode(), limit)  # fmt: skip


@dataclass(frozen=True)
class Where:
    """The queue, group and how to reach the cluster."""

    queue: str
    group: str
    gcm: str | None
    zk: str | None
    namespace: str

    def admin(self) -> Any:
        from roq.client.admin import AdminClient

        return AdminClient(gcm=self.gcm, zk=self.zk, namespace=self.namespace)


def _letters(where: Where, wanted: Filter, timeout: float, command: str) -> list[dict[str, Any]]:
    """The group's dead letters that `wanted` keeps, oldest first, without the removed ones."""
    with where.admin() as admin:
        queue = admin.get_group(where.queue, where.group).dead_letter_queue
        if not admin.queue_exists(queue):
            typer.echo(f"roq group dlq {command}: {where.queue}/{where.group} has no dead "
                       f"letters ({queue})", err=True)  # fmt: skip
            return []
        read = _read_all(where, queue, timeout)
        removed = _removed(admin, where, [f["Id"] for f in read])
    kept = (f for f in read if f["Id"] not in removed)
    return list(select(kept, wanted, time.time()))


def _read_all(where: Where, queue: str, timeout: float) -> list[dict[str, Any]]:
    from roq.client.subscriber import Subscriber

    stop = stop_event()
    with Subscriber(queue, gcm=where.gcm, zk=where.zk, namespace=where.namespace,
                    start="beginning") as subscriber:  # fmt: skip
        return [letter(r.payload, r.timestamp_us, letter_id(r.producer_id, r.key, r.seq))
                for r in _read(subscriber, timeout, stop)]  # fmt: skip


def _removed(admin: Any, where: Where, ids: list[str]) -> set[str]:
    """Which of `ids` the group's monitor says are removed (redriven or purged)."""
    removed: set[str] = set()
    for at in range(0, len(ids), _STEP):
        step = [Letter(i) for i in ids[at : at + _STEP]]
        removed.update(admin.dead_letters(where.queue, where.group, Action.CHECK, step).removed)
    return removed


@dlq_app.command("show")
def show(
    queue: str = typer.Argument(...),
    group: str = typer.Argument(...),
    limit: int | None = _LIMIT,
    older_than: str | None = _OLDER,
    newer_than: str | None = _NEWER,
    key: str | None = _KEY,
    as_json: bool = typer.Option(
        False, "--json", help="One JSON object per line, every field (payload text, else base64)."
    ),
    timeout: float = _TIMEOUT,
    gcm: str = GCM_OPTION,
    zk: str | None = ZK_OPTION,
    namespace: str = NAMESPACE_OPTION,
) -> None:
    """The group's dead letters, oldest first: when each was dead-lettered (UTC), after how
    many deliveries, its key, why, and its payload. Redriven and purged letters are not shown."""
    setup_logging("WARNING")
    with errors_to_exit():
        wanted = _filter(limit, older_than, newer_than, key)
        where = Where(queue, group, None if zk else gcm, zk, namespace)
        _print(_letters(where, wanted, timeout, "show"), as_json)


def _print(chosen: list[dict[str, Any]], as_json: bool) -> None:
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


# --- redrive and purge ------------------------------------------------------------------------
@dataclass
class Summary:
    """What a redrive or purge did: `done` now, `already` removed (a run again), `merged`
    (a second letter of one message: delivered once), and `skipped`, by why."""

    done: int = 0
    already: int = 0
    merged: int = 0
    skipped: dict[str, int] = field(default_factory=dict)

    def line(self, action: Action) -> str:
        verb = "redriven" if action == Action.REDRIVE else "purged"
        why = ", ".join(f"{n} {reason}" for reason, n in sorted(self.skipped.items()))
        return (f"{verb} {self.done}, already removed {self.already}, merged {self.merged}, "
                f"skipped {sum(self.skipped.values())}" + (f" ({why})" if why else ""))  # fmt: skip


def source(fields: dict[str, Any]) -> Letter | str:
    """The letter to redrive (its message's place in the source log), or why it cannot be."""
    if "Error" in fields:
        return "not a dead letter"
    exchange, offset, record = fields.get("Exchange"), fields.get("Offset"), fields.get("Record")
    if not isinstance(exchange, str) or not exchange:
        return "no source exchange"
    if not isinstance(offset, int) or not isinstance(record, int) or offset < 0 or record < 0:
        return "no source position"
    return Letter(str(fields["Id"]), exchange, offset, record)


def plan(chosen: list[dict[str, Any]], action: Action) -> tuple[list[Letter], Summary]:
    """The letters to send, and those skipped (with why): a purge takes every letter."""
    summary, letters = Summary(), []
    for fields in chosen:
        found = source(fields) if action == Action.REDRIVE else Letter(str(fields["Id"]))
        if isinstance(found, str):
            summary.skipped[found] = summary.skipped.get(found, 0) + 1
        else:
            letters.append(found)
    return letters, summary


def run_steps(where: Where, action: Action, letters: list[Letter], summary: Summary) -> Summary:
    """Each step of at most work_dlq_step_max letters, in order; progress on stderr."""
    with where.admin() as admin:
        for at in range(0, len(letters), _STEP):
            done = _step(admin, where, action, letters[at : at + _STEP])
            summary.done += done.done
            summary.already += done.already
            summary.merged += done.merged
            if len(letters) > _STEP:
                typer.echo(f"roq group dlq {action}: {min(at + _STEP, len(letters))}/"
                           f"{len(letters)} letters", err=True)  # fmt: skip
    return summary


def _step(admin: Any, where: Where, action: Action, step: list[Letter]) -> Any:
    """One step, asked again while the monitor is busy (restarting, storing), within a bound:
    a step stored before its answer was lost counts as `Already` the second time."""
    from roq.client.admin import AdminRefused
    from roq.protocol.commands import Reason

    deadline = time.monotonic() + limits.work_dlq_busy_retry_s
    for attempt in itertools.count():
        try:
            return admin.dead_letters(where.queue, where.group, action, step)
        except AdminRefused as refused:
            if refused.reason != Reason.BUSY or time.monotonic() > deadline:
                raise
            if attempt == 0:
                typer.echo(f"roq group dlq {action}: {refused}; asking again", err=True)
            time.sleep(0.5)  # the monitor restarts or stores: ask again
    raise AssertionError("unreachable")


def _change(action: Action, where: Where, wanted: Filter, timeout: float, dry_run: bool) -> None:
    letters, summary = plan(_letters(where, wanted, timeout, str(action)), action)
    if dry_run:
        for one in letters:
            typer.echo(json.dumps({"Id": one.id, "Exchange": one.exchange, "Offset": one.offset,
                                   "Record": one.record}))  # fmt: skip
        verb = "redriven" if action == Action.REDRIVE else "purged"
        typer.echo(f"dry run: {len(letters)} letters would be {verb}; "
                   f"{summary.line(action).split(', ', 1)[1]}")  # fmt: skip
        return
    typer.echo(run_steps(where, action, letters, summary).line(action))


@dlq_app.command("redrive")
def redrive(
    queue: str = typer.Argument(...),
    group: str = typer.Argument(...),
    limit: int | None = _LIMIT,
    older_than: str | None = _OLDER,
    newer_than: str | None = _NEWER,
    key: str | None = _KEY,
    dry_run: bool = _DRY_RUN,
    timeout: float = _TIMEOUT,
    gcm: str = GCM_OPTION,
    zk: str | None = ZK_OPTION,
    namespace: str = NAMESPACE_OPTION,
) -> None:
    """Deliver the chosen dead letters to the group again (their delivery count starts again at
    0) and remove them from its dead letters, in steps of at most 200 letters, each stored at
    once. Run again after a failure, it redrives what is left. Needs admin on the queue and
    subscribe on its dead-letter queue. Exit 0 done (the last line: how many redriven, skipped
    and why), 1 refused, 2 bad usage, 69 the GCM unreachable, 75 the monitor stayed busy."""
    _command(Action.REDRIVE, Where(queue, group, None if zk else gcm, zk, namespace),
             _filter(limit, older_than, newer_than, key), timeout, dry_run)  # fmt: skip


@dlq_app.command("purge")
def purge(
    queue: str = typer.Argument(...),
    group: str = typer.Argument(...),
    limit: int | None = _LIMIT,
    older_than: str | None = _OLDER,
    newer_than: str | None = _NEWER,
    key: str | None = _KEY,
    dry_run: bool = _DRY_RUN,
    timeout: float = _TIMEOUT,
    gcm: str = GCM_OPTION,
    zk: str | None = ZK_OPTION,
    namespace: str = NAMESPACE_OPTION,
) -> None:
    """Remove the chosen dead letters from the group's dead letters for good (no longer shown,
    redriven or counted), in steps of at most 200, each stored at once. Needs admin on the queue
    and subscribe on its dead-letter queue. Exit codes as `redrive`."""
    _command(Action.PURGE, Where(queue, group, None if zk else gcm, zk, namespace),
             _filter(limit, older_than, newer_than, key), timeout, dry_run)  # fmt: skip


def _command(action: Action, where: Where, wanted: Filter, timeout: float, dry_run: bool) -> None:
    from roq.client.admin import AdminRefused
    from roq.protocol.commands import Reason

    setup_logging("WARNING")
    with errors_to_exit():
        try:
            _change(action, where, wanted, timeout, dry_run)
        except AdminRefused as refused:  # say which group it was for (2021 does not)
            busy = refused.reason == Reason.BUSY
            why = f"group dlq {action} {where.queue}/{where.group}: {refused}"
            raise fail(why + (" (run it again)" if busy else ""), 75 if busy else 1) from None
