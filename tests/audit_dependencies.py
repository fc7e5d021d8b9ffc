"""`make lint`'s dependency audit: pip-audit over requirements.lock (issue 31, finding 8).

A found vulnerability fails (exit 1, each one listed). A vulnerability database that cannot be
reached does not: CI may have no network to it, so pip-audit's connection failure, or an answer
for none of the locked packages (a mirror of PyPI without its JSON API), is one line saying the
audit was skipped and why, and exit 0. Any other failure of pip-audit fails.

    python tests/audit_dependencies.py [requirements.lock]
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OFFLINE = ("ConnectionError", "NameResolutionError", "Max retries exceeded", "timed out")


def verdict(report: dict[str, Any]) -> tuple[int, str]:
    """(exit code, what to say) for pip-audit's JSON report."""
    dependencies = report.get("dependencies", [])
    found = [d for d in dependencies if d.get("vulns")]
    if found:
        lines = [
            f"  {d['name']} {d['version']}: {v['id']} (fixed in {_fixes(v)})"
            for d in found
            for v in d["vulns"]
        ]
        return 1, "pip-audit: known vulnerabilities in requirements.lock:\n" + "\n".join(lines)
    audited = [d for d in dependencies if "skip_reason" not in d]
    if dependencies and not audited:
        return 0, (
            f"pip-audit: SKIPPED: the vulnerability database answered for none of the "
            f"{len(dependencies)} locked packages (offline, or a PyPI mirror without its JSON API)"
        )
    skipped = len(dependencies) - len(audited)
    note = f" ({skipped} could not be looked up)" if skipped else ""
    return 0, f"pip-audit: no known vulnerability in {len(audited)} locked packages{note}"


def _fixes(vuln: dict[str, Any]) -> str:
    return ", ".join(vuln.get("fix_versions") or ["no version yet"])


def main() -> int:
    lock = Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "requirements.lock"
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "audit.json"
        command = [sys.executable, "-m", "pip_audit", "-r", str(lock), "--disable-pip",
                   "--progress-spinner", "off", "-f", "json", "-o", str(out)]  # fmt: skip
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        except subprocess.TimeoutExpired:
            print("pip-audit: SKIPPED: no answer from the vulnerability database within 600 s")
            return 0
        if not out.exists() or not out.read_text().strip():
            if any(word in done.stderr for word in OFFLINE):
                last = done.stderr.strip().splitlines()[-1][:200]
                print(f"pip-audit: SKIPPED: the vulnerability database is unreachable: {last}")
                return 0
            print(f"pip-audit failed (exit {done.returncode}):\n{done.stderr}", file=sys.stderr)
            return 1
        code, said = verdict(json.loads(out.read_text()))
    print(said, file=sys.stderr if code else sys.stdout)
    return code


if __name__ == "__main__":
    sys.exit(main())
