"""The readable report: `report.md` with PNG charts under `charts/`, from the aggregated tables the
driver read back (never raw records). Runs on the driver only; matplotlib draws without a display.
"""

from __future__ import annotations

import os
from collections import defaultdict
from collections.abc import Iterable
from datetime import datetime
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # after use(): the backend must be chosen first

Rows = list[dict[str, Any]]
REPORT_ROWS = 5000  # per table: the report is for people; the Parquet tables hold everything
TABLES = (
    "queue_minute", "exchange_minute", "producers", "latency_minute", "latency_total",
    "evaluation", "corrupt", "segments",
)  # fmt: skip


def _fmt(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:,.1f}"
    if isinstance(value, int):
        return f"{value:,}"
    if isinstance(value, datetime):
        return value.strftime("%Y-%m-%d %H:%M")
    return str(value).replace("|", "\\|")


def table(rows: Rows, columns: list[str]) -> str:
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(_fmt(row.get(c)) for c in columns) + " |" for row in rows]
    if len(rows) >= REPORT_ROWS:
        lines.append(f"\n(first {REPORT_ROWS} rows; the Parquet table has all of them)")
    return "\n".join(lines)


def _series(rows: Rows, label: Iterable[str], y: str) -> dict[str, tuple[list[Any], list[Any]]]:
    out: dict[str, tuple[list[Any], list[Any]]] = defaultdict(lambda: ([], []))
    for row in sorted(rows, key=lambda r: r["minute"]):
        if row.get(y) is not None and row.get("minute") is not None:
            key = "/".join(str(row.get(part) or "") for part in label)
            out[key][0].append(row["minute"])
            out[key][1].append(row[y])
    return out


_NO_DATA = "no data in the KPI log for this chart (was `roq kpi-record` running?)"


def line_chart(path: str, title: str, panels: list[tuple[str, dict[str, Any]]]) -> str:
    """One PNG with one panel per (y label, series)."""
    fig, axes = plt.subplots(len(panels), 1, figsize=(9, 3.2 * len(panels)), squeeze=False)
    for ax, (ylabel, series) in zip(axes[:, 0], panels, strict=True):
        for name, (xs, ys) in sorted(series.items()):
            ax.plot(xs, ys, marker="o", markersize=3, label=name)
        ax.set_ylabel(ylabel)
        ax.grid(alpha=0.3)
        if series:
            ax.legend(fontsize=8, loc="best")
        else:  # say why the panel is blank rather than leave bare axes to puzzle over
            ax.text(0.5, 0.5, _NO_DATA, ha="center", va="center", transform=ax.transAxes,
                    color="0.4")  # fmt: skip
    axes[0, 0].set_title(title)
    axes[-1, 0].set_xlabel("minute (UTC)")
    fig.autofmt_xdate()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def evaluation_chart(path: str, rows: Rows) -> str:
    """Figure 5.3's shape: throughput (bytes/min) per exchange, grouped by load level."""
    levels = sorted({(r["queue"], r["load_producers"] or 0) for r in rows})
    exchanges = sorted({r["exchange"] or "" for r in rows})
    value = {(r["queue"], r["load_producers"] or 0, r["exchange"] or ""): r for r in rows}
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / max(len(exchanges), 1)
    for k, exchange in enumerate(exchanges):
        ys = [(value.get((*lv, exchange)) or {}).get("bytes_per_min") or 0 for lv in levels]
        ax.bar([i + k * width for i in range(len(levels))], ys, width, label=exchange)
    ax.set_xticks([i + 0.4 - width / 2 for i in range(len(levels))])
    ax.set_xticklabels([f"{q}\n{n} producers" for q, n in levels], fontsize=8)
    ax.set_ylabel("bytes per minute")
    ax.set_title("Throughput per exchange and load level")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def charts(directory: str, t: dict[str, Rows]) -> list[tuple[str, str]]:
    os.makedirs(os.path.join(directory, "charts"), exist_ok=True)
    at = os.path.join(directory, "charts")
    xm, lat = t["exchange_minute"], t["latency_minute"]
    made = [
        ("Throughput per exchange", line_chart(f"{at}/throughput.png", "Throughput per exchange", [
            ("messages/s", _series(xm, ("queue", "exchange"), "active_msgs_per_s")),
            ("bytes/s", _series(xm, ("queue", "exchange"), "active_bytes_per_s")),
        ])),
        ("End-to-end latency per queue", line_chart(f"{at}/latency.png", "End-to-end latency", [
            ("p50 (µs)", _series(lat, ("queue",), "p50_us")),
            ("p99 (µs)", _series(lat, ("queue",), "p99_us")),
        ])),
        ("CPU and memory per exchange", line_chart(f"{at}/load.png", "Exchange load (KPI)", [
            ("CPU (% of a core)", _series(xm, ("queue", "exchange"), "cpu_pct")),
            ("RSS (MiB)", _series(xm, ("queue", "exchange"), "mem_rss_mb")),
        ])),
        ("Throughput per exchange and load level", evaluation_chart(f"{at}/evaluation.png",
                                                                    t["evaluation"])),
    ]  # fmt: skip
    return [(title, os.path.relpath(path, directory)) for title, path in made]


METRICS = [
    ("Throughput (bytes/min)", "bytes_per_min"),
    ("Messages/s (over the minute)", "msgs_per_s"),
    ("Messages/s (while active)", "active_msgs_per_s"),
    ("CPU (%)", "cpu_pct"),
    ("Memory (MiB)", "mem_rss_mb"),
    ("Latency p50 (µs)", "latency_p50_us"),
    ("Latency mean (µs)", "latency_mean_us"),
]


def evaluation_section(rows: Rows) -> list[str]:
    """Figures 5.1/5.2 layout: for each queue and load level, one row per metric, one column per
    exchange."""
    out = []
    for queue in sorted({r["queue"] for r in rows}):
        mine = [r for r in rows if r["queue"] == queue]
        exchanges = sorted({r["exchange"] or "" for r in mine})
        out.append(f"### Queue `{queue}`\n")
        out.append("| load | metric | " + " | ".join(exchanges) + " |")
        out.append("|---|---|" + "---|" * len(exchanges))
        for level in sorted({r["load_producers"] or 0 for r in mine}):
            cells = {r["exchange"] or "": r for r in mine if (r["load_producers"] or 0) == level}
            for label, key in METRICS:
                values = [_fmt((cells.get(x) or {}).get(key)) for x in exchanges]
                out.append(f"| {level} producers | {label} | " + " | ".join(values) + " |")
        out.append("")
    return out


def write(directory: str, t: dict[str, Rows]) -> str:
    """Write report.md (and charts/) into the local `directory`; return the report's path."""
    os.makedirs(directory, exist_ok=True)
    corrupt = t["corrupt"]
    lines = ["# roq analytics report", ""]
    lines += ["## Corrupt or truncated input", ""]
    if corrupt:
        lines.append(f"{len(corrupt)} region(s) were skipped and not counted:\n")
        lines.append(table(corrupt, ["kind", "path", "position", "log_offset", "bytes_skipped",
                                     "reason"]))  # fmt: skip
    else:
        lines.append("None: every batch passed its CRC and bounds checks.")
    lines += ["", "## Evaluation (the thesis's Figures 5.1 and 5.2)", ""]
    lines += evaluation_section(t["evaluation"])
    lines += ["## Charts", ""]
    lines += [f"### {title}\n\n![{title}]({path})\n" for title, path in charts(directory, t)]
    lines += ["## Latency over the whole run", ""]
    lines.append(
        "Microseconds: from the subscribers' latency histograms (samples, percentiles) and "
        "from the mean and p99 they report per period (reported_*).\n"
    )
    lines.append(table(t["latency_total"], ["queue", "samples", "mean_us", "min_us", "p50_us",
                                            "p90_us", "p99_us", "max_us", "reported_mean_us",
                                            "reported_p99_us"]))  # fmt: skip
    lines += ["", "## Producers", ""]
    lines.append(table(t["producers"], ["queue", "producer", "messages", "bytes", "exchanges",
                                        "first_seq", "last_seq", "missing"]))  # fmt: skip
    lines += ["", "## Per queue and minute", ""]
    lines.append(table(sorted(t["queue_minute"], key=lambda r: (r["queue"], r["minute"])),
                       ["queue", "minute", "messages", "bytes", "msgs_per_s", "active_s",
                        "active_msgs_per_s", "producers", "exchanges"]))  # fmt: skip
    lines += ["", "## Segment files", ""]
    lines.append(table(t["segments"], ["path", "kind", "size", "batches", "records",
                                       "corrupt_regions", "corrupt_bytes"]))  # fmt: skip
    path = os.path.join(directory, "report.md")
    with open(path, "w", encoding="utf-8") as out:
        out.write("\n".join(lines) + "\n")
    return path
