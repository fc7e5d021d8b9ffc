"""The compiled batch loops (roq.log._native, mypyc) against the pure-Python format: the same
batches byte for byte, the same records, the same verdict and error on damaged bytes; the switch
ROQ_PURE_PYTHON; and an extension never older than its source (a stale one would be what the
tests test)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from logutil import PRODUCER

from roq.errors import CorruptRecord
from roq.log import format as fmt

ROOT = Path(__file__).resolve().parents[2]
TS = 1_700_000_000_000_000

compiled = pytest.mark.skipif(fmt._native is None, reason="roq.log._native is not compiled here")


def _pure(call: Callable[[], Any]) -> Any:
    loaded = fmt._native
    fmt._native = None
    try:
        return call()
    finally:
        fmt._native = loaded


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    """What a call returned, or the type and message of what it raised."""
    try:
        return "ok", call()
    except (CorruptRecord, ValueError) as error:
        return type(error).__name__, str(error)


def _records(batch: bytes) -> Callable[[], Any]:
    return lambda: list(fmt.iter_records(batch))


def _checked(batch: bytes) -> Callable[[], Any]:
    return lambda: fmt.validate_batch(batch).count


batches = st.tuples(
    st.integers(0, 2**63 - 2**20),  # first_seq
    st.binary(max_size=32),  # key
    st.lists(st.binary(max_size=300), min_size=1, max_size=40),  # payloads
    st.lists(st.integers(0, 2**32 - 1), min_size=40, max_size=40),  # timestamp deltas
)


@compiled
@settings(max_examples=150, deadline=None)
@given(batches, st.data())
def test_compiled_and_pure_agree_on_every_batch_and_every_damage(
    spec: tuple[int, bytes, list[bytes], list[int]], data: st.DataObject
) -> None:
    seq, key, payloads, deltas = spec
    stamps = [TS] + [TS + d for d in deltas[1 : len(payloads)]]
    batch = fmt.encode_batch(PRODUCER, seq, key, payloads, stamps)
    assert batch == _pure(lambda: fmt.encode_batch(PRODUCER, seq, key, payloads, stamps))
    assert [r.payload for r in fmt.iter_records(batch)] == payloads
    # damage: a byte changed, or the batch cut short, then the CRC made right again so the
    # record walk (not the CRC) has to find it
    damaged = bytearray(batch[: data.draw(st.integers(fmt.HEADER_BYTES, len(batch)))])
    at = data.draw(st.integers(fmt.HEADER_BYTES, max(fmt.HEADER_BYTES, len(damaged) - 1)))
    if at < len(damaged):
        damaged[at] = data.draw(st.integers(0, 255))
    fmt.LENGTH.pack_into(damaged, 0, len(damaged) - 4)
    fmt.LENGTH.pack_into(damaged, 12, fmt.zlib.crc32(damaged[fmt.CRC_START :]))
    for call in (_records(bytes(damaged)), _checked(bytes(damaged))):
        assert _outcome(call) == _pure(lambda c=call: _outcome(c))  # type: ignore[misc]


@compiled
@pytest.mark.parametrize("stamps", [[TS, TS - 1], [TS, TS + 2**32], [-1, 0]])
def test_timestamps_the_format_cannot_hold_are_refused_both_ways(stamps: list[int]) -> None:
    def encode() -> bytes:
        return fmt.encode_batch(PRODUCER, 0, b"k", [b"a", b"b"], stamps)

    with pytest.raises(ValueError, match=r"not within|not an unsigned"):
        encode()
    with pytest.raises(fmt.struct.error):
        _pure(encode)


@compiled
def test_payloads_that_are_not_bytes_take_the_pure_path() -> None:
    payloads = [bytearray(b"ab"), memoryview(b"cd")]
    batch = fmt.encode_batch(PRODUCER, 0, b"k", payloads, [TS, TS])  # type: ignore[list-item]
    assert [r.payload for r in fmt.iter_records(batch)] == [b"ab", b"cd"]


@pytest.fixture
def pure_python_env() -> Iterator[dict[str, str]]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "appliance")}
    yield env


@pytest.mark.parametrize(("value", "expected"), [("1", "False"), ("0", str(fmt.NATIVE))])
def test_roq_pure_python_keeps_the_compiled_loops_out(
    pure_python_env: dict[str, str], value: str, expected: str
) -> None:
    env = {**pure_python_env, fmt.PURE_PYTHON_ENV: value}
    said = subprocess.run(
        [sys.executable, "-c", "from roq.log import format; print(format.NATIVE)"],
        env=env, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert said.stdout.strip() == expected


def test_a_built_extension_is_not_older_than_its_source() -> None:
    sys.path.insert(0, str(ROOT / "packaging"))
    try:
        import build_native
    finally:
        sys.path.remove(str(ROOT / "packaging"))
    if not any(build_native.extension(s).exists() for s in build_native.SOURCES):
        pytest.skip("roq.log._native is not compiled here (make setup builds it)")
    assert not build_native.stale(), "run `make native`: roq/log/_native.py changed since"
