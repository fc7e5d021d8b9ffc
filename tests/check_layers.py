"""The layering rules of DESIGN §11, checked on the import statements of every module.

- only roq.transport imports zmq; only roq.coordination imports kazoo; only roq.analytics
  imports pyspark;
- roq.log and roq.protocol import no sockets (no zmq, no socket module, no transport).
Run by `make lint` and by tests/unit/test_layers.py.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "appliance" / "roq"

OWNERS = {"zmq": "transport", "kazoo": "coordination", "pyspark": "analytics"}
PURE = ("log", "protocol")
PURE_FORBIDDEN = ("zmq", "kazoo", "socket", "roq.transport", "roq.coordination")


def imports(path: Path) -> list[str]:
    names: list[str] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.append(node.module)
    return names


def violations() -> list[str]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = path.relative_to(PACKAGE).parts
        top = parts[0] if len(parts) > 1 else ""
        for name in imports(path):
            root = name.split(".")[0]
            owner = OWNERS.get(root)
            if owner is not None and top != owner:
                found.append(f"{path}: imports {name}; only roq.{owner} may")
            if top in PURE and any(name == f or name.startswith(f + ".") for f in PURE_FORBIDDEN):
                found.append(f"{path}: roq.{top} is a pure layer but imports {name}")
    return found


if __name__ == "__main__":
    problems = violations()
    for line in problems:
        print(line)
    sys.exit(1 if problems else 0)
