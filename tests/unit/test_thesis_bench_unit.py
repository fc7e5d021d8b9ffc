"""benchmarks/thesis.py without a cluster: its level and queue naming, and the charts and table it
draws from `evaluation` Parquet files shaped like the Spark job's (a whole run takes ~20 min and
root; this keeps the script from rotting between runs)."""

from __future__ import annotations

import importlib.util
import json
import math
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _thesis() -> ModuleType:
    spec = importlib.util.spec_from_file_location("thesis_bench", ROOT / "benchmarks" / "thesis.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["thesis_bench"] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


thesis = _thesis()


def test_levels_and_queue_names_round_trip() -> None:
    levels = thesis.parse_levels("5x3000, 50x3500")
    assert levels == [thesis.Level(5, 3000), thesis.Level(50, 3500)]
    assert levels[1].queue("5.2") == "t52p50r3500"
    assert thesis.parse_queue("t52p50r3500") == ("5.2", thesis.Level(50, 3500))
    assert thesis.parse_queue("bench") is None
    for bad in ("5", "0x3000", "5x"):
        with pytest.raises(SystemExit, match=bad):
            thesis.parse_levels(bad)


def _row(queue: str, exchange: str, **values: Any) -> dict[str, Any]:
    base = {"queue": queue, "load_producers": None, "exchange": exchange, "minutes": 1,
            "bytes_per_min": None, "msgs_per_s": None, "active_msgs_per_s": None,
            "cpu_pct": 3.0, "mem_rss_mb": 44.0, "latency_p50_us": 2500.0,
            "latency_mean_us": 3000.0, "busy_msgs_per_s": None, "busy_bytes_per_s": None,
            "busy_cpu_pct": None}  # fmt: skip
    return {**base, **values}


def test_render_draws_the_figures_and_the_table(tmp_path: Path) -> None:
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    pytest.importorskip("matplotlib")
    rows51 = [
        _row("t51p5r3000", f"m{h}-600{p}-x", busy_bytes_per_s=75_000.0, busy_cpu_pct=20.0)
        for h in (2, 3)
        for p in (0, 4)
    ] + [_row("t51p40r3000", "m2-6000-y", busy_bytes_per_s=600_000.0, latency_p50_us=0.0)]
    rows52 = [
        _row("t52p5r3000", "m2-6000-z", active_msgs_per_s=3750.0, mem_rss_mb=120.0),
        _row("t52p5r3000", "m3-6000-z"),  # no traffic on it: throughput 0
        _row("t52p5r3000", "", cpu_pct=None),  # a subscriber's latency without an exchange
    ]
    pq.write_table(pa.Table.from_pylist(rows51), tmp_path / "fig5_1.evaluation.parquet")
    pq.write_table(pa.Table.from_pylist(rows52), tmp_path / "fig5_2.evaluation.parquet")

    data = thesis.evaluation_rows(tmp_path)
    assert data["5.1"][5]["throughput"] == [4_500_000.0] * 4
    assert data["5.1"][5]["cpu"] == [20.0] * 4
    assert data["5.1"][5]["latency"] == [2.5] * 4
    assert math.isnan(data["5.1"][40]["latency"][0])  # nothing delivered: no latency
    assert data["5.2"][5]["throughput"] == [3750.0 * 20 * 60, 0.0]
    assert data["5.2"][5]["memory"] == [120.0, 44.0]

    run = {"figure": "5.1", "queue": "t51p5r3000", "producers": 5, "rate": 3000,
           "uptime_before": "05:32:02 up 10:15,  0 user,  load average: 8.40, 6.39, 4.87",
           "uptime_after": "05:32:31 up 10:16,  0 user,  load average: 10.84, 7.21, 5.20",
           "bench": {"published": 299991, "published_msg_s": 14892, "delivered": 299991,
                     "latency_ms": {"p50": 5.103, "p99": 357.66}}}  # fmt: skip
    (tmp_path / "runs.jsonl").write_text(json.dumps(run) + "\n")

    written = thesis.render(tmp_path)
    names = {path.name for path in written}
    assert names == {"fig5_1.png", "fig5_2.png", "thesis_vs_roq.png", "table.md", "runs.md"}
    runs = (tmp_path / "runs.md").read_text()
    assert "| 5.1 | 5 × 3,000 | 14,892 | 299,991 of 299,991 | 5 / 358 | 8.40 → 10.84 |" in runs
    for path in written:
        assert path.stat().st_size > 0
    assert (tmp_path / "fig5_1.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = (tmp_path / "table.md").read_text()
    # roq's mean beside the thesis's (Fig. 5.1, 5 producers: 18.3 MB/min per exchange)
    assert "| 5.1 | 5p×3,000 | 4.5 / 18.3 | 18.0 | 20.0 / 6.0 | 44.0 / 19.2 | 2.5 |" in text
    assert "| 5.1 | 40p×3,000 | 36.0 / – | 36.0 | 3.0 / – | 44.0 / – | – | – |" in text
