"""The roq exception tree. Foreign errors (zmq, kazoo, OSError) are translated at the boundary.

RoqError
├── ConfigError            invalid configuration: exit code 78 (EX_CONFIG)
├── ProtocolError          a peer sent something we cannot accept (reply 1101, keep serving)
│   ├── DecodeError
│   ├── FrameTooLarge
│   └── UnknownCommand
├── LogError               the message log
│   ├── CorruptRecord
│   ├── OffsetEvicted      the offset existed once and retention removed it (mq's 230)
│   ├── OffsetNotYetWritten  nothing there yet (mq's 231)
│   ├── InvalidOffset      not a batch boundary of the log, or past its end
│   ├── LogUnavailable     the log directory or disk cannot be written (exit code 73)
│   ├── StateConflict      a state log's compare-and-set found another version: nothing written
│   └── InvalidChange      a state change past a bound (key, value, one batch): nothing written
├── CoordinationError      ZooKeeper unreachable, session lost, version conflict
│   ├── NotLeader          a GCM that is not (or no longer) the leader refused to write
│   └── NameTaken          a live host already holds this host name (exit code 75)
├── TransportError         a peer did not answer within its bound
│   └── RequestTimeout
├── AdminError             an admin request was refused (unknown queue, already exists, ...)
│   └── HostRegistered     a write that required a host to be gone found it registered
├── BadInput               a file or line given to a command is unusable (exit code 65)
│   └── NoInput            an input path does not exist or holds nothing to read (exit code 66)
└── SecurityError          credentials missing or unreadable (exit code 77)
    └── AuthenticationRefused  a server refused our key in the CURVE handshake (a TransportError)
"""

from __future__ import annotations

# Exit codes systemd understands (sysexits.h); a unit uses RestartPreventExitStatus=78.
EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_DATAERR = 65  # input data is corrupt or unusable: a log segment, an offsets file, a stdin line
EXIT_NOINPUT = 66  # an input path does not exist (a log directory to read)
EXIT_RETIRED = 3  # a log keeper whose logs have their copies: done (host/keepers.py)
# a child fenced long past its lease (system/lease.py): its host starts it again only if
# ZooKeeper still assigns it there, once its lease is renewed
EXIT_FENCED = 4
# `roq status`: a RUNNING queue is NOT SERVING (its monitor does not answer); printed all the same
EXIT_NOT_SERVING = 5
EXIT_UNAVAILABLE = 69  # a dependency (ZooKeeper, the GCM) cannot be reached within its bound
EXIT_SOFTWARE = 70
EXIT_CANTCREAT = 73  # a directory or file we must write is not writable
EXIT_TEMPFAIL = 75  # a port we must bind is taken; a retry later may succeed
EXIT_NOPERM = 77  # credentials missing, or refused by a server (sysexits' EX_NOPERM)
EXIT_CONFIG = 78
# a client command stopped (Ctrl-C, SIGTERM) with nothing to settle: typer's for KeyboardInterrupt
EXIT_INTERRUPTED = 130


class RoqError(Exception):
    """Root of every error roq raises on purpose."""

    exit_code = EXIT_FAILURE


class ConfigError(RoqError):
    exit_code = EXIT_CONFIG


class ProtocolError(RoqError):
    pass


class DecodeError(ProtocolError):
    pass


class FrameTooLarge(ProtocolError):
    pass


class UnknownCommand(ProtocolError):
    pass


class LogError(RoqError):
    pass


class CorruptRecord(LogError):
    pass


class OffsetEvicted(LogError):
    pass


class OffsetNotYetWritten(LogError):
    pass


class InvalidOffset(LogError):
    pass


class LogUnavailable(LogError):
    """The log cannot be written (unwritable directory, disk full): publishes must be refused."""

    exit_code = EXIT_CANTCREAT


class StateConflict(LogError):
    """A state log append (log/statelog.py) expected a key at one version and found another, so
    nothing of the append was written: the compare-and-set that makes a claim exclusive (of two
    appends expecting a key absent, only the first finds it so). `found` 0: the key is absent."""

    def __init__(self, key: str, expected: int, found: int):
        state = f"version {found}" if found else "no such key"
        super().__init__(f"state key {key!r}: expected version {expected}, found {state}")
        self.key = key
        self.expected = expected
        self.found = found


class InvalidChange(LogError):
    """A state change the state log cannot store (a key or value past its bound, a key that is
    not UTF-8, the changes of one append past one batch): nothing of the append was written."""


class CoordinationError(RoqError):
    exit_code = EXIT_UNAVAILABLE


class NotLeader(CoordinationError):
    pass


class TopicRefused(RoqError):
    """An HTTP gateway request breaks a rule of the mq API (the reason says which): an HTTP 400
    (a topic taken, not its owner, not the subscriber's next message...)."""


class TopicForbidden(TopicRefused):
    """An HTTP gateway request names an owner or subscriber of another principal: an HTTP 403."""


class NameTaken(CoordinationError):
    """Another live process is registered under this host name. Temporary: the name is free
    again once that process stops or its ZooKeeper session expires."""

    exit_code = EXIT_TEMPFAIL


class TransportError(RoqError):
    exit_code = EXIT_UNAVAILABLE


class RequestTimeout(TransportError):
    pass


class PortInUse(TransportError):
    exit_code = EXIT_TEMPFAIL


class AdminError(RoqError):
    pass


class HostRegistered(AdminError):
    """A leader write made on condition that a host has no registration (the re-placement of
    a lost host's monitor) found the host registered again: nothing was written."""


class BadInput(RoqError):
    """What a command was given to read is unusable: an offsets file that is not one, a stdin
    line longer than a message (EX_DATAERR). Exit 1 is a refusal by the GCM."""

    exit_code = EXIT_DATAERR


class NoInput(BadInput):
    """An input path does not exist, or holds nothing the command reads (EX_NOINPUT)."""

    exit_code = EXIT_NOINPUT


class Stopped(RoqError):
    """A command told to stop (Ctrl-C, SIGTERM) while a request was still unanswered: what it
    held is released by its peer's lease, so the stop is an interruption (130), not a failure."""

    exit_code = EXIT_INTERRUPTED


class SecurityError(RoqError):
    """Credentials missing or unreadable, or a peer refused ours during the CURVE handshake."""

    exit_code = EXIT_NOPERM


class AuthenticationRefused(SecurityError, TransportError):
    """A server refused this client's key (or this client could not verify the server's)."""

    exit_code = EXIT_NOPERM


class HandlerFailure(Exception):
    """Raised by a request handler whose message is its whole failure text (`roq serve --exec`:
    the command's exit code and stderr): the task's error is the message alone, with no
    traceback (client/requests.py `failure_text`)."""
