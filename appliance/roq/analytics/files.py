"""Where segments are and how executors open them: pyarrow's filesystems, so the same code reads a
local directory and an `s3a://bucket/prefix` (mapped to pyarrow's S3 filesystem, credentials from
the usual AWS chain, e.g. the EC2 instance profile). Executors seek and read byte ranges; no file
is ever read whole.

Layout: `<log-dir>/<queue>/<exchange_id>/<20-digit base offset>.log` for the message log and
`<kpi-dir>/_kpi/<source>/<20-digit base offset>.log` for the KPI log (roq.log names segments).
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from pyarrow import fs

from roq.analytics.kpi import KPI_DIR
from roq.log import parse_segment_name


@dataclass(frozen=True)
class SegmentFile:
    uri: str  # what an executor opens
    kind: str  # "log" or "kpi"
    queue: str  # the queue, or "_kpi"
    source: str  # the exchange id, or the KPI source
    base: int  # the segment's base offset (from its name)
    size: int


@dataclass(frozen=True)
class Task:
    file: SegmentFile
    start: int
    end: int


def resolve(uri: str) -> tuple[fs.FileSystem, str]:
    """A pyarrow filesystem and the path inside it for a local path or a URI (s3a:// → s3://)."""
    if "://" not in uri:
        return fs.LocalFileSystem(), os.path.abspath(uri)
    if uri.startswith("s3a://"):
        uri = "s3://" + uri.removeprefix("s3a://")
    filesystem, path = fs.FileSystem.from_uri(uri)
    return filesystem, path


def join(root: str, relative: str) -> str:
    return root.rstrip("/") + "/" + relative


def list_segments(root: str, kind: str) -> list[SegmentFile]:
    """Every well-named segment under `root` (metadata only: names and sizes)."""
    filesystem, path = resolve(root)
    infos = filesystem.get_file_info(fs.FileSelector(path, recursive=True, allow_not_found=True))
    found: list[SegmentFile] = []
    for info in infos:
        if info.type != fs.FileType.File:
            continue
        parts = info.path[len(path.rstrip("/")) + 1 :].split("/")
        base = parse_segment_name(parts[-1])
        if base is None or len(parts) != 3:
            continue
        queue, source = parts[0], parts[1]
        if (kind == "kpi") != (queue == KPI_DIR):
            continue
        uri = join(root, "/".join(parts))
        found.append(SegmentFile(uri, kind, queue, source, base, info.size))
    return sorted(found, key=lambda f: f.uri)


def plan(files: list[SegmentFile], split_bytes: int) -> list[Task]:
    """Cut each file into ranges of about `split_bytes` (a file smaller than that is one task)."""
    assert split_bytes > 0
    tasks = []
    for file in files:
        for start in range(0, max(file.size, 1), split_bytes):
            tasks.append(Task(file, start, min(start + split_bytes, file.size)))
    return tasks
