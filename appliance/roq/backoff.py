"""The one back-off of roq: how long a retry loop waits after its failures.

Every loop that waits longer after each failure in a row asks `backoff_s` (or keeps a `Backoff`,
which counts the failures for it): a child's restart (host/supervision.py), `roq up`'s restarts
(local/up.py), telling a host its monitor moved (gcm/repair.py), the scaling actuator's rules
refresh (monitor/actuator.py), a publisher's placement and its questions while stalled
(client/publisher.py), an idle consumer's polls (client/consumer.py), the admin client's
attempts at the GCM leader (client/admin.py) and a consumer group's redelivery delay
(monitor/slots.py). Each passes its first wait and its cap, both named in limits.py (or, for
the redelivery, configured), so the bound is always stated where the loop is.

The wait doubles from `first_s` (`linear`: grows by `first_s`) and never exceeds `max_s`. It
adds no jitter: none of the loops it replaced had any, and adding it would change their timing
(a change of its own, to be measured).
"""

from __future__ import annotations

# 2**62 times any first wait exceeds any cap: the exponent stops growing there (a float power
# of a larger one overflows)
_DOUBLINGS_MAX = 62


def backoff_s(failures: int, first_s: float, max_s: float, *, linear: bool = False) -> float:
    """The wait after `failures` failures in a row (1: the first, which waits `first_s`):
    `first_s` doubled once per further failure (`linear`: `first_s` times `failures`), at most
    `max_s`. A count below 1 is taken as 1."""
    if first_s < 0 or max_s < 0:
        raise ValueError(f"a back-off's waits are not negative (first {first_s}, max {max_s})")
    failures = max(1, failures)
    if linear:
        return min(first_s * failures, max_s)
    return min(first_s * 2.0 ** min(failures - 1, _DOUBLINGS_MAX), max_s)


class Backoff:
    """A retry loop's back-off: `next_s()` counts one more failure and returns its wait;
    `reset()` after a success. Owned by the loop's thread (not thread-safe)."""

    def __init__(self, first_s: float, max_s: float, *, linear: bool = False):
        backoff_s(1, first_s, max_s)  # the bounds are checked now, not at the first failure
        self.first_s, self.max_s, self.linear = first_s, max_s, linear
        self.failures = 0

    def next_s(self) -> float:
        self.failures += 1
        return backoff_s(self.failures, self.first_s, self.max_s, linear=self.linear)

    def reset(self) -> None:
        self.failures = 0
