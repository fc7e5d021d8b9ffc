"""Every test the docs name exists: a `file.py::name` citation names a file that exists and a
function or class defined in it (`::name` alone continues the file cited before it on the
page), a bare `test_name` is a test function or test module somewhere under tests/, and a
`tests/….py` path cited in the docs or in a module of appliance/ is a file.

A citation that outlives its test reads as a guarantee nobody checks any more."""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
from doctables import CODE, DOCS, REPO

PAGES = [*sorted(DOCS.glob("*.md")), REPO / "README.md"]
TESTS = REPO / "tests"
# `file.py::name`; a file alone (`tests/x.py`), which later `::name`s continue; `::name`.
# `name` may be `Class.method`.
CITATION = re.compile(
    r"(?<![\w/.-])((?:[\w.-]+/)*[\w-]+\.py)(?:::(\w+(?:\.\w+)*))?"
    r"|(?<![\w/.:-])::(\w+(?:\.\w+)*)"
)
# A test named alone: not part of a path (`/tmp/x/test_y_0/` is pytest's temporary directory),
# a file name or a citation.
BARE_TEST = re.compile(r"(?<![\w/.:-])test_\w+(?![\w.:/])")
TEST_PATH = re.compile(r"(?<![\w/.-])tests/[\w/]+\.py")


@functools.cache
def defined(path: Path) -> frozenset[str]:
    """Every function and class name defined in `path`, at any depth."""
    tree = ast.parse(path.read_text())
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    return frozenset(node.name for node in ast.walk(tree) if isinstance(node, kinds))


@functools.cache
def names_of_tests() -> frozenset[str]:
    """Every test module's stem and every test function or class name under tests/."""
    names: set[str] = set()
    for path in TESTS.rglob("*.py"):
        names.add(path.stem)
        names |= defined(path)
    return frozenset(names)


def resolve(cited: str) -> Path | None:
    """The file a citation names: from the repository, tests/, or the package (the docs write
    `integration/test_x.py`, `tests/unit/test_x.py`, `monitor/placement.py`, `messages/host.py`),
    or a test module cited by its name alone (`test_http.py`)."""
    for root in (REPO, TESTS, CODE, CODE / "protocol"):
        if (root / cited).is_file():
            return root / cited
    if "/" not in cited:
        found = sorted(TESTS.rglob(cited))
        if len(found) == 1:
            return found[0]
    return None


def broken_citations(page: Path) -> list[str]:
    """What `page` cites that does not exist. A `::name` after a file cited alone belongs to
    that file, or, as prose returns to a file named earlier, to any file cited before it."""
    broken: list[str] = []
    cited_before: list[Path] = []  # most recent first
    for match in CITATION.finditer(page.read_text()):
        cited, name = match.group(1), match.group(2) or match.group(3)
        if cited:
            path = resolve(cited)
            if path is None:
                if name:
                    broken.append(f"{cited}: no such file")
                continue
            if path in cited_before:
                cited_before.remove(path)
            cited_before.insert(0, path)
            if name and name.split(".")[-1] not in defined(path):
                broken.append(f"{cited}::{name}: not defined there")
        elif not any(name.split(".")[-1] in defined(path) for path in cited_before):
            where = cited_before[0].relative_to(REPO) if cited_before else "no file cited"
            broken.append(f"::{name}: not defined in {where} nor in a file cited before it")
    return broken


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_cited_test_exists(page: Path):
    broken = broken_citations(page)
    assert broken == [], f"{page.name} cites what does not exist: fix or remove these citations"


@pytest.mark.parametrize("page", PAGES, ids=lambda page: page.name)
def test_every_test_named_alone_exists(page: Path):
    missing = sorted({m.group(0) for m in BARE_TEST.finditer(page.read_text())} - names_of_tests())
    assert missing == [], f"{page.name} names tests that do not exist under tests/"


def test_every_cited_test_file_exists():
    sources = [*PAGES, *sorted(CODE.rglob("*.py"))]
    missing = sorted(
        f"{source.relative_to(REPO)}: {path}"
        for source in sources
        for path in set(TEST_PATH.findall(source.read_text()))
        if not (REPO / path).is_file()
    )
    assert missing == [], "these name test files that do not exist"


def test_a_citation_of_a_missing_test_is_found(tmp_path: Path):
    page = tmp_path / "page.md"
    page.write_text(
        "`tests/unit/test_doc_citations.py::test_every_cited_test_exists` and "
        "`::test_that_was_renamed`; `unit/test_gone.py::test_x`; `::orphan` after it; "
        "`tests/unit/test_doc_citations.py`, `::test_a_citation_of_a_missing_test_is_found`"
    )
    assert broken_citations(page) == [
        "::test_that_was_renamed: not defined in tests/unit/test_doc_citations.py "
        "nor in a file cited before it",
        "unit/test_gone.py: no such file",
        "::orphan: not defined in tests/unit/test_doc_citations.py nor in a file cited before it",
    ]
