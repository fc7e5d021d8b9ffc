"""The monitor's failure detector (monitor/detector.py): late is not dead. Pure: verdicts from
silences, deadlines and connection states, and the monitor loop's own lateness."""

from __future__ import annotations

import pytest

from roq import limits
from roq.monitor.detector import Lateness, TurnClock, credited, is_dead, is_late, late_max_s

DEAD_S = 0.6  # 3 heartbeats of 0.2 s, as the fault harness runs
LATE_MAX_S = limits.monitor_late_silence_max_ms / 1000


@pytest.mark.parametrize("linked", [True, False])
def test_within_its_heartbeats_an_exchange_is_neither_dead_nor_late(linked: bool) -> None:
    assert not is_dead(DEAD_S, DEAD_S, linked)
    assert not is_late(DEAD_S, DEAD_S, linked)


def test_silent_with_its_connection_dropped_it_is_dead_after_its_heartbeats_as_before() -> None:
    """kill -9: the dead process's kernel closed the connection; so is one never connected."""
    assert is_dead(DEAD_S + 0.01, DEAD_S, linked=False)
    assert not is_late(DEAD_S + 0.01, DEAD_S, linked=False)


def test_silent_with_its_connection_up_it_is_late_until_the_bound_then_dead() -> None:
    """A starved process (late) and a frozen one (SIGSTOP) look alike until the bound."""
    for silent_s in (DEAD_S + 0.01, 1.6, 3.4, LATE_MAX_S):  # §4's measured silences within
        assert not is_dead(silent_s, DEAD_S, linked=True), silent_s
        assert is_late(silent_s, DEAD_S, linked=True), silent_s
    assert is_dead(LATE_MAX_S + 0.01, DEAD_S, linked=True)
    assert not is_late(LATE_MAX_S + 0.01, DEAD_S, linked=True)


def test_heartbeats_longer_than_the_bound_keep_their_own_deadline() -> None:
    long_dead_s = 3 * LATE_MAX_S  # a heartbeat.period far above the default
    assert late_max_s(long_dead_s) == long_dead_s
    assert not is_dead(long_dead_s, long_dead_s, linked=True)
    assert is_dead(long_dead_s + 0.01, long_dead_s, linked=True)


def test_a_turn_on_time_misses_nothing() -> None:
    clock = TurnClock(100.0)
    assert clock.missed(100.1, waited_s=0.1) == 0.0  # its poll timed out
    assert clock.missed(100.11, waited_s=0.1) == 0.0  # a message woke it early
    jitter = limits.monitor_turn_late_ms / 1000 - 0.01
    assert clock.missed(100.11 + 0.1 + jitter, waited_s=0.1) == 0.0


def test_a_starved_turn_misses_what_it_came_late_by() -> None:
    """The loop's poll (100 ms) came back 1.5 s later: 1.4 s it did not listen."""
    clock = TurnClock(100.0)
    assert clock.missed(101.5, waited_s=0.1) == pytest.approx(1.4)
    assert clock.missed(101.6, waited_s=0.1) == 0.0  # measured from the late turn on


def test_missed_time_moves_the_last_word_heard_forward_never_past_now() -> None:
    assert credited(last_seen=10.0, missed_s=1.4, now=12.0) == pytest.approx(11.4)
    assert credited(last_seen=11.9, missed_s=1.4, now=12.0) == 12.0


def test_a_monitor_starved_as_long_as_its_exchange_does_not_declare_it_dead() -> None:
    """One machine, one CPU: the exchange's last report came just before both froze for
    1.5 s. Credited with the monitor's own lateness, its silence is 0.1 s: not even late."""
    clock = TurnClock(100.0)
    last_seen = 100.0
    now = 101.6
    last_seen = credited(last_seen, clock.missed(now, waited_s=0.1), now)
    assert not is_dead(now - last_seen, DEAD_S, linked=False)
    assert not is_late(now - last_seen, DEAD_S, linked=False)


# --- starved is not dead: an exchange heard again after long silences -------------------------
STARVED_MAX_S = limits.monitor_starved_silence_max_ms / 1000
MEMORY_S = limits.monitor_starved_memory_ms / 1000


def test_an_exchange_heard_again_after_long_silences_gets_a_stretched_bound() -> None:
    """It came back after 4 s: its machine is starved, not its process frozen. Its next silence
    may be twice that before it is declared dead; a frozen one with no such record gets 5 s."""
    starved_s = 4.0
    bound_s = limits.monitor_starved_stretch * starved_s
    assert late_max_s(DEAD_S, starved_s) == pytest.approx(bound_s)
    assert LATE_MAX_S < bound_s <= STARVED_MAX_S
    assert not is_dead(bound_s - 0.01, DEAD_S, linked=True, starved_s=starved_s)
    assert is_late(bound_s - 0.01, DEAD_S, linked=True, starved_s=starved_s)
    assert is_dead(bound_s + 0.01, DEAD_S, linked=True, starved_s=starved_s)
    assert is_dead(LATE_MAX_S + 0.01, DEAD_S, linked=True, starved_s=0.0)


def test_the_stretched_bound_never_passes_the_ceiling_nor_falls_below_the_late_bound() -> None:
    assert late_max_s(DEAD_S, 60.0) == STARVED_MAX_S  # a frozen one is dead within the ceiling
    assert late_max_s(DEAD_S, 0.5) == LATE_MAX_S  # short gaps change nothing
    assert is_dead(STARVED_MAX_S + 0.01, DEAD_S, linked=True, starved_s=60.0)


def test_starvation_does_not_keep_an_exchange_whose_connection_dropped() -> None:
    """kill -9 on a starved machine: its kernel closed the connection; dead after its periods."""
    assert is_dead(DEAD_S + 0.01, DEAD_S, linked=False, starved_s=7.0)


def test_lateness_remembers_the_longest_silence_for_a_while_then_forgets() -> None:
    lateness = Lateness()
    assert lateness.starved_s(0.0) == 0.0  # never heard late: no evidence
    lateness.heard(3.0, now=100.0)
    lateness.heard(0.2, now=101.0)  # on time again: the longest is kept
    assert lateness.starved_s(101.0) == 3.0
    lateness.heard(4.5, now=102.0)  # a deeper starvation replaces it
    assert lateness.starved_s(102.0 + MEMORY_S) == 4.5
    assert lateness.starved_s(102.0 + MEMORY_S + 0.01) == 0.0  # forgotten: back to 5 s
    lateness.heard(0.2, now=102.0 + MEMORY_S + 1)  # after it is forgotten, the newest counts
    assert lateness.starved_s(102.0 + MEMORY_S + 1) == 0.2
