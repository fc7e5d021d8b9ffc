"""`roq bench --load`: RoQ's test loader (TestLoaderLauncher, reference §6) run from a load
description written as RoQ's were, against a real cluster."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from roq.testing.cluster import LocalCluster

pytestmark = pytest.mark.integration

# RoQ's field names and forms: duration in minutes (3 s), rate from throughput / (maxPub x maxSub)
ROQ_LOAD = {"delay": 0, "duration": 0.05, "maxPub": 2, "maxSub": 1, "payload": 20,
            "throughput": 400, "spawnRate": 1}  # fmt: skip


def test_bench_runs_a_roq_load_description(cluster: LocalCluster, tmp_path: Path):
    cluster.start_with_queue()
    load = tmp_path / "load.json"
    load.write_text(json.dumps(ROQ_LOAD))
    result = cluster.cli("bench", "--queue", "q1", "--load", str(load), "--gcm", cluster.gcm,
                         timeout_s=120)  # fmt: skip
    assert result.returncode == 0, f"{result.stderr}\n{cluster.logs()}"
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert (summary["publishers"], summary["subscribers"]) == (2, 1)
    assert (summary["payload"], summary["seconds"]) == (20, 3.0)
    assert summary["failed_workers"] == []
    # 2 publishers at 200 msg/s each for 3 s, every message delivered once
    assert 600 <= summary["published"] <= 1300, summary
    assert summary["delivered"] == summary["published"]
    assert summary["lost"] == 0 and summary["duplicated"] == 0
