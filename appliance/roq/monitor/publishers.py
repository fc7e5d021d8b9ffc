"""The publishers' KPIs (CMD 11, 12) a monitor keeps for its STATUS (`roq status`).

Pure: the stat monitor hands it each 11 and 12 it forwards (monitor/service.py `_pump_stats`)
with the time, and asks for the rows. Owned by the monitor's main thread.

Bounded: at most `limits.monitor_publisher_kpis_max` publishers, the first heard; one past it
is counted, not kept, until a kept one has been silent `limits.publisher_kpi_forget_s` (closed,
or moved to another monitor) and is forgotten.
"""

from __future__ import annotations

from dataclasses import dataclass

from roq import limits
from roq.protocol.commands import StatCommand
from roq.protocol.messages.control import PublisherStat
from roq.protocol.messages.kpi import PublisherKpi


@dataclass
class _Heard:
    total_sent: int = 0
    rate: float = 0.0
    at: float = 0.0  # monotonic seconds, when last heard


class PublisherKpis:
    """The last 11 and 12 of each publisher heard, by producer id (hex)."""

    def __init__(
        self,
        kept_max: int = limits.monitor_publisher_kpis_max,
        forget_s: float = limits.publisher_kpi_forget_s,
    ):
        self.kept_max, self.forget_s = kept_max, forget_s
        self.heard: dict[str, _Heard] = {}
        self.untracked = 0  # KPI messages of publishers past the bound, since start

    def note(self, kpi: PublisherKpi, now: float) -> None:
        heard = self.heard.get(kpi.publisher_id)
        if heard is None:
            if len(self.heard) >= self.kept_max:
                self._forget(now)
            if len(self.heard) >= self.kept_max:
                self.untracked += 1
                return
            heard = self.heard[kpi.publisher_id] = _Heard()
        heard.at = now
        if kpi.command == StatCommand.PUBLISHER_TOTAL:
            heard.total_sent = kpi.total
        else:
            heard.rate = kpi.rate

    def _forget(self, now: float) -> None:
        for publisher_id in [p for p, h in self.heard.items() if now - h.at > self.forget_s]:
            del self.heard[publisher_id]

    def rows(self, now: float) -> tuple[PublisherStat, ...]:
        """The publishers heard within `forget_s`, busiest first."""
        self._forget(now)
        rows = [PublisherStat(p, h.total_sent, h.rate, now - h.at) for p, h in self.heard.items()]
        return tuple(sorted(rows, key=lambda r: (-r.rate, r.publisher_id)))
