"""`make lint`'s dependency audit (tests/audit_dependencies.py, issue 31, finding 8): a found
vulnerability fails, a database that answered for nothing is a skip, never a failure."""

from __future__ import annotations

import importlib.util
from pathlib import Path

spec = importlib.util.spec_from_file_location(
    "audit_dependencies", Path(__file__).resolve().parents[1] / "audit_dependencies.py"
)
assert spec is not None and spec.loader is not None
audit = importlib.util.module_from_spec(spec)
spec.loader.exec_module(audit)


def test_a_vulnerability_fails_and_names_the_package_and_the_fix():
    report = {"dependencies": [
        {"name": "jinja2", "version": "2.4.1", "vulns": [
            {"id": "PYSEC-2014-8", "fix_versions": ["2.7.2"]}]},
        {"name": "uv", "version": "0.13.9", "vulns": []},
    ]}  # fmt: skip
    code, said = audit.verdict(report)
    assert code == 1 and "jinja2 2.4.1: PYSEC-2014-8 (fixed in 2.7.2)" in said


def test_a_database_that_answered_for_nothing_is_a_skip_not_a_failure():
    report = {"dependencies": [{"name": "uv", "version": "0.13.9", "skip_reason": "not found"}]}
    code, said = audit.verdict(report)
    assert code == 0 and said.startswith("pip-audit: SKIPPED")
    code, said = audit.verdict({"dependencies": [{"name": "uv", "version": "1", "vulns": []}]})
    assert code == 0 and "no known vulnerability in 1 locked packages" in said
