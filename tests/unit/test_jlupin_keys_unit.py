"""Issue 34: JLupin's worker-side repeatsAmount / timeToWaitBetweenRepeatProbeInMillis and the
delegator's howOftenCheckingServerInMillisByDelegator as request keys (docs/requests.md)."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import pytest
from test_monitor_requests import _TaskStore

from roq import config
from roq.client.locate import MonitorAddress
from roq.client.monitorlink import MonitorLink
from roq.config.components import RequestSettings
from roq.errors import ConfigError, RoqError
from roq.monitor.selection import live_members
from roq.monitor.service import request_needs
from roq.monitor.slots import Group, Member
from roq.monitor.tasks import Record, TaskManager
from roq.protocol import bsonmsg
from roq.protocol.commands import MonitorCommand, Reason
from roq.protocol.ports import MonitorPort, port_at
from roq.protocol.principals import Permission
from roq.testing.cluster import PortBlocks
from roq.transport import Kind, bind, new_context, open_socket, recv_nowait, send_nowait
from roq.transport.sockets import wait_readable

LOOPBACK = "127.0.0.1"


class _BusyMonitor:
    """A real REP socket answering every request `busy`, counting them with their times."""

    def __init__(self, base: int) -> None:
        self._context = new_context()
        self._socket = open_socket(self._context, Kind.REP)
        bind(self._socket, LOOPBACK, port_at(base, MonitorPort.PLACEMENT))
        self.address = MonitorAddress(f"tcp://{LOOPBACK}:{base}")
        self.times: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        busy = bsonmsg.fail(Reason.BUSY, "recovering")
        while not self._stop.is_set():
            if wait_readable(self._socket, 50) and recv_nowait(self._socket) is not None:
                self.times.append(time.monotonic())
                send_nowait(self._socket, [bsonmsg.encode(busy)])

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self._socket.close(0)
        self._context.term()


@pytest.fixture
def busy(port_blocks: PortBlocks) -> Iterator[_BusyMonitor]:
    monitor = _BusyMonitor(port_blocks.take(6))
    yield monitor
    monitor.close()


def _link(monitor: _BusyMonitor) -> MonitorLink:
    return MonitorLink("q1", (None, None, "/roq"), monitor=monitor.address)


def test_request_worker_repeats_bounds_the_asks(busy):
    link = _link(busy)
    # request.worker.repeats=3, request.worker.wait.ms=200: the asks stop at the count, well
    # before the time bound (3 × 200 ms); at 10 ms a loaded machine's round trips reached the
    # time bound first (2 asks, a loaded unit run of 27 Nov)
    link.repeat(3, 0.2)
    try:
        with pytest.raises(RoqError, match=r"does not answer \(3 asks\)"):
            link.ask({"CMD": 43})
    finally:
        link.close()
    assert len(busy.times) == 3


def test_request_worker_wait_ms_spaces_the_asks(busy):
    link = _link(busy)
    link.repeat(3, 0.3)
    try:
        with pytest.raises(RoqError):
            link.ask({"CMD": 43})
    finally:
        link.close()
    gaps = [b - a for a, b in zip(busy.times, busy.times[1:], strict=False)]
    assert len(gaps) == 2 and min(gaps) >= 0.3


def test_defaults_are_the_links_former_constants():
    defaults = RequestSettings.from_settings(config.load_hcm(None))
    assert defaults.worker_repeats * defaults.worker_wait_s == pytest.approx(30.0)
    assert defaults.worker_wait_s == 0.025 and defaults.check_s == 0.0
    assert defaults.as_text()["request.worker.repeats"] == "1200"


@pytest.mark.parametrize(
    ("key", "value"),
    [("request.worker.repeats", "0"), ("request.worker.wait.ms", "soon"),
     ("request.delegator.check.ms", "-1")],
)  # fmt: skip
def test_bad_values_are_refused_naming_key_and_file(tmp_path, key, value):
    path = tmp_path / "HCM.properties"
    path.write_text(f"{key}={value}\n")
    with pytest.raises(ConfigError) as refused:
        config.load_hcm(path)
    assert key in str(refused.value) and str(path) in str(refused.value)
    with pytest.raises(ConfigError, match=key):  # and per queue (roq task config)
        RequestSettings.from_settings(config.load_hcm(None)).overridden({key: value}, "q")


def test_request_delegator_check_ms_is_the_window_of_a_live_worker():
    now = time.monotonic()
    group = Group("svc.s", members={"a": Member("a", now - 2.0), "b": Member("b", now - 0.1)})
    asked: list[float] = []

    def live(_group: str, within_s: float) -> int:
        asked.append(within_s)
        return live_members(group, now - (within_s or 30.0))  # 0: the lease

    settings = config.MonitorSettings.from_settings(
        config.load_hcm(None, {"request.delegator.check.ms": "1000"})
    )
    tasks = TaskManager("q1", settings, None, live, store=_TaskStore())  # type: ignore[arg-type]
    assert live_members(group, now - 30.0) == 2  # the default window: both
    assert tasks._live_workers("svc.s", tasks.settings.check_s) == 1  # "a" is too old
    group.members["b"].last_seen = now - 1.5
    record = Record("t1", "s", accepted_ms=0, changed_ms=0)
    assert tasks._apply_deadlines(record, 10_000) and record.state == "no_worker"
    assert asked[-1] == 1.0
    default = TaskManager("q1", config.MonitorSettings.from_settings(config.load_hcm(None)),
                          None, live, store=_TaskStore())  # type: ignore[arg-type]  # fmt: skip
    kept = Record("t2", "s", accepted_ms=0, changed_ms=0)
    assert not default._apply_deadlines(kept, 10_000) and kept.state == "accepted"


def test_a_member_holding_a_slot_is_live_whatever_the_window():
    group = Group("svc.s", members={"a": Member("a", 0.0, slots={"x1/0"})})
    assert live_members(group, time.monotonic()) == 1


def test_a_worker_may_read_the_request_settings_only_an_admin_change_them():
    read = request_needs({"CMD": int(MonitorCommand.TASK_CONFIG), "Settings": {}})
    assert Permission.CONSUME in read and Permission.PUBLISH in read
    change = {"CMD": int(MonitorCommand.TASK_CONFIG), "Settings": {"request.retry.max": "1"}}
    assert request_needs(change) == (Permission.ADMIN,)
