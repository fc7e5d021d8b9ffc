"""Redrive and purge of a group's dead letters (`roq group dlq redrive|purge`): pure, no sockets.

A dead letter is a message of the group's dead-letter queue; the group's delivery state (this
monitor's) says which letters are *removed*: redriven or purged. `show`, `redrive` and `purge`
skip removed letters, so the dead-letter queue keeps its records (its retention deletes them)
and the group's state alone says what is left in it.

A redriven letter becomes a one-message slot of its source log: the range starting at its
batch's offset, restricted to its record (`first`, `last`, as a split slot), with no delivery
counted (the attempt count starts again at 0), and `letter` set. Its creation and the letter's
removal are one record of the group's store written in the same commit (groups.py collects a
step's writes before any other), so after a crash either both are stored or neither: a step run
again finds its letters removed (`Already`) or not (done now). Letters whose message was
deleted by the source log's retention are found when a consumer reads the slot (no record at
the letter's position): the letter is put back (a `restored` step), never lost.
"""

from __future__ import annotations

from typing import Any

from roq import limits
from roq.monitor.slots import Group, Slot
from roq.protocol.messages.deadletters import Action, DeadLetters, DeadLettersDone, Letter

CHUNK_PREFIX = "dlq~"  # a step record's id among the group's slot records


class Refusal(Exception):
    """The step breaks a rule of the group (nothing of it applied)."""


def is_chunk(data: dict[str, Any]) -> bool:
    return isinstance(data.get("dlq"), dict)


def record_id(data: dict[str, Any]) -> str:
    return str(data.get("id", ""))


def restore(group: Group, chunks: list[dict[str, Any]]) -> None:
    """The removed letters after a restart: every step record, in the order they were made."""
    for data in sorted(chunks, key=lambda d: int(d.get("n", 0))):
        step = data["dlq"]
        group.removed |= {str(i) for i in step.get("removed", [])}
        group.removed -= {str(i) for i in step.get("restored", [])}
        group.chunks = max(group.chunks, int(data.get("n", 0)))


def _note(group: Group, removed: list[str], restored: list[str]) -> None:
    group.chunks += 1
    chunk = f"{CHUNK_PREFIX}{group.chunks}"
    record = {"id": chunk, "n": group.chunks, "dlq": {"removed": removed, "restored": restored}}
    group.chunks_out.append((chunk, record))


def apply(group: Group, ask: DeadLetters) -> DeadLettersDone:
    """One step: check, or redrive or purge the letters not removed yet (Refusal: none)."""
    if ask.action == Action.CHECK:
        return DeadLettersDone(removed=tuple(x.id for x in ask.letters if x.id in group.removed))
    fresh = list({x.id: x for x in ask.letters if x.id not in group.removed}.values())
    _check(group, ask.action, fresh)
    merged = 0
    if ask.action == Action.REDRIVE:
        merged = sum(not _redrive(group, x) for x in fresh)
    if fresh:
        group.removed.update(x.id for x in fresh)
        _note(group, [x.id for x in fresh], [])
    return DeadLettersDone(len(fresh) - merged, len(ask.letters) - len(fresh), merged)


def _check(group: Group, action: Action, fresh: list[Letter]) -> None:
    if len(group.removed) + len(fresh) > limits.work_dlq_removed_max:
        raise Refusal(f"group {group.name} keeps {limits.work_dlq_removed_max} removed dead "
                      f"letters at most (limits.work_dlq_removed_max)")  # fmt: skip
    if action != Action.REDRIVE or not fresh:
        return
    if group.parts:
        raise Refusal(f"group {group.name} is key-ordered: its dead letters cannot be "
                      f"redriven (purge them, or publish them again)")  # fmt: skip
    if len(group.slots) + len(fresh) > limits.work_slots_max:
        raise Refusal(f"group {group.name} holds {len(group.slots)} slots: no room for "
                      f"{len(fresh)} more (limits.work_slots_max)")  # fmt: skip
    unplaced = [x.id for x in fresh if not x.exchange]
    if unplaced:
        raise Refusal(f"letters {unplaced[:3]} name no exchange of {group.name}'s queue")


def _redrive(group: Group, letter: Letter) -> bool:
    """A one-message slot for the letter; False if its message has one pending already (a
    message dead-lettered twice: it is delivered once)."""
    slot = Slot(letter.exchange, letter.offset, letter.offset + 1, first=letter.record,
                last=letter.record + 1, letter=letter.id)  # fmt: skip
    if slot.slot_id in group.slots:
        return False
    group.slots[slot.slot_id] = slot
    return True


def evicted(group: Group, slot: Slot) -> bool:
    """A consumer read a redriven letter's slot and found no record at its position (the
    source log's retention deleted it): the letter goes back to the dead letters and the slot
    is settled (dropped). True if so."""
    if not slot.letter or slot.count < 0 or slot.count > slot.first:
        return False
    group.removed.discard(slot.letter)
    _note(group, [], [slot.letter])
    Group._settle(slot, slot.first)
    return True
