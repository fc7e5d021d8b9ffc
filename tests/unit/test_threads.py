"""docs/architecture.md §8 names every thread roq's code starts: this test reads each
`threading.Thread(...)`, each `threading.Thread` subclass's `super().__init__(name=...)` and each
`ThreadPoolExecutor(thread_name_prefix=...)` in appliance/roq, and checks the list against the
section's thread table, both ways, with the module each row names. A thread without a name, or a
name the table lacks, fails here rather than drifting from the document."""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PACKAGE = REPO / "appliance" / "roq"
ARCHITECTURE = REPO / "docs" / "architecture.md"
VARYING = "…"  # how §8 writes the part of a name that varies


def _name_of(node: ast.expr | None) -> str | None:
    """The thread name a constructor argument gives: a literal as is, an f-string's literal head
    followed by `…`, a slice of either (`f"roq-flush-{name}"[:64]`) as the sliced; None if the
    name is absent or not written in place."""
    if isinstance(node, ast.Subscript):
        return _name_of(node.value)
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        head = ""
        for part in node.values:
            if not (isinstance(part, ast.Constant) and isinstance(part.value, str)):
                return head + VARYING
            head += part.value
        return head
    return None


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _callee(call: ast.Call) -> str:
    func = call.func
    if isinstance(func, ast.Attribute):
        return func.attr
    return func.id if isinstance(func, ast.Name) else ""


def _is_thread_class(node: ast.ClassDef) -> bool:
    return any(
        (isinstance(base, ast.Attribute) and base.attr == "Thread")
        or (isinstance(base, ast.Name) and base.id == "Thread")
        for base in node.bases
    )


def _super_init(node: ast.ClassDef) -> ast.Call | None:
    for call in ast.walk(node):
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and call.func.attr == "__init__"
            and isinstance(call.func.value, ast.Call)
            and _callee(call.func.value) == "super"
        ):
            return call
    return None


def threads_in_code() -> tuple[dict[str, str], list[str]]:
    """{thread name: module relative to appliance/roq}, and the unnamed constructions found."""
    found: dict[str, str] = {}
    unnamed: list[str] = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(PACKAGE).as_posix()
        tree = ast.parse(path.read_text(), filename=str(path))
        constructions: list[tuple[ast.Call, str]] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef) and _is_thread_class(node):
                init = _super_init(node)
                if init is None:
                    unnamed.append(f"{module}:{node.lineno} class {node.name}")
                else:
                    constructions.append((init, "name"))
            elif isinstance(node, ast.Call) and _callee(node) in ("Thread", "Timer"):
                constructions.append((node, "name"))
            elif isinstance(node, ast.Call) and _callee(node) == "ThreadPoolExecutor":
                constructions.append((node, "thread_name_prefix"))
        for call, argument in constructions:
            name = _name_of(_keyword(call, argument))
            if name is None:
                unnamed.append(f"{module}:{call.lineno}")
                continue
            if argument == "thread_name_prefix":
                name += "_" + VARYING  # the pool names its threads prefix_0, prefix_1, ...
            found[name] = module
    return found, unnamed


def threads_in_architecture() -> dict[str, str]:
    """{thread name: module} from the thread table of architecture.md §8 (the table whose
    header starts `| thread | code |`)."""
    text = ARCHITECTURE.read_text()
    section = text[text.index("## 8. ") : text.index("## 9. ")]
    lines = section.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| thread | code |"))
    rows: dict[str, str] = {}
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        name, code = cells[0].strip("`"), cells[1]
        rows[name] = code.split("`")[1]
    return rows


def test_every_thread_is_named():
    _, unnamed = threads_in_code()
    assert unnamed == [], "give these threads a name= and a row in architecture.md §8"


def test_architecture_lists_every_thread_the_code_starts():
    code, _ = threads_in_code()
    documented = threads_in_architecture()
    missing = {name: module for name, module in code.items() if name not in documented}
    assert missing == {}, "threads missing from architecture.md §8's thread table"


def test_architecture_lists_no_thread_the_code_does_not_start():
    code, _ = threads_in_code()
    documented = threads_in_architecture()
    stale = sorted(set(documented) - set(code))
    assert stale == [], "architecture.md §8 names threads no code starts"


def test_each_thread_is_listed_with_its_module():
    code, _ = threads_in_code()
    documented = threads_in_architecture()
    wrong = {
        name: (documented[name], module)
        for name, module in code.items()
        if name in documented and documented[name] != module
    }
    assert wrong == {}, "(architecture.md says, the code is in)"


def test_names_are_read_as_written():
    """The reader itself: a literal, an f-string's head, a slice, a pool's prefix."""
    source = (
        "import threading\n"
        "threading.Thread(target=f, name='a-b')\n"
        "threading.Thread(target=f, name=f'c-{x}-d')\n"
        "threading.Thread(target=f, name=f'e-{x}'[:64])\n"
        "threading.Thread(target=f)\n"
    )
    calls = [n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.Call)]
    names = [_name_of(_keyword(c, "name")) for c in calls if _callee(c) == "Thread"]
    assert names == ["a-b", "c-…", "e-…", None]
