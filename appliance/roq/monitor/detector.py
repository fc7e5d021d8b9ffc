"""When the monitor takes an exchange for dead: late is not dead (issue 30 item 6).

An exchange reports every heartbeat period, and its pulse thread beats while its loop stalls
(exchange/pulse.py). On a machine past CPU saturation both can be late by seconds, and so can
the monitor's own loop: 3 periods of silence then declared live exchanges dead, and their
`acks="none"` publishers moved and lost what was in flight (docs/benchmarks.md §4). Two pieces
of evidence now tell a late exchange from a dead one:

- The monitor's own loop: time it did not turn (starved of CPU, or blocked) is nobody's
  silence. What the exchanges sent meanwhile waits in its socket, and what they did not send
  was likely late for the same reason: one machine, one CPU. `TurnClock` measures it, and
  `credited` moves the last word heard forward by it.
- The exchange's connection: a process that dies, kill -9 included, has its sockets closed by
  its kernel, and the monitor's connection to its control port drops within a round trip. A
  silent exchange whose connection dropped, or never came up, is dead after its periods as
  always. One whose connection is still up is alive or frozen (SIGSTOP, a hung machine, a
  partition): it is given up to `limits.monitor_late_silence_max_ms`, and then declared dead.
- The exchange's own record of lateness: a process heard again after a long silence was alive
  and starved, not frozen (a stopped process sends nothing until it is continued), and what
  the monitor heard from it counts only while its host's lease holds (a fenced exchange does
  not beat, exchange/pulse.py), so the host's ZooKeeper session answered too. An exchange
  heard again after a silence of g seconds within the last `limits.monitor_starved_memory_ms`
  is on a machine known to be starved: its bound is stretched to
  `limits.monitor_starved_stretch` x g, at most `limits.monitor_starved_silence_max_ms`.
  Without that record (a healthy machine's exchange frozen or cut off) the bound stays 5 s.

Pure: no sockets, no clock of its own.
"""

from __future__ import annotations

from roq import limits


def late_max_s(dead_s: float, starved_s: float = 0.0) -> float:
    """The longest silence of an exchange whose connection is up (never less than `dead_s`):
    the late bound, stretched by `starved_s`, the longest silence it came back from lately
    (`Lateness`), up to the starved bound."""
    base = max(dead_s, limits.monitor_late_silence_max_ms / 1000)
    ceiling = max(base, limits.monitor_starved_silence_max_ms / 1000)
    return min(ceiling, max(base, limits.monitor_starved_stretch * starved_s))


def is_dead(silent_s: float, dead_s: float, linked: bool, starved_s: float = 0.0) -> bool:
    """Silent past its periods with no connection (closed by a dead process's kernel, or never
    made): dead. With the connection up: dead only past `late_max_s`."""
    if silent_s <= dead_s:
        return False
    return not linked or silent_s > late_max_s(dead_s, starved_s)


def is_late(silent_s: float, dead_s: float, linked: bool, starved_s: float = 0.0) -> bool:
    """Past its periods but kept: its connection is up and the bound is not reached."""
    return silent_s > dead_s and not is_dead(silent_s, dead_s, linked, starved_s)


class Lateness:
    """One exchange's longest silence it was heard again after, remembered for
    `limits.monitor_starved_memory_ms`: evidence that its machine is starved, not its process
    frozen. A newer, shorter silence replaces it only once it is forgotten (errs short)."""

    def __init__(self) -> None:
        self._worst_s = 0.0
        self._at = float("-inf")

    def heard(self, silent_s: float, now: float) -> None:
        """It was heard after `silent_s` of silence (credited with the monitor's own lateness)."""
        if silent_s >= self._worst_s or self._forgotten(now):
            self._worst_s, self._at = silent_s, now

    def starved_s(self, now: float) -> float:
        """The longest silence remembered at `now` (0: none)."""
        return 0.0 if self._forgotten(now) else self._worst_s

    def _forgotten(self, now: float) -> bool:
        return (now - self._at) * 1000 > limits.monitor_starved_memory_ms


def credited(last_seen: float, missed_s: float, now: float) -> float:
    """`last_seen` moved forward by the time the monitor did not listen (never past `now`)."""
    return min(now, last_seen + missed_s)


class TurnClock:
    """The monitor loop's turns: how late each came, beyond the wait its poll was given."""

    def __init__(self, now: float):
        self._last = now

    def missed(self, now: float, waited_s: float) -> float:
        """Seconds since the last turn beyond `waited_s` (the poll's timeout), when more than
        `limits.monitor_turn_late_ms`; else 0. A poll that returned early (a message came)
        counts its full timeout: the credit errs short, towards today's verdict."""
        late = now - self._last - waited_s
        self._last = now
        return late if late * 1000 > limits.monitor_turn_late_ms else 0.0
