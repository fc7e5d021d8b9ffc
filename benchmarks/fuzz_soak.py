"""Soak mode of the fuzz suite (tests/fuzz, issue 16): the same targets and generators, random
seeds, for N minutes against one real cluster; reports cases per second, and on any failure
prints a reproducer (the socket and the last cases' frames in hex) and exits 1.

    PYTHONPATH=appliance .venv/bin/python benchmarks/fuzz_soak.py --minutes 30 [--port-base 43000]

Each round sends `--examples` cases to every socket in turn, then checks that every process is
alive with its PID and that a publish and replay of 1,000 messages is exact.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "fuzz"))

from harness import FuzzFailure, run_cases
from test_fuzz_ports import QUEUE, Fuzzed

from roq.local.zkserver import ZooKeeperServer
from roq.testing.cluster import LocalCluster, PortBlocks
from roq.transport import new_context


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0)
    parser.add_argument("--examples", type=int, default=200, help="cases per socket per round")
    parser.add_argument("--port-base", type=int, default=43000)
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="roq-fuzz-soak-"))
    ports = PortBlocks(args.port_base, args.port_base + 5000)
    zookeeper = ZooKeeperServer(tmp / "zookeeper", ports.take(1))
    zookeeper.start()
    cluster = LocalCluster(tmp, zookeeper.connect_string, ports)
    try:
        return _soak(cluster, args.minutes * 60, args.examples)
    finally:
        cluster.stop()
        zookeeper.stop()


def _soak(cluster: LocalCluster, seconds: float, examples: int) -> int:
    from harness import publish_and_replay

    cluster.start_gcm()
    cluster.start_host("h1")
    cluster.wait_ready()
    with cluster.admin() as admin:
        admin.create_queue(QUEUE)
    publish_and_replay(cluster, QUEUE, 10)
    fuzzed = Fuzzed(cluster)
    context = new_context()
    start = time.monotonic()
    cases = rounds = 0
    per_socket: dict[str, int] = {}
    try:
        while time.monotonic() - start < seconds:
            for name, target in fuzzed.targets.items():
                with cluster.as_cluster():  # as the test: an insider reaches every parser
                    sent = run_cases(context, target, fuzzed.processes, examples, derandomize=False)
                per_socket[name] = per_socket.get(name, 0) + sent
                cases += sent
            publish_and_replay(cluster, QUEUE)
            rounds += 1
            elapsed = time.monotonic() - start
            print(f"round {rounds}: {cases} cases in {elapsed:.0f} s "
                  f"({cases / elapsed:.1f} cases/s)", flush=True)  # fmt: skip
    except (FuzzFailure, AssertionError) as failure:
        report = Path(tempfile.mkstemp(prefix="roq-fuzz-failure-", suffix=".txt")[1])
        report.write_text(f"{failure}\n")
        print(f"FAILURE after {cases} cases (the full reproducer: {report}):\n"
              f"{str(failure)[:3000]}", flush=True)  # fmt: skip
        print(cluster.logs()[-8000:], flush=True)
        return 1
    finally:
        context.term()
    elapsed = time.monotonic() - start
    print(f"soak passed: {cases} cases in {rounds} rounds, {elapsed:.0f} s, "
          f"{cases / elapsed:.1f} cases/s; per socket: {per_socket}")  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
