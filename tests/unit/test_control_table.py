"""The control socket's table (transport/control.py): PING and SHUTDOWN beside the child's own
routes, each handler given its typed message; an unknown command and a bad field keep their
replies (the socket is bound, but the table is asked directly)."""

from __future__ import annotations

import socket

import pytest

from roq.protocol.commands import ChildCommand, Reason
from roq.protocol.dispatch import Done, route
from roq.protocol.messages.control import MonitorMoved, Ping, Pong, Shutdown
from roq.transport import new_context
from roq.transport.control import ControlServer


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


@pytest.fixture
def server():
    moved: list[MonitorMoved] = []

    def follow(message: MonitorMoved) -> Done:
        moved.append(message)
        return Done("moved")

    context = new_context()
    extra = {ChildCommand.MONITOR_MOVED: route(MonitorMoved.decode, follow)}
    control = ControlServer(context, "127.0.0.1", _free_port(), "exchange q1/x1", extra)
    control.status = lambda: {"Queue": "q1"}
    yield control, moved
    control.close()
    context.term()


def test_ping_shutdown_and_the_childs_own_route(server):
    control, moved = server
    pong = Pong.decode(control.table(Ping().encode(), None))
    assert pong == Pong("exchange q1/x1", {"Queue": "q1"})
    news = MonitorMoved("tcp://127.0.0.1:17000", "tcp://127.0.0.1:17100", 3)
    assert control.table(news.encode(), None) == {"RESULT": 0, "COMMENT": "moved"}
    assert moved == [news]
    assert not control.stop_requested
    assert control.table(Shutdown().encode(), None) == {"RESULT": 0, "COMMENT": "stopping"}
    assert control.stop_requested


def test_unknown_commands_and_bad_fields_are_refused(server):
    control, moved = server
    unknown = control.table({"CMD": int(ChildCommand.REPLICAS)}, None)  # no log: not served
    assert unknown is not None and unknown["ERROR"] == str(Reason.UNKNOWN_COMMAND)
    assert unknown["COMMENT"] == "unknown command 1030"
    bad = control.table({"CMD": int(ChildCommand.MONITOR_MOVED), "Monitor": "nowhere"}, None)
    assert (
        bad is not None and bad["ERROR"] == str(Reason.BAD_REQUEST) and "Monitor" in bad["COMMENT"]
    )
    assert moved == []
