"""Structure-aware generators of hostile input for every socket of every daemon (issue 16).

Each strategy draws one message as a list of frames. Most are *valid-looking*: the right
framing, BSON that decodes, a batch whose CRC is right, with one thing wrong inside - a field
missing, duplicated or of the wrong type, an integer out of range (negative, 2**63, 2**64), a
string that is not an endpoint or a name, a huge count; the rest are random bytes. Messages that
could change the cluster if they were valid (create, stop, rules, reports) always carry a field
their decoder must refuse, so a passing run proves the refusal, not luck. Nothing here sends a
SHUTDOWN (1100): a stranger may legitimately stop a process; that is not hostile input.
"""

from __future__ import annotations

import struct
import time
import zlib
from typing import Any

import bson
from hypothesis import strategies as st

from roq import replication
from roq.log import format as batchfmt
from roq.protocol import dataplane
from roq.protocol.commands import AdminCommand, ChildCommand, HostCommand, MonitorCommand

Frames = list[bytes]
SHUTDOWN = 1100

NOT_ENDPOINTS = ["fuzz-front", "not-an-endpoint", "tcp://", "tcp://1.2.3.4", "tcp://1.2.3.4:0",
                 "tcp://1.2.3.4:65536", "tcp://1.2.3.4:-1", "tcp://x:99999999999999999999",
                 "tcp://a b:1", "tcp://:1", "ipc:///tmp/x", "tcp://1.2.3.4:5/x",
                 "tcp://127.0.0.1:65535"]  # fmt: skip
BAD_NAMES = ["", ".", "..", "a/b", "x@y", "a\0b", "-lead", "q" * 300, "\u00e9t\u00e9", " q"]
BIG_INTS = [-1, -(2**31), -(2**63), 2**31, 2**63 - 1]
# Integers BSON cannot hold as int64 arrive as other BSON types: a decoder must refuse the type.
HUGE = [bson.Timestamp(2**32 - 1, 2**32 - 1), bson.Decimal128("18446744073709551616"),
        bson.Decimal128("9223372036854775813"), bson.Int64(2**63 - 1)]  # fmt: skip
WRONG_TYPES: list[Any] = [True, False, 0, 1.5, float("nan"), float("inf"), "x", b"\x00\xff",
                          [], [1, "a"], {}, {"a": 1}, bson.ObjectId(b"fuzzfuzzfuzz")]  # fmt: skip


def _bad_values() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.sampled_from(NOT_ENDPOINTS + BAD_NAMES),
        st.sampled_from(BIG_INTS + HUGE + WRONG_TYPES),
        st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),
        st.integers(min_value=-(2**63), max_value=2**63 - 1),
        st.lists(st.integers(0, 9), min_size=2000, max_size=2000),  # a huge count
    )


_INT64 = st.integers(min_value=-(2**63), max_value=2**63 - 1)
# BSON names hold no NUL, and no text holds a lone surrogate (UTF-8 cannot encode one).
_KEYS = st.text(
    st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=12
)


def raw_bson(pairs: list[tuple[str, Any]]) -> bytes:
    """A BSON document with these elements in this order, duplicates kept (`bson.encode` of a
    dict cannot repeat a name)."""
    body = b"".join(bytes(bson.encode({name: value}))[4:-1] for name, value in pairs)
    return struct.pack("<i", len(body) + 5) + body + b"\x00"


@st.composite
def mutated(draw: st.DrawFn, template: dict[str, Any], must_break: list[str]) -> Frames:
    """`template` with one field of `must_break` dropped or given a value its decoder refuses,
    then maybe extra, duplicated or renamed fields around it (the refused value comes last, so a
    decoder that keeps the last of duplicates still sees it)."""
    pairs = list(template.items())
    name = draw(st.sampled_from(must_break))
    broken = [(n, v) for n, v in pairs if n != name]
    how = draw(st.sampled_from(["drop", "bad", "bad", "duplicate"]))
    refused = draw(_refused_value(name, template.get(name)))
    if how == "bad":
        broken.append((name, refused))
    elif how == "duplicate":
        broken += [(name, template.get(name, 0)), (name, refused)]
    for _ in range(draw(st.integers(0, 2))):
        # Only names the template lacks (or CMD, which the template repeats later): an extra
        # QName could turn a refused request into a valid one.
        extra = draw(st.sampled_from(["Extra", "CMD", "", "\u2603", "RESULT", "$where"]))
        if extra not in template or extra == "CMD":
            broken.insert(0, (extra, draw(_bad_values())))
    return [raw_bson(broken)]


_ENDPOINT_FIELDS = {"Front", "Back", "Endpoint", "Address", "Lost", "Log", "From", "HCM"}


def _refused_value(name: str, good: Any) -> st.SearchStrategy[Any]:
    """A value the field's decoder must refuse, whatever its type (a string only where the
    field's rule refuses it: "fuzz-front" is a fine queue name, not an endpoint)."""
    if name == "QName":
        return st.sampled_from([*BAD_NAMES, 5, True, 1.5, [], {}, *HUGE])
    if name in _ENDPOINT_FIELDS:
        return st.sampled_from(["", 5, True, [], {}, *HUGE, *NOT_ENDPOINTS])
    if isinstance(good, bool):
        return st.sampled_from([1, 0, "true", 1.0, []])
    if isinstance(good, int):
        return st.sampled_from(["1", 1.5, True, -1, *HUGE, [], {}])
    if isinstance(good, float):
        return st.sampled_from(["1", -1.0, float("nan"), float("inf"), -1, True, [], *HUGE])
    if isinstance(good, str):
        return st.sampled_from(["", 5, True, 1.5, [], {}, *HUGE])
    return st.sampled_from(["x", 5, True, {}])


def random_frames(max_frames: int = 5) -> st.SearchStrategy[Frames]:
    return st.lists(st.binary(max_size=300), min_size=1, max_size=max_frames)


@st.composite
def bson_garbage(draw: st.DrawFn, commands: list[int]) -> Frames:
    """Well-formed BSON with a plausible or random CMD and random fields; or broken BSON."""
    command: Any = draw(st.one_of(st.sampled_from(commands), _bad_values(), _INT64))
    fields = draw(st.dictionaries(_KEYS, _bad_values(), max_size=4))
    doc = raw_bson([("CMD", command), *fields.items()])
    cut = draw(st.sampled_from([None, None, None, 1, 4, 5, len(doc) - 1]))
    if cut is not None:
        doc = doc[:cut]  # torn BSON
    frames = [doc]
    if draw(st.booleans()) and draw(st.booleans()):
        frames.append(draw(st.binary(max_size=20)))  # one frame too many
    return frames


def _not_shutdown(frames: Frames) -> bool:
    try:
        return bson.decode(frames[0]).get("CMD") != SHUTDOWN
    except Exception:  # not BSON: harmless
        return True


# --- per socket -------------------------------------------------------------------------------
def gcm_admin() -> st.SearchStrategy[Frames]:
    """P+0 and P+3: every admin command, its queue name always one a queue may not have."""

    @st.composite
    def request(draw: st.DrawFn) -> Frames:
        command = draw(st.sampled_from(list(AdminCommand)))
        template = {"CMD": int(command), "QName": draw(st.sampled_from(BAD_NAMES)),
                    "Host": "h1", "ExchangeID": "x", "TransactionID": "t",
                    "Address": "tcp://127.0.0.1:1", "HostCPU": 1.0, "Version": 1}  # fmt: skip
        return draw(mutated(template, ["QName", "Host", "ExchangeID", "Address", "Version"]))

    return st.one_of(request(), bson_garbage([int(c) for c in AdminCommand]), random_frames())


def host_requests() -> st.SearchStrategy[Frames]:
    commands = [int(c) for c in HostCommand if c != SHUTDOWN]

    @st.composite
    def request(draw: st.DrawFn) -> Frames:
        template = {"CMD": draw(st.sampled_from(commands)),
                    "QName": draw(st.sampled_from(BAD_NAMES)), "TransactionID": "t",
                    "Monitor_port": 7000, "Stat_port": 7100, "Monitor_address": "127.0.0.1",
                    "ExchangeID": "x", "DeleteLogs": True}  # fmt: skip
        return draw(mutated(template, ["QName", "Monitor_port", "Monitor_address"]))

    return st.one_of(request(), bson_garbage(commands), random_frames()).filter(_not_shutdown)


def exchange_reports(fronts: list[str]) -> st.SearchStrategy[Frames]:
    """B+0: reports (5), leaving (6), pulses (7), subscription counts (8), each with a field
    the monitor must refuse; `fronts` includes the real exchange's."""

    @st.composite
    def report(draw: st.DrawFn) -> Frames:
        command = draw(st.sampled_from([5, 6, 7, 8]))
        front = draw(st.sampled_from([*fronts, "tcp://127.0.0.1:6000", "fuzz-front"]))
        identity = {"CMD": command, "QName": "q1", "Id": "fz-x", "Front": front,
                    "Back": "tcp://127.0.0.1:6001", "Period": 0.2, "Started": time.time(),
                    "Log": True, "Host": "h1"}  # fmt: skip
        load = {"Msgs": 1.0, "Bytes": 1.0, "Producers": 1, "Top": [], "CPU": 0.1,
                "RSS": 1, "Load": 0.1, "Bad": 0, "TotalMsgs": 1, "TotalBytes": 1,
                "Copies": [{"Id": "fz-dead", "End": 10}], "Subs": 0}  # fmt: skip
        if command == 7:
            template = {"CMD": 7, "Id": "fz-x", "Front": front, "Started": time.time(),
                        "LoopAge": 0.0}  # fmt: skip
            return draw(mutated(template, ["Id", "Front", "Started", "LoopAge"]))
        if command == 8:
            return draw(mutated({**identity, "Subs": 1}, [*identity, "Subs"][1:]))
        if command == 6:
            return draw(mutated(identity, list(identity)[1:]))
        return draw(mutated({**identity, **load}, [*list(identity)[1:], *load]))

    return st.one_of(report(), bson_garbage([5, 6, 7, 8]), random_frames(2))


def placement() -> st.SearchStrategy[Frames]:
    commands = [int(c) for c in MonitorCommand]
    template = {"CMD": 2, "ProducerID": "00" * 16, "Lost": "tcp://127.0.0.1:1"}
    return st.one_of(
        mutated(template, ["ProducerID", "Lost", "CMD"]), bson_garbage(commands), random_frames()
    )


def rules() -> st.SearchStrategy[Frames]:
    """B+4: rules pushes, always for a name no queue may have."""
    commands = [int(AdminCommand.ADD_AUTOSCALING_RULE)]

    @st.composite
    def push(draw: st.DrawFn) -> Frames:
        template = {"CMD": 2006, "RESULT": 0, "QName": draw(st.sampled_from(BAD_NAMES)),
                    "HostCPU": 1.0, "Version": 1}  # fmt: skip
        return draw(mutated(template, ["QName", "HostCPU", "Version"]))

    return st.one_of(push(), bson_garbage(commands).filter(_bad_queue), random_frames(2))


def _bad_queue(frames: Frames) -> bool:
    try:
        return bson.decode(frames[0]).get("QName") is None
    except Exception:
        return True


def child_control() -> st.SearchStrategy[Frames]:
    """B+5 and F+2: PING, REPLICAS with bad entries, unknown commands; never SHUTDOWN."""
    commands = [int(c) for c in ChildCommand if c != SHUTDOWN]
    entry = {"Id": "fz-r", "Endpoint": "tcp://127.0.0.1:1"}

    @st.composite
    def replicas(draw: st.DrawFn) -> Frames:
        broken = draw(mutated(entry, ["Id", "Endpoint"]))
        entries = [bson.decode(broken[0])] * draw(st.sampled_from([1, 2, 300]))
        return [raw_bson([("CMD", 1030), ("Replicas", entries), ("Leaders", ["fz-l"])])]

    return st.one_of(replicas(), bson_garbage(commands), random_frames()).filter(_not_shutdown)


def statistics() -> st.SearchStrategy[Frames]:
    """S+0: KPI envelopes (1 to 3 BSON frames) with bad contents, or garbage."""
    frame = st.builds(lambda d: raw_bson(list(d.items())),
                      st.dictionaries(st.sampled_from(["CMD", "X_ID", "QName", "CPU", "Time"]),
                                      _bad_values(), max_size=4))  # fmt: skip
    return st.one_of(st.lists(frame, min_size=1, max_size=4), random_frames(4))


PRODUCER = bytes(range(16))


def _good_batch(key: bytes, count: int, metas: list[bytes] | None = None) -> bytearray:
    stamps = [time.time_ns() // 1000] * count
    payloads = [b"p%d" % n for n in range(count)]
    metas = None if metas is None else (metas * count)[:count]
    return bytearray(batchfmt.encode_batch(PRODUCER, 0, key, payloads, stamps, metas))


# v2 records' metas (log format v2): headers, an id, times, or none (b"")
_METAS = st.lists(
    st.sampled_from([
        b"",
        batchfmt.encode_meta({"trace": b"t" * 32, "type": "x"}),
        batchfmt.encode_meta(message_id=bytes(16), expires_at_us=2**63 - 1, not_before_us=-1),
        batchfmt.encode_meta([(f"h{i}", b"v" * 200) for i in range(32)]),
    ]),
    min_size=1, max_size=4,
)  # fmt: skip


def _fix_crc(batch: bytearray) -> bytes:
    if len(batch) >= batchfmt.HEADER_BYTES:
        crc = zlib.crc32(batch[batchfmt.CRC_START :])
        struct.pack_into("<I", batch, 12, crc)
    return bytes(batch)


@st.composite
def bad_batches(draw: st.DrawFn) -> bytes:
    """A batch (v1, or v2 with metas) with the right CRC and bad contents: a header field,
    record length or meta byte overwritten with an extreme value, a truncated or padded body."""
    metas = draw(st.one_of(st.none(), _METAS))  # a v1 batch, or a v2 one
    batch = _good_batch(draw(st.binary(min_size=1, max_size=8)), draw(st.integers(1, 4)), metas)
    at = draw(st.integers(0, len(batch) - 1))
    width = draw(st.sampled_from([1, 2, 4, 8]))
    value = draw(st.sampled_from([0, 1, 2 ** (width * 8) - 1, 2 ** (width * 8 - 1), 2**63 + 5]))
    raw = (value % (2 ** (width * 8))).to_bytes(width, "little")
    batch[at : at + width] = raw[: len(batch) - at]
    shape = draw(st.sampled_from(["same", "same", "cut", "pad"]))
    if shape == "cut":
        batch = batch[: draw(st.integers(0, len(batch)))]
    elif shape == "pad":
        batch += draw(st.binary(min_size=1, max_size=16))
    return _fix_crc(batch)


def exchange_front() -> st.SearchStrategy[Frames]:
    token = st.one_of(st.just(dataplane.TOKEN.pack(7)), st.binary(max_size=12))
    kinds = st.sampled_from([dataplane.BATCH, dataplane.CONFIRMED_BATCH,
                             dataplane.COMMITTED_BATCH, dataplane.DRAIN, b"Z", b""])  # fmt: skip
    return st.one_of(
        st.builds(lambda b: [dataplane.BATCH, b], bad_batches()),
        st.builds(lambda t, b: [dataplane.CONFIRMED_BATCH, t, b], token, bad_batches()),
        st.builds(lambda k, t, b: [k, t, b], kinds, token, bad_batches()),
        st.builds(lambda k, rest: [k, *rest], kinds, random_frames(3)),
    )


def subscription_frames() -> st.SearchStrategy[Frames]:
    """F+1, through an XSUB: (un)subscribe frames and anything else."""
    return st.one_of(
        st.builds(lambda p: [b"\x01" + p], st.binary(max_size=300)),
        st.builds(lambda p: [b"\x00" + p], st.binary(max_size=300)),
        random_frames(3),
    )


_U64 = st.sampled_from([0, 1, 2**31, 2**60, 2**63 - 1, 2**63, 2**63 + 5, 2**64 - 1])


def log_port() -> st.SearchStrategy[Frames]:
    """F+3: log reads (R, T, P) and replication (W, Q, S) with bad numbers and strangers' ids."""
    u64 = _U64.map(lambda n: struct.pack("<Q", n))
    leader = st.one_of(st.sampled_from([b"", b"fz-1", b"..", b"a/b", b"x@y", b"\0"]),
                       st.binary(max_size=300))  # fmt: skip
    read = st.builds(lambda o, n, ld: [dataplane.READ, o + struct.pack("<I", n), *ld], u64,
                     st.sampled_from([0, 1, 2**31, 2**32 - 1]),
                     st.lists(leader, max_size=2))  # fmt: skip
    return st.one_of(
        read,
        st.builds(lambda t, ld: [dataplane.SEEK_TIME, t, *ld], u64, st.lists(leader, max_size=2)),
        st.builds(lambda ld: [dataplane.POSITION, *ld], st.lists(leader, max_size=2)),
        st.builds(lambda ld: [replication.PROBE, ld], leader),
        st.builds(lambda ld, o: [replication.RESTART, ld, o], leader, u64),
        st.builds(lambda ld, o, b: [replication.WRITE, ld, o, b], leader, u64, bad_batches()),
        st.builds(
            lambda ld, o: [replication.WRITE, ld, o, bytes(_good_batch(b"k", 2))], leader, u64
        ),
        random_frames(5),
    )
