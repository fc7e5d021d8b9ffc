"""The dispatch table (protocol/dispatch.py): a request is decoded once into its message class,
the handler gets the typed message, and every reply of the socket is stamped in one place."""

from __future__ import annotations

from roq.protocol.commands import HostCommand, Reason
from roq.protocol.dispatch import Done, Refused, Route, Table, route
from roq.protocol.messages.host import CreateQueueOnHost, HostPing, StopQueueOnHost


def _stamp(reply: dict) -> dict:
    return {**reply, "Epoch": 7}


def test_the_handler_is_given_the_typed_message_and_its_reply_is_stamped():
    seen = []

    def create(wanted: CreateQueueOnHost) -> Done:
        seen.append(wanted)
        return Done(f"created {wanted.queue}")

    table: Table[None] = Table(
        "host h1", {HostCommand.CREATE_QUEUE: route(CreateQueueOnHost.decode, create)}, _stamp
    )
    reply = table(CreateQueueOnHost("q1", 3).encode(), None)
    assert seen == [CreateQueueOnHost("q1", 3)]
    assert reply == {"RESULT": 0, "COMMENT": "created q1", "Epoch": 7}


def test_an_unknown_command_and_a_bad_field_are_refused_by_name_and_stamped():
    table: Table[None] = Table(
        "host h1",
        {HostCommand.STOP_QUEUE: route(StopQueueOnHost.decode, lambda s: Done(s.queue))},
        _stamp,
    )
    unknown = table({"CMD": 4242}, None)
    assert unknown is not None and unknown["ERROR"] == str(Reason.UNKNOWN_COMMAND)
    assert "host h1: unknown command 4242" in unknown["COMMENT"] and unknown["Epoch"] == 7
    missing = table({"CMD": int(HostCommand.STOP_QUEUE)}, None)
    assert missing is not None and missing["ERROR"] == str(Reason.BAD_REQUEST)
    assert "QName" in missing["COMMENT"] and missing["Epoch"] == 7
    not_a_number = table({"CMD": "1012"}, None)
    assert not_a_number is not None and not_a_number["ERROR"] == str(Reason.UNKNOWN_COMMAND)


def test_a_routed_handler_gets_the_context_and_may_hold_the_request():
    held = []

    def ping(message: HostPing, envelope: tuple[bytes, ...]) -> Refused | None:
        held.append(envelope)
        return None if envelope else Refused(Reason.BUSY, "no envelope")

    table: Table[tuple[bytes, ...]] = Table(
        "monitor q1", {HostCommand.PING: Route(HostPing.decode, ping)}
    )
    assert table(HostPing().encode(), (b"peer", b"")) is None
    assert held == [(b"peer", b"")]
    assert table(HostPing().encode(), ())["ERROR"] == str(Reason.BUSY)
