"""The tables in docs/ and README.md that mirror code are checked against it, both ways: every
item of the code is in the table, and every row of the table is in the code. A failure names
what to add to the page or remove from it. (Threads: tests/unit/test_threads.py; the shipped
properties files: tests/unit/test_config.py.)

Each test reads the table where a reader finds it, so the pages keep their own wording; what
is compared is what the code defines: names, numbers, offsets, paths and defaults."""

from __future__ import annotations

import ast
import enum
import importlib
import inspect
import re
from fractions import Fraction

import pytest
from doctables import CODE, DOCS, REPO, section, table

from roq import config, limits
from roq.config.keys import Key, _fmt, render_value
from roq.coordination import paths
from roq.http.index import TopicIndex
from roq.http.metrics import Metrics
from roq.protocol import commands, ports


def differences(code: set, documented: set, page: str) -> list[str]:
    """What `page` lacks (add) and what it has that the code does not (remove)."""
    add = [f"add to {page}: {item}" for item in sorted(code - documented, key=str)]
    remove = [f"remove from {page}: {item}" for item in sorted(documented - code, key=str)]
    return add + remove


# --- exit codes (roq/errors.py and the EXIT_* of cli/) ---------------------------------------


def exit_codes_in_code() -> dict[int, str]:
    """{code: constant} for every module-level EXIT_* constant under appliance/roq."""
    found: dict[int, str] = {}
    for path in CODE.rglob("*.py"):
        for node in ast.parse(path.read_text()).body:
            if (
                isinstance(node, ast.Assign)
                and len(node.targets) == 1
                and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id.startswith("EXIT_")
                and isinstance(node.value, ast.Constant)
            ):
                found[node.value.value] = f"{node.targets[0].id} ({path.relative_to(CODE)})"
    return found


def documented_exit_codes(page: str, heading: str) -> set[int]:
    rows = table(section(REPO / page, heading), "| code | meaning |")
    return {int(row[0]) for row in rows}


def test_readme_lists_every_exit_code_and_no_other():
    code = exit_codes_in_code()
    documented = documented_exit_codes("README.md", "## Exit codes")
    wrong = differences(set(code), documented, "README.md's exit codes")
    assert wrong == [], f"the exit codes are {code}"


def test_operations_lists_only_exit_codes_that_exist():
    # The daemons' codes: a subset (no 65, 66, 74: those are `roq log inspect`'s).
    documented = documented_exit_codes("docs/operations.md", "## Exit codes")
    wrong = differences(set(), documented - set(exit_codes_in_code()), "operations.md")
    assert wrong == []


# --- command numbers (protocol/commands.py) --------------------------------------------------

# Which section of protocol.md documents each channel's commands.
COMMAND_SECTIONS: dict[type[enum.IntEnum], list[str]] = {
    commands.AdminCommand: ["### Admin API"],
    commands.BroadcastCommand: ["### Config broadcast"],
    commands.HostCommand: ["## Host"],
    commands.ChildCommand: ["## Child control"],
    commands.MonitorCommand: ["### Exchange reports", "### Placement"],
    commands.StatCommand: ["### Statistics in"],
    commands.PublisherNotice: ["### Notices to publishers"],
    commands.SubscriberNotice: ["### Notices to subscribers"],
}
# How protocol.md pairs a number with its name: in a table row, `| 2000 | `NAME` |` (the first
# two cells) or `1 `NAME`` in a cell; in prose, `CMD 8 `NAME`` or `` `NAME` (1500) ``.
ROW_NUMBER_NAME = re.compile(r"^\|\s*(\d+)\s*\|\s*`([A-Z][A-Z0-9_]+)`")
CELL_NUMBER_NAME = re.compile(r"(?<![\w.])(\d+) `([A-Z][A-Z0-9_]+)`")
PROSE_NUMBER_NAME = re.compile(r"\bCMD (\d+) `([A-Z][A-Z0-9_]+)`")
NAME_NUMBER = re.compile(r"`([A-Z][A-Z0-9_]+)` \((\d+)\)")


def documented_commands(headings: list[str]) -> set[tuple[int, str]]:
    text = "\n".join(section(DOCS / "protocol.md", heading) for heading in headings)
    pairs = PROSE_NUMBER_NAME.findall(text)
    pairs += [(number, name) for name, number in NAME_NUMBER.findall(text)]
    for line in text.splitlines():
        if line.startswith("|"):
            pairs += ROW_NUMBER_NAME.findall(line) + CELL_NUMBER_NAME.findall(line)
    return {(int(number), name) for number, name in pairs}


def test_every_channel_enum_has_a_section():
    channels = {
        value
        for value in vars(commands).values()
        if inspect.isclass(value) and issubclass(value, enum.IntEnum) and value is not enum.IntEnum
    }
    assert channels - {commands.Result} == set(COMMAND_SECTIONS), "give it a section above"


@pytest.mark.parametrize("channel", list(COMMAND_SECTIONS), ids=lambda channel: channel.__name__)
def test_protocol_documents_every_command_of_a_channel_and_no_other(channel):
    code = {(int(command), command.name) for command in channel}
    documented = documented_commands(COMMAND_SECTIONS[channel])
    headings = " + ".join(COMMAND_SECTIONS[channel])
    assert differences(code, documented, f"protocol.md {headings}") == []


# --- ports (protocol/ports.py) ---------------------------------------------------------------

BLOCKS: dict[str, type[enum.IntEnum]] = {
    "P": ports.GcmPort,
    "B": ports.MonitorPort,
    "S": ports.StatPort,
    "F": ports.ExchangePort,
}
SOCKET = r"(REP|REQ|ROUTER|DEALER|PUB|SUB|XPUB|XSUB|PUSH|PULL|PAIR)"


def ports_in_code() -> set[str]:
    return {f"{letter}+{int(offset)}" for letter, block in BLOCKS.items() for offset in block}


def sockets_in_architecture() -> dict[str, str]:
    """{"B+1": "ROUTER", …} from architecture.md §2's port table."""
    found: dict[str, str] = {}
    for row in table(section(DOCS / "architecture.md", "## 2. Ports"), "| component | ports |"):
        component, offsets, sockets = row[0], row[1], row[2]
        if component == "GCM":  # "P+0, P+3, P+5 …" beside "REP topology, REP admin, …"
            named = re.findall(r"\bP\+\d", offsets)
            kinds = re.findall(rf"\b{SOCKET}\b", sockets)
            assert len(named) == len(kinds), f"architecture.md §2, GCM: {offsets} / {sockets}"
            found.update(zip(named, kinds, strict=True))
            continue
        for letter, offset, kind in re.findall(rf"\b([PBSF])(\+\d)?\s+{SOCKET}\b", sockets):
            found[letter + (offset or "+0")] = kind
    return found


def sockets_in_ports_docstring() -> dict[str, str]:
    """{"B+1": "ROUTER", …} from protocol/ports.py's docstring."""
    docstring = ports.__doc__ or ""
    return dict(re.findall(rf"\b([PBSF]\+\d) [^()]*?\({SOCKET}\)", docstring))


def sockets_in_protocol() -> dict[str, str]:
    """{"B+1": "ROUTER", …} from protocol.md's table of a monitor's ports."""
    rows = table(section(DOCS / "protocol.md", "## Monitor"), "| port | socket |")
    return {row[0]: re.match(SOCKET, row[1]).group(1) for row in rows}  # type: ignore[union-attr]


@pytest.mark.parametrize(
    ("page", "sockets"),
    [
        ("architecture.md §2", sockets_in_architecture),
        ("protocol/ports.py's docstring", sockets_in_ports_docstring),
    ],
)
def test_the_port_tables_list_every_port_of_the_port_map_and_no_other(page, sockets):
    assert differences(ports_in_code(), set(sockets()), page) == []


def test_the_port_tables_agree_on_each_ports_socket():
    architecture = sockets_in_architecture()
    docstring = sockets_in_ports_docstring()
    monitor = sockets_in_protocol()  # a monitor's ports only
    wrong = []
    for port in sorted(ports_in_code()):
        said = {architecture.get(port), docstring.get(port), monitor.get(port, docstring.get(port))}
        if len(said) > 1:
            wrong.append(
                f"{port}: architecture.md §2 says {architecture.get(port)}, ports.py's docstring "
                f"{docstring.get(port)}, protocol.md's monitor table {monitor.get(port, '-')}"
            )
    assert wrong == []


# --- znodes (coordination/paths.py) ----------------------------------------------------------

# Helpers that join any name: not part of the layout.
NOT_LAYOUT = {"top", "child", "roots"}


def znodes_in_code() -> set[str]:
    """Every path `Paths` builds, its variable parts written `<>`: "<ns>/queues/<>/scaling"."""
    built: set[str] = set()
    layout = paths.Paths("/ns")
    for name, member in inspect.getmembers(paths.Paths):
        if name.startswith("_") or name in NOT_LAYOUT:
            continue
        if isinstance(member, property):
            built.add(getattr(layout, name))
        elif inspect.isfunction(member):
            arguments = list(inspect.signature(member).parameters)[1:]
            path = getattr(layout, name)(*(f"ARG{i}" for i in range(len(arguments))))
            built.add(re.sub(r"ARG\d", "<>", path))
    return {"<ns>" + path.removeprefix("/ns") for path in built}


def normal(path: str) -> str:
    return re.sub(r"<(?!ns>)[^<>]*>", "<>", path).replace("/…", "")


def check_znodes(documented: set[str], page: str) -> list[str]:
    """Every path of the code is documented or the parent of a documented one (`/ns/queues`),
    and every documented path is one the code builds."""
    code = znodes_in_code()
    parents = {path for path in code if any(doc.startswith(path + "/") for doc in documented)}
    return differences(code - parents, documented - parents, page)


def test_architecture_lists_every_znode_paths_py_builds_and_no_other():
    rows = table(section(DOCS / "architecture.md", "## 3. "), "| path | kind |")
    documented = {normal(row[0].strip("`")) for row in rows}
    assert check_znodes(documented, "architecture.md §3") == []


def test_paths_docstring_lists_every_znode_it_builds_and_no_other():
    lines = (paths.__doc__ or "").splitlines()
    documented = {normal(line.split()[0]) for line in lines if line.startswith("<ns>/")}
    assert check_znodes(documented, "coordination/paths.py's docstring") == []


# --- metrics (http/metrics.py) ---------------------------------------------------------------


def metrics_in_code() -> set[str]:
    """Every metric the gateway exports, as scraped: `name{label,…}`."""
    metrics = Metrics(TopicIndex(10, 1 << 20), lambda: 0)
    metrics.observe("publish", 200, 0.001)
    found: set[str] = set()
    for family in metrics.registry.collect():
        name = family.name + ("_total" if family.type == "counter" else "")
        labels = sorted({label for sample in family.samples for label in sample.labels} - {"le"})
        found.add(name + ("{" + ",".join(labels) + "}" if labels else ""))
    return found


def test_http_md_lists_every_metric_and_no_other():
    text = (DOCS / "http.md").read_text()
    paragraph = text[text.index("`GET /metrics` (Prometheus text format):") :].split("\n\n")[0]
    documented = set(re.findall(r"`(roq_\w+(?:\{[\w,]+\})?)`", paragraph))
    assert differences(metrics_in_code(), documented, "http.md's GET /metrics paragraph") == []


# --- settings (config/keys.py) ---------------------------------------------------------------


def key_row(key: Key) -> tuple[str, str, str, str]:
    """What configuration.md's row of a key says in its first four cells, as keys.py has it.
    (The meaning cell is the page's own prose, often longer than the key's doc.)"""
    default = f"`{render_value(key.default)}`" if render_value(key.default) else "(empty)"
    allowed = ", ".join(key.choices)
    if key.bounds is not None:
        allowed = f"{_fmt(key.bounds[0])} .. {_fmt(key.bounds[1])}"
    return (f"`{key.name}`", key.type.__name__, default, allowed)


@pytest.mark.parametrize(
    ("keys", "heading"),
    [(config.GCM_KEYS, "### GCM.properties"), (config.HCM_KEYS, "### HCM.properties")],
    ids=["GCM", "HCM"],
)
def test_configuration_md_lists_every_key_as_declared(keys, heading):
    text = section(DOCS / "configuration.md", heading)
    documented = {
        tuple(row[:4])
        for rows in re.split(r"\n#### ", text)[1:]
        for row in table(rows, "| key | type | default | allowed |")
    }
    code = {key_row(key) for key in keys}
    wrong = differences(code, documented, f"configuration.md {heading}")
    assert wrong == [], "a row differs from keys.py: (key, type, default, allowed)"


# --- bounds (limits.py) ----------------------------------------------------------------------

# architecture.md §9's table: each row names its constants (`limits.py` names, or a
# configuration key, or `roq.<module>.<NAME>` for one kept beside its code) in one cell and
# their values in the next, in the same order, separated by ";" or " / ". A value is a number
# ("10 000", "0.25", "1/3", "2^60", a sum "4 MiB + 64 KiB") with its unit ("ms", "s", "bytes",
# "KiB", "MiB"; none for a count), then any words of the page's own ("each", "(then …)").
BOUNDS_HEADER = "| area | bound | constant | value |"
SEPARATOR = re.compile(r"\s*;\s*|\s+/\s+")
NUMBER = r"\d+/\d+|\d{1,3}(?: \d{3})+(?!\d)|\d+(?:\.\d+)?(?:\^\d+)?"
UNITS = {"ms": ("ms", 1), "s": ("ms", 1000), "B": ("bytes", 1), "bytes": ("bytes", 1)}
UNITS |= {"KiB": ("bytes", 1024), "MiB": ("bytes", 1024**2), "GiB": ("bytes", 1024**3)}
QUANTITY = re.compile(rf"({NUMBER})(?: ({'|'.join(UNITS)})\b)?")


def quantity(text: str) -> tuple[str, Fraction] | None:
    """("ms" | "bytes" | "count", value in ms, bytes or units) of the number (or sum) `text`
    starts with, None if it starts with none."""
    kind, total, rest = None, Fraction(0), text
    while match := QUANTITY.match(rest):
        number, unit = match.groups()
        base, _, power = number.partition("^")
        value = Fraction(base.replace(" ", "")) ** int(power or 1)
        unit_kind, scale = UNITS.get(unit or "", ("count", 1))
        if kind not in (None, unit_kind):
            return None
        kind, total = unit_kind, total + value * scale
        rest = rest[match.end() :]
        if not rest.startswith(" + "):
            break
        rest = rest[3:]
    if kind is None:
        return None
    if total == 0:  # "0" needs no unit
        kind = "any"
    return kind, total


def kind_of(name: str) -> tuple[str, int]:
    """What a constant counts, from its name (limits.py puts the unit there), and its scale."""
    parts = name.lower().split("_")
    if "ms" in parts:
        return "ms", 1
    if "s" in parts:
        return "ms", 1000
    if "bytes" in parts:
        return "bytes", 1
    return "count", 1


def bound_value(name: str) -> tuple[str, Fraction] | str:
    """(kind, value) of a constant the table names, or why there is none."""
    if name.startswith("roq."):
        module, _, attribute = name.rpartition(".")
        found = getattr(importlib.import_module(module), attribute, None)
        kind, scale = kind_of(attribute)
    elif name in vars(limits):
        found = vars(limits)[name]
        kind, scale = kind_of(name)
    else:
        keys = {key.name: key for key in (*config.GCM_KEYS, *config.HCM_KEYS)}
        if name not in keys:
            return "neither in limits.py nor a configuration key"
        found = keys[name].default
        kind, scale = "count" if isinstance(found, int) else "?", 1
        if "in bytes" in keys[name].doc:
            kind = "bytes"
    if not isinstance(found, (int, float)) or isinstance(found, bool):
        return f"not a number: {found!r}"
    return kind, Fraction(str(found)) * scale


def bounds_rows() -> list[list[str]]:
    return table(section(DOCS / "architecture.md", "## 9. "), BOUNDS_HEADER)


def documented_bounds() -> list[tuple[str, str]]:
    """[(constant, value as written)] for every constant §9's table names."""
    pairs: list[tuple[str, str]] = []
    for row in bounds_rows():
        names, values = SEPARATOR.split(row[2]), SEPARATOR.split(row[3])
        assert len(names) == len(values), f"§9: {row[2]!r} names {len(names)}, {row[3]!r} values"
        for name, value in zip(names, values, strict=True):
            assert re.fullmatch(r"`[\w.]+`", name), f"§9: {name!r} is not one `constant`"
            pairs.append((name.strip("`"), value))
    return pairs


def test_architecture_bounds_table_matches_limits_py():
    wrong = []
    for name, written in documented_bounds():
        code = bound_value(name)
        said = quantity(written)
        if isinstance(code, str):
            wrong.append(f"{name}: {code}")
        elif said is None:
            wrong.append(f"{name}: {written!r} does not start with a number and its unit")
        elif said[0] not in (code[0], "any") or float(said[1]) != float(code[1]):
            unit = {"ms": " ms", "bytes": " bytes", "count": ""}.get(code[0], "")
            wrong.append(f"{name}: §9 says {written!r}, the code {code[1]}{unit}")
    assert wrong == []


# Constants of limits.py that are not bounds, so §9 leaves them out.
NOT_BOUNDS = {
    # the range of BSON's int64 that sequence numbers and timestamps are checked against: the
    # format's limit, not one roq chose (log_offset_max, in the table, is roq's)
    "int64_max",
    # a directory (roq-data/security) where `roq up` writes the cluster's keys: a default path
    "security_dir_default",
}


def constants_in_limits() -> set[str]:
    """Every module-level constant limits.py assigns."""
    tree = ast.parse((CODE / "limits.py").read_text())
    return {
        target.id
        for node in tree.body
        if isinstance(node, (ast.Assign, ast.AnnAssign))
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }


def test_architecture_names_every_bound_of_limits_py():
    assert constants_in_limits() >= NOT_BOUNDS, "NOT_BOUNDS names a constant limits.py lost"
    documented = {name for name, _ in documented_bounds() if name in vars(limits)}
    assert NOT_BOUNDS.isdisjoint(documented), "a constant both in §9 and in NOT_BOUNDS"
    wrong = differences(constants_in_limits() - NOT_BOUNDS, documented, "architecture.md §9")
    assert wrong == []


def test_architecture_names_each_bound_once():
    names = [name for name, _ in documented_bounds()]
    assert sorted({name for name in names if names.count(name) > 1}) == []


def test_architecture_prose_names_only_limits_that_exist():
    text = section(DOCS / "architecture.md", "## 9. ")
    named = set(re.findall(r"`limits\.(\w+)`", text))
    assert sorted(named - set(vars(limits))) == []


def test_quantity_reads_the_forms_the_table_uses():
    assert quantity("10 000") == ("count", 10_000)
    assert quantity("1 000 000 (then the table is cleared)") == ("count", 1_000_000)
    assert quantity("4 MiB + 64 KiB") == ("bytes", 4 * 1024**2 + 64 * 1024)
    assert quantity("250 ms (then 0.5 s)") == ("ms", 250)
    assert quantity("0.25 s") == ("ms", 250)
    assert quantity("255 bytes") == ("bytes", 255)
    assert quantity("1000 messages") == ("count", 1000)
    assert quantity("2^60") == ("count", 2**60)
    assert quantity("1/3") == ("count", Fraction(1, 3))
    assert quantity("0") == ("any", 0)
    assert quantity("about 70 s") is None
