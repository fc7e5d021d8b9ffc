"""`roq log inspect` run as the real console script on real segment files."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from logutil import batch, torn

from roq.log import FlushPolicy, Log
from roq.system.spawn import child_environment

ROQ = Path(sys.executable).parent / "roq"


def inspect(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(ROQ), "log", "inspect", *args],
        capture_output=True,
        text=True,
        timeout=30,
        env=child_environment(),
    )


def make_log(directory: Path) -> Path:
    log_dir = directory / "q1" / "x1"
    with Log(log_dir, max_file_size=400, flush_policy=FlushPolicy("os")) as log:
        for i in range(6):
            log.append(batch(i * 3))
    return log_dir


def test_inspect_a_clean_directory(tmp_path):
    make_log(tmp_path)
    result = inspect(str(tmp_path), "--records")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    batches = [line for line in lines if line.startswith("offset=")]
    assert len(batches) == 6
    assert batches[1].startswith("offset=145 producer=00010203-0405-0607-0809-0a0b0c0d0e0f")
    assert "seq=3..5 count=3 key=key" in batches[1]
    assert sum(line.startswith("  seq=") for line in lines) == 18
    assert "summary: 3 segments, 6 batches, 18 records, 870 bytes, 1 producers" in result.stdout
    assert lines[-1] == "clean"


def test_inspect_json_of_one_segment_file(tmp_path):
    log_dir = make_log(tmp_path)
    result = inspect(str(sorted(log_dir.iterdir())[1]), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["clean"] and summary["segments"] == 1 and summary["batches"] == 2
    assert summary["first_ts_us"] == 1_700_000_000_000_006
    assert summary["last_ts_us"] == 1_700_000_000_000_011


def test_inspect_a_corrupted_directory_names_file_and_offset(tmp_path):
    log_dir = make_log(tmp_path)
    first, _, last = sorted(log_dir.iterdir())
    data = bytearray(first.read_bytes())
    data[100] ^= 0x01  # CRC mismatch in the first batch
    first.write_bytes(data)
    with open(last, "ab") as file:
        file.write(b"\0" * 64)  # zeroed tail
    result = inspect(str(tmp_path), "--json")
    assert result.returncode == 65
    summary = json.loads(result.stdout)
    assert summary["batches"] == 5
    spans = [(c["file"], c["offset"], c["bytes"]) for c in summary["corrupt"]]
    assert spans == [(str(first), 0, 145), (str(last), 870, 64)]
    assert "CRC mismatch" in summary["corrupt"][0]["reason"]
    assert "zeroed" in summary["corrupt"][1]["reason"]
    text = inspect(str(tmp_path))
    assert text.returncode == 65
    assert f"CORRUPT {first} offset=0" in text.stdout
    assert "CORRUPTION FOUND" in text.stdout


def test_inspect_skips_and_counts_a_batch_with_torn_records_and_reads_on(tmp_path):
    """A CRC that holds over records that do not fill their batch (a disk error the CRC cannot
    see): the batch is reported with its records, and the batch after it is still read."""
    log_dir = make_log(tmp_path)
    first = sorted(log_dir.iterdir())[0]
    first.write_bytes(torn(first.read_bytes(), 0))
    result = inspect(str(log_dir), "--json")
    assert result.returncode == 65
    summary = json.loads(result.stdout)
    assert summary["batches"] == 5 and summary["records"] == 15
    assert summary["skipped_records"] == 3
    [span] = summary["corrupt"]
    assert (span["offset"], span["bytes"], span["records"]) == (0, 145, 3)
    assert "record 1 of batch" in span["reason"]
    text = inspect(str(log_dir))
    assert f"CORRUPT {first} offset=0 byte=0 bytes=145" in text.stdout
    assert "(3 records skipped)" in text.stdout
    assert "offset=145 producer=" in text.stdout  # the next batch of the same file
    assert "skipped 1 corrupt span(s) (3 records known)" in text.stdout


def test_inspect_reports_a_missing_segment_as_a_gap(tmp_path):
    log_dir = make_log(tmp_path)
    sorted(log_dir.iterdir())[1].unlink()
    result = inspect(str(log_dir), "--json")
    assert result.returncode == 65
    assert json.loads(result.stdout)["gaps"] == [
        {"directory": str(log_dir), "start": 290, "end": 580}
    ]


def test_inspect_a_missing_path(tmp_path):
    result = inspect(str(tmp_path / "nope"))
    assert result.returncode == 66
    assert "no such file" in result.stderr
