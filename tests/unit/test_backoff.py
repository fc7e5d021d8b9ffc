"""roq.backoff: the one back-off every retry loop uses (supervision, `roq up`, the GCM's repair,
the scaling actuator, the publisher, the consumer, the admin client, redelivery)."""

import pytest

from roq import limits
from roq.backoff import Backoff, backoff_s


def test_doubles_from_the_first_wait_up_to_the_cap():
    waits = [backoff_s(failures, 0.25, 10.0) for failures in range(1, 9)]
    assert waits == [0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]


def test_linear_grows_by_the_first_wait_up_to_the_cap():
    waits = [backoff_s(failures, 0.5, 2.0, linear=True) for failures in range(1, 7)]
    assert waits == [0.5, 1.0, 1.5, 2.0, 2.0, 2.0]


def test_a_count_below_one_waits_the_first():
    assert backoff_s(0, 0.25, 10.0) == backoff_s(-3, 0.25, 10.0) == 0.25


def test_a_long_run_of_failures_stays_at_the_cap():
    """The exponent is bounded: a float power of a large count would overflow."""
    assert backoff_s(100_000, 1.0, 30.0) == 30.0
    assert backoff_s(100_000, 1e-9, 1e300) == 1e-9 * 2.0**62


def test_the_cap_bounds_even_the_first_wait():
    assert backoff_s(1, 5.0, 2.0) == 2.0


@pytest.mark.parametrize(("first_s", "max_s"), [(-1.0, 1.0), (1.0, -1.0)])
def test_negative_waits_are_refused(first_s, max_s):
    with pytest.raises(ValueError, match="not negative"):
        backoff_s(1, first_s, max_s)
    with pytest.raises(ValueError, match="not negative"):
        Backoff(first_s, max_s)


def test_a_loop_counts_its_failures_and_starts_again_after_a_success():
    retry = Backoff(0.1, 0.3)
    assert [retry.next_s() for _ in range(4)] == [0.1, 0.2, 0.3, 0.3]
    assert retry.failures == 4
    retry.reset()
    assert retry.next_s() == 0.1


def test_the_childrens_restarts_keep_their_schedule():
    """host/supervision.py waited min(max, min x 2^(failures-1)) ms before."""
    first_s = limits.child_restart_backoff_ms_min / 1000
    max_s = limits.child_restart_backoff_ms_max / 1000
    for failures in range(1, limits.child_restarts_max + 1):
        before_ms = min(
            limits.child_restart_backoff_ms_max,
            limits.child_restart_backoff_ms_min * 2 ** (failures - 1),
        )
        assert backoff_s(failures, first_s, max_s) == pytest.approx(before_ms / 1000)


def test_the_admin_clients_attempts_keep_their_schedule():
    """client/admin.py waited 0.3 s x attempt before; the cap is beyond its attempts."""
    first_s = limits.client_retry_backoff_ms / 1000
    max_s = limits.client_retry_backoff_ms_max / 1000
    for attempt in range(1, limits.client_retry_max):
        wait = backoff_s(attempt, first_s, max_s, linear=True)
        assert wait == pytest.approx(first_s * attempt)
