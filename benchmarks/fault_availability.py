"""The fault harness's fail-over times against the issue's goal (zk.session.timeout + 5 s = 9 s
in tests/faults), over repeated runs: the speed goal the fault tests no longer assert (they
assert that every producer resumes at all, and that nothing acknowledged is lost).

    .venv/bin/python benchmarks/fault_availability.py --runs 3 [-k 'kill or restart'] \\
        --out benchmarks/results/fault_availability.json

Runs `pytest tests/faults/test_nemeses.py -s` --runs times (root: network namespaces), reads
each fault's "resumed X s after its start" from the checker's summaries, and prints per fault
the runs, the median and the worst, and how many met the goal; the JSON keeps every value.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
GOAL_S = 4.0 + 5  # faultcluster.SESSION_MS / 1000 + 5
RUN_TIMEOUT_S = 1800
FAULT = re.compile(r"^fault (.+): longest gap [\d.]+ s, resumed ([\d.]+) s after", re.M)


def one_run(selection: str) -> tuple[dict[str, list[float]], int]:
    """The resume times per fault of one pytest run of the harness, and its exit code."""
    command = [sys.executable, "-m", "pytest", "tests/faults/test_nemeses.py", "-s", "-q",
               "-p", "no:randomly"]  # fmt: skip
    if selection:
        command += ["-k", selection]
    done = subprocess.run(command, cwd=ROOT, capture_output=True, text=True,
                          timeout=RUN_TIMEOUT_S, check=False)  # fmt: skip
    found: dict[str, list[float]] = {}
    for name, resumed in FAULT.findall(done.stdout):
        found.setdefault(name, []).append(float(resumed))
    if not found:
        print(done.stdout[-3000:], done.stderr[-3000:], file=sys.stderr)
    return found, done.returncode


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("-k", default="", help="pytest -k selection of the scenarios")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    times: dict[str, list[float]] = {}
    codes = []
    for run in range(args.runs):
        started = time.monotonic()
        found, code = one_run(args.k)
        codes.append(code)
        for name, values in found.items():
            times.setdefault(name, []).extend(values)
        print(f"run {run + 1}: pytest exit {code}, {time.monotonic() - started:.0f} s, "
              f"{sum(len(v) for v in found.values())} faults", file=sys.stderr)  # fmt: skip
    print(f"{'fault':60} runs  median   worst  <= {GOAL_S:g} s")
    for name, values in sorted(times.items()):
        met = sum(value <= GOAL_S for value in values)
        print(f"{name[:60]:60} {len(values):4} {statistics.median(values):7.2f} "
              f"{max(values):7.2f}  {met}/{len(values)}")  # fmt: skip
    if args.out:
        summary = {"command": " ".join(sys.argv), "goal_s": GOAL_S, "pytest_exit": codes,
                   "resumed_s": times}  # fmt: skip
        args.out.write_text(json.dumps(summary, indent=1) + "\n")


if __name__ == "__main__":
    main()
