"""Every znode path is built in coordination/paths.py (issue 28): a module that joins one of its
own drifts from the layout documented there and in docs/architecture.md §3, and a namespace
change or an encoding rule (the HTTP topics' percent-encoding) then misses it.

The check reads every module's syntax tree, so docstrings and comments that show a path
(`<ns>/groups/<queue>`) are not code and pass. Two patterns are refused outside paths.py:

- anywhere in roq: a path joined onto the namespace, `f"{namespace}/…"`, `ns + "/…"` or
  `"/".join([namespace, …])`;
- in roq.coordination, the only package that talks to ZooKeeper (tests/check_layers.py): a path
  joined onto a path, `f"{self.root}/{child}"`, `f"{paths.queue(q)}/x"`, `path + "/x"`. Outside
  it, `root` and `path` are file-system paths (logs, state directories), which are no concern
  here.
"""

from __future__ import annotations

import ast
import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "appliance" / "roq"
PATHS_MODULE = PACKAGE / "coordination" / "paths.py"

NAMESPACE = re.compile(r"\bnamespace\b|\bns\b")
ZNODE = re.compile(r"\bnamespace\b|\bns\b|root|path|znode|parent")


def _joins(tree: ast.AST, source: str, base: re.Pattern[str]) -> Iterator[tuple[int, str]]:
    """(line, code) of every "/" joined onto an expression whose text matches `base`."""

    def based(node: ast.AST) -> bool:
        return bool(base.search(ast.get_source_segment(source, node) or ""))

    def slash(node: ast.AST) -> bool:
        return isinstance(node, ast.Constant) and str(node.value).startswith("/")

    for node in ast.walk(tree):
        found = False
        if isinstance(node, ast.JoinedStr):
            parts = node.values
            found = any(
                isinstance(part, ast.FormattedValue) and based(part.value) and slash(following)
                for part, following in itertools.pairwise(parts)
            )
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            found = based(node.left) and slash(node.right)
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "join"
            and isinstance(node.func.value, ast.Constant)
            and node.func.value.value == "/"
        ):
            found = any(based(argument) for argument in node.args)
        if found:
            yield node.lineno, ast.get_source_segment(source, node) or ""


def znode_joins(path: Path, source: str) -> list[str]:
    """The lines of `source` (the module at `path`) that build a znode path of their own."""
    tree = ast.parse(source, str(path))
    coordination = path.parent.name == "coordination"
    found = sorted(set(_joins(tree, source, ZNODE if coordination else NAMESPACE)))
    return [f"{path.relative_to(PACKAGE.parent)}:{line}: {code}" for line, code in found]


def test_only_paths_py_builds_znode_paths():
    modules = [p for p in sorted(PACKAGE.rglob("*.py")) if p != PATHS_MODULE]
    assert len(modules) > 50  # the scan found the package
    found = [line for module in modules for line in znode_joins(module, module.read_text())]
    assert found == [], "build these in coordination/paths.py (Paths):\n" + "\n".join(found)


@pytest.mark.parametrize(
    ("where", "code"),
    [
        ("monitor", 'root = f"{namespace}/groups/{queue}"'),
        ("http", 'root = f"{settings.zk.namespace}/http/topics"'),
        ("gcm", 'root = ns + "/tasks"'),
        ("host", 'root = "/".join([self.namespace, "hosts", name])'),
        ("coordination", 'path = f"{self.root}/{task}"'),
        ("coordination", 'path = f"{self.paths.queue(q)}/extra"'),
        ("coordination", 'parent = root.rsplit("/", 1)[0] + "/principals"'),
    ],
)
def test_a_znode_path_built_elsewhere_is_found(where: str, code: str):
    assert znode_joins(PACKAGE / where / "example.py", code)


@pytest.mark.parametrize(
    ("where", "code"),
    [
        ("coordination", '"""<ns>/groups/<queue>/<group>  the group\'s record"""'),
        ("coordination", "path = self.paths.task(self.queue, task)"),
        ("coordination", 'raise CoordinationError(f"writing {path}: {error!r}")'),
        ("log", 'segment = f"{root}/{offset:020d}.log"'),  # a file, outside coordination
        ("http", 'url = f"http://{host}:{port}/topics/{topic}"'),
    ],
)
def test_paths_from_paths_py_docstrings_and_files_pass(where: str, code: str):
    assert znode_joins(PACKAGE / where / "example.py", code) == []
