"""Reading a properties file against a key table, checked once at start-up.

A key missing from a file takes its own default; an invalid value, an unknown key, a retired key
with a value (`keys.RETIRED`: a secret that no longer belongs in a file, or a RoQ key roq cannot
honour), a value roq cannot honour (`keys.REFUSED_VALUES`) or an unreadable file raises
`ConfigError`, which the command line turns into one line on stderr and exit code 78
(EX_CONFIG). The result, `Settings`, is looked up by key name only inside this package: each
component turns it into its own typed dataclass (`components.py`) once, at start.
"""

from __future__ import annotations

import difflib
import logging
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from roq.config.keys import (
    GCM_KEYS,
    HCM_KEYS,
    REFUSED_VALUES,
    RETIRED,
    Key,
    Value,
    render_value,
)
from roq.errors import ConfigError

log = logging.getLogger(__name__)
_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]*$")


@dataclass(frozen=True)
class Settings:
    """Validated values of one file. Only the typed dataclasses of `components.py` read them by
    key name (these accessors are private to the package); reading an undeclared key is a
    programming error, which their unit test catches."""

    source: str
    values: Mapping[str, Value] = field(default_factory=dict)

    def _int(self, name: str) -> int:
        value = self.values[name]
        assert isinstance(value, int) and not isinstance(value, bool), name
        return value

    def _float(self, name: str) -> float:
        value = self.values[name]
        assert isinstance(value, int | float), name
        return float(value)

    def _bool(self, name: str) -> bool:
        value = self.values[name]
        assert isinstance(value, bool), name
        return value

    def _str(self, name: str) -> str:
        value = self.values[name]
        assert isinstance(value, str), name
        return value

    def _seconds(self, name: str) -> float:
        """A key in milliseconds, in seconds."""
        return self._int(name) / 1000

    def to_properties(self) -> dict[str, str]:
        """The values as strings, to hand to a child process through a file."""
        return {k: render_value(v) for k, v in self.values.items()}

    def changed(self, keys: Iterable[Key]) -> dict[str, str]:
        """The values that differ from their key's default, as property text."""
        defaults = {key.name: render_value(key.default) for key in keys}
        return {k: v for k, v in self.to_properties().items() if defaults.get(k) != v}


def parse_properties(text: str) -> list[tuple[int, str, str]]:
    """Parse Java-style properties: `key=value` or `key: value`, `#`/`!` comments,
    backslash line continuation. Returns (line number, key, raw value) triples."""
    entries: list[tuple[int, str, str]] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        number = index + 1
        line = lines[index].strip()
        index += 1
        while line.endswith("\\") and index < len(lines):
            line = line[:-1] + lines[index].strip()
            index += 1
        if not line or line[0] in "#!":
            continue
        match = re.match(r"^([^=:\s]+)\s*[=:\s]\s*(.*)$", line)
        if match is None:
            entries.append((number, line, ""))
        else:
            entries.append((number, match.group(1), match.group(2)))
    return entries


def load(
    keys: Iterable[Key], path: Path | None, overrides: Mapping[str, str] | None = None
) -> Settings:
    """Read `path` (optional) then apply `overrides` (from the command line)."""
    table = {key.name: key for key in keys}
    values: dict[str, Value] = {key.name: key.default for key in table.values()}
    source = "defaults"
    if path is not None:
        source = str(path)
        for number, name, raw in parse_properties(_read(path)):
            if not _retired(name, raw, f"{path}:{number}"):
                values[name] = _parse(table, name, raw, f"{path}:{number}")
    for name, raw in (overrides or {}).items():
        if not _retired(name, raw, "command line"):
            values[name] = _parse(table, name, raw, "command line")
    return Settings(source=source, values=values)


def _parse(table: Mapping[str, Key], name: str, raw: str, where: str) -> Value:
    """The value of one line; a value roq cannot honour (`keys.REFUSED_VALUES`) is refused."""
    value = _lookup(table, name, where).parse(raw, where)
    refused = REFUSED_VALUES.get(name)
    if refused is not None and value == refused[0]:
        raise ConfigError(f"{where}: {name}={render_value(value)} is refused: {refused[1]}")
    return value


def _retired(name: str, raw: str, where: str) -> bool:
    """Whether `name` is a retired key (then skipped). One with a value is refused; the message
    names the key and never its value, which may be a secret."""
    instead = RETIRED.get(name)
    if instead is None:
        return False
    if raw.strip():
        raise ConfigError(f"{where}: key '{name}' is refused: {instead}")
    log.warning("%s: key '%s' is empty and ignored: %s", where, name, instead)
    return True


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: configuration file not found") from None
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"{path}: cannot read configuration file: {error}") from None


def _lookup(table: Mapping[str, Key], name: str, where: str) -> Key:
    key = table.get(name)
    if key is None:
        if not _NAME_RE.match(name):
            raise ConfigError(f"{where}: cannot parse line {name!r} (expected key=value)")
        hint = difflib.get_close_matches(name, table, n=1)
        suffix = f" (did you mean '{hint[0]}'?)" if hint else ""
        raise ConfigError(f"{where}: unknown key '{name}'{suffix}")
    return key


HOME_ENV = "ROQ_HOME"  # RoQ's ROQ_HOME: its config/ holds GCM.properties and HCM.properties


def home_file(name: str) -> Path | None:
    """`$ROQ_HOME/config/<name>` when ROQ_HOME is set and the file exists, else None: where RoQ
    kept its configuration files (seed 000, "Configuration files"). A daemon started without
    `--config` reads it; `--config` wins."""
    home = os.environ.get(HOME_ENV, "")
    if not home:
        return None
    path = Path(home) / "config" / name
    if not path.is_file():
        return None
    log.info("reading %s (ROQ_HOME/config; --config overrides it)", path)
    return path


def load_gcm(path: Path | None, overrides: Mapping[str, str] | None = None) -> Settings:
    return load(GCM_KEYS, path, overrides)


def load_hcm(path: Path | None, overrides: Mapping[str, str] | None = None) -> Settings:
    return load(HCM_KEYS, path, overrides)


def parse_overrides(items: Iterable[str]) -> dict[str, str]:
    """`-D key=value` options from the command line."""
    result: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ConfigError(f"command line: -D {item!r}: expected key=value")
        result[name.strip()] = value
    return result
