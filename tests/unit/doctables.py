"""Helpers shared by the docs-versus-code tests: read a page's sections and markdown tables."""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
CODE = REPO / "appliance" / "roq"


def section(page: Path, heading: str) -> str:
    """The text under the first heading line that starts with `heading` (`## 3. `), up to the
    next heading of the same or a higher level."""
    lines = page.read_text().splitlines()
    level = len(heading) - len(heading.lstrip("#"))
    start = next(i for i, line in enumerate(lines) if line.startswith(heading))
    end = len(lines)
    for i in range(start + 1, len(lines)):
        hashes = len(lines[i]) - len(lines[i].lstrip("#"))
        if 0 < hashes <= level and lines[i][hashes : hashes + 1] == " ":
            end = i
            break
    return "\n".join(lines[start:end])


def cells(line: str) -> list[str]:
    """The cells of one table row (`\\|` inside a cell is not a separator)."""
    parts = re.split(r"(?<!\\)\|", line.strip().strip("|"))
    return [part.strip().replace("\\|", "|") for part in parts]


def tables(text: str) -> list[list[list[str]]]:
    """Every markdown table in `text`, each a list of rows (header first, the `|---|` line
    left out), each row a list of cells."""
    found: list[list[list[str]]] = []
    rows: list[list[str]] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("|"):
            if not re.fullmatch(r"\|[\s|:-]+\|", line.strip()):
                rows.append(cells(line))
        elif rows:
            found.append(rows)
            rows = []
    return found


def table(text: str, header: str) -> list[list[str]]:
    """The rows (header left out) of the one table in `text` whose header row starts with the
    cells `header` names, e.g. "| code | meaning |"."""
    wanted = cells(header)
    matching = [rows for rows in tables(text) if rows[0][: len(wanted)] == wanted]
    assert len(matching) == 1, f"expected one table headed {header!r}, found {len(matching)}"
    return matching[0][1:]
