"""The only package that imports zmq. Components get sockets, pollers and requesters from here,
with every option set explicitly, use roq names for pyzmq's flags (`READABLE`, `send_nowait`,
`recv_nowait`, `drained`, `wait_readable`) and see roq errors from them (never `zmq.ZMQError`).
A socket's own `send_multipart`, `recv_multipart` or `bind`, and `Poller.poll`, called directly
where a caller wants them, raise pyzmq's errors untranslated."""

from roq.transport.sockets import (
    READABLE,
    WRITABLE,
    ConnectionWatch,
    Context,
    Kind,
    Poller,
    Socket,
    bind,
    connect,
    copying_send_pays,
    disconnect,
    drained,
    new_context,
    open_socket,
    recv_nowait,
    send_nowait,
    subscribe,
    unsubscribe,
    wait_readable,
)

__all__ = [
    "READABLE",
    "WRITABLE",
    "ConnectionWatch",
    "Context",
    "Kind",
    "Poller",
    "Socket",
    "bind",
    "connect",
    "copying_send_pays",
    "disconnect",
    "drained",
    "new_context",
    "open_socket",
    "recv_nowait",
    "send_nowait",
    "subscribe",
    "unsubscribe",
    "wait_readable",
]
