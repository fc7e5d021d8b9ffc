"""The only package that imports zmq. Components get sockets, pollers and requesters from here,
with every option set explicitly, and see only roq errors (never `zmq.ZMQError`)."""

from roq.transport.sockets import (
    NOBLOCK,
    POLLIN,
    POLLOUT,
    SNDMORE,
    Context,
    Kind,
    Poller,
    Socket,
    WouldBlock,
    bind,
    connect,
    new_context,
    open_socket,
)

__all__ = [
    "NOBLOCK",
    "POLLIN",
    "POLLOUT",
    "SNDMORE",
    "Context",
    "Kind",
    "Poller",
    "Socket",
    "WouldBlock",
    "bind",
    "connect",
    "new_context",
    "open_socket",
]
