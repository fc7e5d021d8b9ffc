"""A queue's consumer groups in its monitor's state log (monitor/state.py), with the interface of
the ZooKeeper store it replaces (coordination/groupstore.py), so the group manager's group
commits work unchanged (`delivery.state=log`, docs/configuration.md).

    group/<group>           the group's record (JSON: name, ordered, from, prefix, cursors)
    slot/<group>/<slot>     a live slot's record (JSON, monitor/slots.py `Slot.record`)
    ids/<group>/<n>         ids the group's de-duplication window took (monitor/groupids.py):
                            {"ids": [[id hex, exchange, start, part, index, ms], ...]}, deleted
                            once the window is past its newest

A commit is one append of every change since the last, made at once; it is *ready* (its
consumers may be told `Written`) once it is on min.insync.copies copies, as a ZooKeeper multi
was once ZooKeeper answered. Slot versions are the ZooKeeper store's: 0 when created, one more
per write. One writer (this monitor, under its epoch and its host's lease), so no write is
refused for a version: a successor reads the groups back from the log (`load`).
"""

from __future__ import annotations

import json
from typing import Any

from roq.coordination.groupstore import Write
from roq.errors import CoordinationError
from roq.log.statelog import Change, StateLog
from roq.monitor.state import StateKeeper

GROUP_PREFIX = "group/"
SLOT_PREFIX = "slot/"
IDS_PREFIX = "ids/"


def _key(group: str, slot: str = "") -> str:
    return f"{SLOT_PREFIX}{group}/{slot}" if slot else f"{GROUP_PREFIX}{group}"


class LogCommit:
    """One commit's append: ready once the state log's copies hold it."""

    def __init__(self, keeper: StateKeeper, end: int, versions: list[int]):
        self._keeper, self._end, self._versions = keeper, end, versions

    def ready(self) -> bool:
        return self._keeper.committed_to(self._end)

    def wait(self, timeout_s: float) -> bool:
        """Block at most `timeout_s` (the copies' answers are read meanwhile)."""
        return self._keeper.wait_committed(self._end, timeout_s)

    def versions(self) -> list[int]:
        if not self.ready():
            raise CoordinationError("state log: not copied yet")
        return self._versions


class GroupLog:
    """The consumer groups on the state log (main thread only, as the keeper)."""

    def __init__(self, keeper: StateKeeper):
        self.keeper = keeper
        self.stored: set[str] = set()  # as GroupStore's (groups whose record exists)

    @property
    def state(self) -> StateLog:
        return self.keeper.store_state()

    def commit(self, writes: list[Write]) -> LogCommit:
        changes: list[Change] = []
        versions: list[int] = []
        for write in writes:
            key = _key(write.group, write.slot)
            data = None if write.record is None else _dump(write.record)
            changes.append(Change(key, data))
            found = self.state.get(key)
            slot_record = write.record is not None and write.slot
            versions.append(found[1] if slot_record and found else 0 if slot_record else -1)
            if not write.slot and write.record is not None:
                self.stored.add(write.group)
        return LogCommit(self.keeper, self.keeper.store_write(changes), versions)

    def load(self) -> list[tuple[dict[str, Any], list[tuple[dict[str, Any], int]]]]:
        """Every group with its slots' records and versions, as GroupStore.load gives them."""
        state = self.state
        found = []
        for key in state.keys(GROUP_PREFIX):
            name = key.removeprefix(GROUP_PREFIX)
            record = _load(state.get(key))
            slots = []
            for slot_key in state.keys(f"{SLOT_PREFIX}{name}/"):
                entry = state.get(slot_key)
                if entry is not None:
                    slots.append((_load(entry), entry[1] - 1))
            found.append((record, slots))
            self.stored.add(name)
        return found

    def write_ids(
        self, group: str, records: list[tuple[int, list[Any]]], dropped: list[int]
    ) -> None:
        """Append the de-duplication window's new records (number, entries) and delete the
        expired ones, in one append. Not waited for: what a crash loses of it is a duplicate
        the rebuilt window misses, never a message."""
        changes = [Change(f"{IDS_PREFIX}{group}/{n}", _dump({"ids": e})) for n, e in records]
        changes += [Change(f"{IDS_PREFIX}{group}/{n}", None) for n in dropped]
        if changes:
            self.keeper.store_write(changes)

    def load_ids(self, group: str) -> list[tuple[int, list[Any]]]:
        """The group's window records (number, entries), in number order; unreadable ones
        are skipped (the window only misses their duplicates)."""
        found = []
        for key in self.state.keys(f"{IDS_PREFIX}{group}/"):
            try:
                number = int(key.rsplit("/", 1)[1])
                entries = _load(self.state.get(key)).get("ids", [])
            except (ValueError, CoordinationError):
                continue
            if isinstance(entries, list):
                found.append((number, entries))
        return sorted(found, key=lambda item: item[0])

    def delete_group(self, group: str) -> None:
        """The group's record and its slots' go, in one append."""
        keys = [_key(group), *self.state.keys(f"{SLOT_PREFIX}{group}/")]
        keys += self.state.keys(f"{IDS_PREFIX}{group}/")
        self.stored.discard(group)
        self.keeper.store_write([Change(key, None) for key in keys])


def _dump(record: dict[str, Any]) -> bytes:
    return json.dumps(record, separators=(",", ":")).encode()


def _load(entry: tuple[bytes, int] | None) -> dict[str, Any]:
    if entry is None:
        return {}
    try:
        value = json.loads(entry[0].decode() or "{}")
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise CoordinationError(f"unreadable group record: {error}") from None
    if not isinstance(value, dict):
        raise CoordinationError("group record is not a JSON object")
    return value
