"""The thesis's evaluation (seed 004, chapter 5 and Appendix A) on the thesis's testbed.

Three network namespaces on a bridge, as the thesis's three EC2 machines: m1 runs ZooKeeper
and the GCM, m2 and m3 run a host each with two exchanges of the queue (2 hosts × 2
exchanges). Figure 5.1 is run on a cluster without the log (`useLog=false`), Figure 5.2 on
one with the log and `replicationFactor=2`. Each load level (N producers × R msg/s × 20 B)
gets a queue of its own (`t51p5r3000`: Figure 5.1, 5 producers, 3,000 msg/s each), so the
level is the queue and levels never share a minute of the tables. Per level:

    create the queue and its 3 more exchanges, wait until its monitor hears all 4
    `roq kpi-record -q QUEUE`   the monitors' KPI stream (CPU, RSS, rates, latency histograms)
    `roq bench -q QUEUE --publishers N --rate R --payload 20 --seconds S`   (root namespace)
    hard-link the queue's log segments out, delete the queue

then, per figure, `roq analytics` (spark-submit) over the log and the KPI log writes the
Parquet tables; the `evaluation` table (one file per figure) and the runs' lines (the bench's
summary, `uptime` before and after) are copied to --out with PNG charts drawn from the Parquet.

    roq-heavy python benchmarks/thesis.py --seconds 20 --appendix --out docs/thesis
    python benchmarks/thesis.py --render-only --out docs/thesis      # charts from the Parquet

Needs root (namespaces), iproute2, Java (ZooKeeper, Spark) and the analytics extra. The
namespaces and every process in them are removed at the end, on Ctrl-C and on SIGTERM.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests" / "faults"))  # the namespace helpers of the fault tests

ROQ = str(Path(sys.executable).with_name("roq"))
GCM_PORT = 5000  # ports.base's default
ZK_PORT = 2181
STAT_PERIOD_MS = 2000  # monitor.stat.period: ~10 KPI reports in a 20 s level
PAYLOAD = 20
FIGURES = {"5.1": {"useLog": False}, "5.2": {"useLog": True, "replicationFactor": 2}}
LEVELS = "5x3000,10x3000,20x3000"
APPENDIX = "40x3000,50x3500,5x30000"  # Appendix A's extra rows (its 50p row is 3,500 msg/s)
QUEUE_RE = re.compile(r"^t(\d)(\d)p(\d+)r(\d+)$")

# The thesis's own numbers (seed 004, Fig. 5.1 and 5.2): per load level, one value per exchange
# (Exchange_1..4). Throughput in bytes/min, CPU in %, memory in MB, latency as printed (the
# thesis gives no unit).
THESIS: dict[str, dict[int, dict[str, list[float]]]] = {
    "5.1": {
        5: {"throughput": [18535422, 18234692, 17973622, 18445632], "cpu": [6, 4, 8, 6],
            "memory": [20, 18, 20, 19], "latency": [155248, 201589, 213592, 198382]},
        10: {"throughput": [36299823, 34892833, 36238172, 35819823], "cpu": [16, 22, 18, 21],
             "memory": [14, 32, 23, 17], "latency": [1265960, 1538293, 1192323, 1629323]},
        20: {"throughput": [67313799, 70213128, 68320329, 67639833], "cpu": [22, 18, 21, 19],
             "memory": [19, 32, 24, 29], "latency": [1464325, 1192393, 1673892, 1582030]},
    },
    "5.2": {
        5: {"throughput": [15962257, 15263943, 16149334, 15843758], "cpu": [7, 13, 12, 9],
            "memory": [82, 102, 76, 65], "latency": [289771, 302148, 278345, 310349]},
        10: {"throughput": [33721394, 32893238, 30873238, 33536723], "cpu": [14, 17, 18, 13],
             "memory": [129, 108, 201, 138], "latency": [3534533, 3829836, 3919280, 3567192]},
        20: {"throughput": [59342512, 58290900, 57389932, 55843290], "cpu": [13, 11, 9, 3],
             "memory": [89, 93, 102, 89], "latency": [5523543, 5329454, 5834933, 5932800]},
    },
}  # fmt: skip
METRICS = [
    ("throughput", "throughput per exchange (MB/min)", 1e-6),
    ("cpu", "CPU per exchange (% of one core)", 1.0),
    ("memory", "RSS per exchange (MB)", 1.0),
    ("latency", "latency p50 (ms, the queue's)", 1.0),
]


@dataclass(frozen=True)
class Level:
    producers: int
    rate: int

    def queue(self, figure: str) -> str:
        return f"t{figure.replace('.', '')}p{self.producers}r{self.rate}"


def parse_levels(text: str) -> list[Level]:
    """`5x3000,10x3000` → levels; a bad item names itself."""
    levels = []
    for item in filter(None, (part.strip() for part in text.split(","))):
        match = re.fullmatch(r"(\d+)x(\d+)", item)
        if not match or int(match[1]) < 1 or int(match[2]) < 1:
            raise SystemExit(f"--levels: {item!r} is not PRODUCERSxRATE (e.g. 5x3000)")
        levels.append(Level(int(match[1]), int(match[2])))
    return levels


def parse_queue(name: str) -> tuple[str, Level] | None:
    match = QUEUE_RE.match(name)
    if not match:
        return None
    return f"{match[1]}.{match[2]}", Level(int(match[3]), int(match[4]))


def uptime() -> str:
    done = subprocess.run(["uptime"], capture_output=True, text=True, check=False)
    return done.stdout.strip()


# --- the testbed ------------------------------------------------------------------------------
@dataclass
class Testbed:
    """ZooKeeper and the GCM on m1, a host on m2 and m3; `start(figure)` runs a fresh cluster
    with the figure's settings, `stop()` kills every process of the three machines."""

    work: Path
    net: Any = None
    procs: list[Any] = field(default_factory=list)
    namespace: str = ""

    def create(self) -> None:
        from faultnet import Network

        from roq.testing.cluster import act_as_admin

        self.net = Network(3)
        self.net.create()
        act_as_admin(self.work / "security")  # the bench and recorder act as the admin

    @property
    def gcm(self) -> str:
        return f"{self.net.machines[0].address}:{GCM_PORT}"

    @property
    def zk(self) -> str:
        return f"{self.net.machines[0].address}:{ZK_PORT}"

    def host_dir(self, figure: str, machine: str) -> Path:
        return self.work / f"fig{figure}" / machine / "log"

    def start(self, figure: str) -> None:
        from faultcluster import Proc

        from roq.system.spawn import roq_command
        from roq.testing.cluster import wait_for

        m1, m2, m3 = self.net.machines
        self.namespace = f"/thesis-{figure.replace('.', '')}-{uuid.uuid4().hex[:6]}"
        tmp = self.work / f"fig{figure}"
        tmp.mkdir(parents=True, exist_ok=True)
        self.procs = [Proc("zk", m1, self._zk_argv(tmp / "zk"), tmp / "zk.log")]
        self.procs[0].start()
        wait_for(lambda: _serving(m1.address), 60, f"ZooKeeper on {self.zk}", 0.3)
        common = {
            "zk.servers": self.zk,
            "zk.namespace": self.namespace,
            "security.dir": str(self.work / "security"),
        }
        gcm = {**common, "network.interface": m1.address}
        self.procs.append(Proc("gcm", m1, roq_command("gcm", *_defines(gcm)), tmp / "gcm.log"))
        for machine in (m2, m3):
            host = {
                **common,
                **FIGURES[figure],
                "network.interface": machine.address,
                "host.name": machine.name,
                "directory": str(self.host_dir(figure, machine.name)),
                "exchange.max.perhost": 2,
                "scaling.policy": "null",
                "log.flush": "interval",
                "monitor.stat.period": STAT_PERIOD_MS,
            }
            argv = roq_command("host", *_defines(host))
            self.procs.append(
                Proc(f"host-{machine.name}", machine, argv, tmp / f"{machine.name}.log")
            )
        for proc in self.procs[1:]:
            proc.start()
        wait_for(lambda: len(self.admin().status().hosts) >= 2, 90, "2 hosts registered", 0.5)

    def _zk_argv(self, data: Path) -> list[str]:
        from roq.local.zkserver import classpath

        data.mkdir(parents=True, exist_ok=True)
        config = data / "zoo.cfg"
        config.write_text(
            f"tickTime=500\ndataDir={data}\nclientPort={ZK_PORT}\n"
            f"clientPortAddress={self.net.machines[0].address}\nadmin.enableServer=false\n"
            "4lw.commands.whitelist=ruok,srvr\nmaxSessionTimeout=60000\n"
        )
        java = shutil.which("java") or "java"
        return [
            java,
            "-Xmx256m",
            "-XX:+UseSerialGC",
            "-cp",
            classpath(),
            "-Dzookeeper.root.logger=WARN,CONSOLE",
            f"-Dzookeeper.log.dir={data}",
            "org.apache.zookeeper.server.quorum.QuorumPeerMain",
            str(config),
        ]

    def admin(self) -> Any:
        from roq.client.admin import AdminClient

        return AdminClient(zk=self.zk, namespace=self.namespace, timeout_ms=30000)

    def stop(self) -> None:
        for proc in reversed(self.procs):
            if proc.running():
                proc.process.send_signal(signal.SIGTERM)
        for proc in reversed(self.procs):
            proc.reap(15)
        for machine in self.net.machines if self.net else []:
            for _ in range(3):
                if not machine.signal_all(signal.SIGKILL):
                    break
                time.sleep(0.3)
        self.procs = []

    def destroy(self) -> None:
        if self.net is not None:
            self.stop()
            self.net.destroy()
            self.net = None


def _serving(address: str) -> bool:
    from roq.local.zkserver import is_serving

    return is_serving(address, ZK_PORT)


def _defines(values: dict[str, Any]) -> list[str]:
    text = {
        k: ("true" if v is True else "false" if v is False else str(v)) for k, v in values.items()
    }
    return [arg for k, v in text.items() for arg in ("-D", f"{k}={v}")]


# --- one load level ---------------------------------------------------------------------------
@contextlib.contextmanager
def level_queue(bed: Testbed, queue: str) -> Iterator[None]:
    """The queue with 4 exchanges, heard by its monitor; deleted afterwards, so the next level
    gets the hosts' 2 + 2 exchange slots."""
    from roq.client.admin import AdminRefused
    from roq.client.live import monitor_status
    from roq.testing.cluster import wait_for

    with bed.admin() as admin:
        try:
            admin.create_queue(queue)
        except AdminRefused:  # a retried request whose first attempt created it
            if not admin.queue_exists(queue):
                raise

    def exchanges() -> int:
        with bed.admin() as admin:
            record = next((q for q in admin.list_queues() if q.name == queue), None)
        status = monitor_status(record.monitor_host) if record else None
        return len(status.exchanges) if status else 0

    wait_for(lambda: exchanges() >= 1, 90, f"{queue}'s first exchange heard by its monitor", 0.5)
    for _ in range(8):  # one at a time, each heard before the next: 2 per host's 2 slots
        have = exchanges()
        if have >= 4:
            break
        try:  # with R=2 the monitor may add one for the copies meanwhile: then this one is
            with bed.admin() as admin:  # refused for want of a slot, and the count is checked
                admin.create_exchange(queue, uuid.uuid4().hex)
        except AdminRefused as error:
            print(f"{queue}: exchange not created ({error}); counting again", flush=True)
        wait_for(lambda h=have: exchanges() > h, 90, f"{queue}: exchange {have + 1} heard", 0.5)
    wait_for(lambda: exchanges() >= 4, 30, f"{queue}'s 4 exchanges heard by its monitor", 0.5)
    try:
        yield
    finally:
        with bed.admin() as admin:
            admin.delete_queue(queue)

        def gone() -> bool:
            with bed.admin() as admin:
                return not admin.queue_exists(queue)

        wait_for(gone, 90, f"{queue} deleted", 0.5)


def run_level(bed: Testbed, figure: str, level: Level, args: argparse.Namespace) -> dict[str, Any]:
    queue = level.queue(figure)
    fig_dir = bed.work / f"fig{figure}"
    kpi_dir = fig_dir / "kpi"
    line: dict[str, Any] = {
        "figure": figure,
        "queue": queue,
        "producers": level.producers,
        "rate": level.rate,
        "payload": PAYLOAD,
        "seconds": args.seconds,
    }
    with level_queue(bed, queue):
        recorder = subprocess.Popen(
            [
                ROQ,
                "kpi-record",
                "--gcm",
                bed.gcm,
                "-q",
                queue,
                "--dir",
                str(kpi_dir),
                "--source",
                queue,
                "--seconds",
                str(args.seconds + 600),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            segment = kpi_dir / "_kpi" / queue / ("0" * 20 + ".log")
            from roq.testing.cluster import wait_for

            wait_for(lambda: segment.exists() and segment.stat().st_size > 0, 30, "a KPI record")
            line["uptime_before"] = uptime()
            line["bench"] = bench(bed, queue, level, args)
            line["uptime_after"] = uptime()
            time.sleep(2 * STAT_PERIOD_MS / 1000)  # the subscribers' last latency report
        finally:
            recorder.send_signal(signal.SIGTERM)
            try:
                line["kpi_record"] = recorder.communicate(timeout=20)[0].strip()[-300:]
            except subprocess.TimeoutExpired:
                recorder.kill()
                recorder.communicate()
        line["log_files"] = link_log(bed, figure, queue)
    return line


def bench(bed: Testbed, queue: str, level: Level, args: argparse.Namespace) -> dict[str, Any]:
    cmd = [
        ROQ,
        "bench",
        "--gcm",
        bed.gcm,
        "-q",
        queue,
        "--publishers",
        str(level.producers),
        "--rate",
        str(level.rate),
        "--payload",
        str(PAYLOAD),
        "--seconds",
        str(args.seconds),
    ]
    limit = args.seconds + 240
    try:
        done = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=limit)
    except subprocess.TimeoutExpired:
        return {"error": f"roq bench did not end within {limit} s"}
    lines = done.stdout.strip().splitlines()
    try:
        result: dict[str, Any] = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        return {"error": f"exit {done.returncode}: {done.stderr[-1500:]}"}
    result.pop("series", None)
    return result


def link_log(bed: Testbed, figure: str, queue: str) -> int:
    """Hard links of the queue's segments from both hosts into one log directory for the job
    (`<log>/<queue>/<exchange>/`); the replicas' copies stay out (the job would skip them)."""
    count = 0
    for machine in ("m2", "m3"):
        source = bed.host_dir(figure, machine) / queue
        for segment in source.glob("*/*.log"):
            target = bed.work / f"fig{figure}" / "log" / queue / segment.parent.name / segment.name
            target.parent.mkdir(parents=True, exist_ok=True)
            os.link(segment, target)
            count += 1
    return count


# --- the job and the outputs ------------------------------------------------------------------
def analytics(work: Path, figure: str, args: argparse.Namespace) -> Path:
    """`roq analytics` (it builds and runs spark-submit) over one figure's log and KPI log."""
    fig_dir = work / f"fig{figure}"
    (fig_dir / "log").mkdir(parents=True, exist_ok=True)
    out = fig_dir / "out"
    cmd = [
        ROQ,
        "analytics",
        "--log-dir",
        str(fig_dir / "log"),
        "--kpi-dir",
        str(fig_dir / "kpi"),
        "--out",
        str(out),
        "--master",
        args.master,
        "--split-mb",
        "16",
    ]
    print("$", " ".join(cmd), flush=True)
    with (fig_dir / "analytics.log").open("w") as log_file:
        code = subprocess.run(
            cmd, stdout=log_file, stderr=subprocess.STDOUT, check=False
        ).returncode
    if code != 0:
        raise SystemExit(f"roq analytics exited with {code}: see {fig_dir / 'analytics.log'}")
    return out


def keep_table(out: Path, table: str, target: Path) -> None:
    """Spark's part files of one table as one small Parquet file."""
    import pyarrow.parquet as pq

    pq.write_table(pq.read_table(out / table), target)


def evaluation_rows(out: Path) -> dict[str, dict[int, dict[str, list[float]]]]:
    """From the per-figure `evaluation` Parquet files in `out`: figure → producers (the key is
    producers × 100,000 + rate when the rate is not 3,000) → metric → one value per exchange,
    exchanges in the order of their ids. An exchange has one row per load level the job saw in
    its minutes (with the log, a minute at a level's edge counts fewer producers): its rows are
    combined, weighted by minutes. Throughput is bytes/min from the exchange's KPI over the
    periods that carried traffic (the log's count over the active span when the KPI has none;
    0 for an exchange without producers); memory is the largest RSS."""
    import pyarrow.parquet as pq

    grouped: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for path in sorted(out.glob("fig*.evaluation.parquet")):
        for row in pq.read_table(path).to_pylist():
            parsed = parse_queue(row["queue"])
            if parsed is None or row["exchange"] in ("", None):
                continue  # a subscriber's latency without an exchange, or another queue
            figure, level = parsed
            key = level.producers if level.rate == 3000 else level.producers * 100_000 + level.rate
            grouped.setdefault((figure, key, row["exchange"]), []).append(row)
    result: dict[str, dict[int, dict[str, list[float]]]] = {}
    for (figure, key, _), rows in sorted(grouped.items()):
        cell = result.setdefault(figure, {}).setdefault(key, {m: [] for m, _, _ in METRICS})
        throughput = _weighted(rows, [_throughput(r) for r in rows])
        cell["throughput"].append(0.0 if throughput != throughput else throughput)
        cpu = _weighted(rows, [r.get("busy_cpu_pct") for r in rows])
        cell["cpu"].append(_weighted(rows, [r.get("cpu_pct") for r in rows]) if cpu != cpu else cpu)
        memory = [r["mem_rss_mb"] for r in rows if r.get("mem_rss_mb") is not None]
        cell["memory"].append(max(memory) if memory else float("nan"))
        # 0 µs: the subscriber reported periods without a sample (it received nothing)
        latency = [(r.get("latency_p50_us") or 0) / 1000 for r in rows]
        cell["latency"].append(_weighted(rows, [v if v > 0 else None for v in latency]))
    return result


def _weighted(rows: list[dict[str, Any]], values: list[float | None]) -> float:
    """The minutes-weighted mean of the values that exist; NaN when none does."""
    pairs = [
        (float(v), float(r.get("minutes") or 1))
        for r, v in zip(rows, values, strict=True)
        if v is not None and v == v
    ]
    total = sum(w for _, w in pairs)
    return sum(v * w for v, w in pairs) / total if total else float("nan")


def _throughput(row: dict[str, Any]) -> float | None:
    if row.get("busy_bytes_per_s") is not None:
        return float(row["busy_bytes_per_s"]) * 60
    if row.get("active_msgs_per_s") is not None:
        return float(row["active_msgs_per_s"]) * PAYLOAD * 60
    return None


def level_label(key: int) -> str:
    if key < 100_000:
        return f"{key}p×3,000"
    return f"{key // 100_000}p×{key % 100_000:,}"


def render(out: Path) -> list[Path]:
    """One PNG per figure (4 panels: level × exchange, the thesis's table as bars) and one of
    roq beside the thesis; `table.md` with the same numbers."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    data = evaluation_rows(out)
    written = []
    for figure, levels in sorted(data.items()):
        keys = sorted(levels)
        fig, axes = plt.subplots(2, 2, figsize=(11, 7))
        for ax, (metric, title, scale) in zip(axes.flat, METRICS, strict=True):
            width = 0.8 / max(len(levels[k][metric]) for k in keys)
            for x, key in enumerate(keys):
                for i, value in enumerate(levels[key][metric]):
                    ax.bar(
                        x + i * width,
                        value * scale,
                        width,
                        color=f"C{i}",
                        label=f"Exchange_{i + 1}" if x == 0 else None,
                    )
            ax.set_xticks([x + 0.4 - width / 2 for x in range(len(keys))])
            ax.set_xticklabels([level_label(k) for k in keys], fontsize=8)
            ax.set_title(title, fontsize=10)
            if metric == "latency":
                ax.set_yscale("log")  # milliseconds at 5 producers, seconds when saturated
        axes.flat[0].legend(fontsize=8)
        log = "with the log, R=2" if figure == "5.2" else "without the log"
        fig.suptitle(f"roq, Figure {figure} ({log}): 2 hosts × 2 exchanges, 20 B messages")
        fig.tight_layout()
        path = out / f"fig{figure.replace('.', '_')}.png"
        fig.savefig(path, dpi=90)
        plt.close(fig)
        written.append(path)
    written.append(_compare_chart(out, data, plt))
    (out / "table.md").write_text(table(data))
    written.append(out / "table.md")
    if (out / "runs.jsonl").exists():
        (out / "runs.md").write_text(runs_table(out / "runs.jsonl"))
        written.append(out / "runs.md")
    return written


def runs_table(path: Path) -> str:
    """Markdown: what `roq bench` saw per level (the latest run of each), with the load
    average before and after it: the machine is shared."""
    latest: dict[str, dict[str, Any]] = {}
    for text in path.read_text().splitlines():
        if text.strip():
            line = json.loads(text)
            latest[line["queue"]] = line
    lines = [
        "| Fig. | producers × msg/s | published msg/s | delivered (of published) | p50 / p99 ms "
        "| load average before → after |",
        "|---|---|---|---|---|---|",
    ]
    for line in latest.values():
        b = line.get("bench", {})
        lat = b.get("latency_ms") or {}
        p50, p99 = lat.get("p50"), lat.get("p99")
        latency = "–" if p50 is None else f"{p50:,.0f} / {p99:,.0f}"
        load = f"{_load1(line.get('uptime_before', ''))} → {_load1(line.get('uptime_after', ''))}"
        delivered = f"{b.get('delivered', 0):,} of {b.get('published', 0):,}"
        lines.append(
            f"| {line['figure']} | {line['producers']} × {line['rate']:,} | "
            f"{b.get('published_msg_s', 0):,} | {delivered} | {latency} | {load} |"
        )
    return "\n".join(lines) + "\n"


def _load1(uptime_text: str) -> str:
    match = re.search(r"load average: ([\d.]+)", uptime_text)
    return match[1] if match else "?"


def _compare_chart(out: Path, data: dict[str, Any], plt: Any) -> Path:
    fig, axes = plt.subplots(1, 3, figsize=(13, 4))
    for ax, (metric, title, scale) in zip(axes, METRICS[:3], strict=True):
        for offset, figure in enumerate(("5.1", "5.2")):
            for who, source in (("thesis", THESIS), ("roq", data)):
                levels = source.get(figure, {})
                keys = [k for k in (5, 10, 20) if k in levels]
                means = [_mean(levels[k][metric]) * scale for k in keys]
                ax.plot(
                    keys,
                    means,
                    marker="o",
                    linestyle="-" if who == "roq" else "--",
                    color=f"C{offset}",
                    alpha=1.0 if who == "roq" else 0.6,
                    label=f"{who}, Fig. {figure}",
                )
        ax.set_xlabel("producers (3,000 msg/s each)")
        ax.set_title(f"mean {title}", fontsize=10)
    axes[0].legend(fontsize=8)
    fig.suptitle("roq (this machine, one host's 2 cores) beside the thesis (3 EC2 machines)")
    fig.tight_layout()
    path = out / "thesis_vs_roq.png"
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return path


def _mean(values: list[float]) -> float:
    finite = [v for v in values if v == v]
    return sum(finite) / len(finite) if finite else float("nan")


def _show(value: float) -> str:
    return "–" if value != value else f"{value:,.1f}"


def table(data: dict[str, dict[int, dict[str, list[float]]]]) -> str:
    """Markdown: per figure and level, roq's mean over the exchanges beside the thesis's."""
    lines = [
        "| Fig. | level | throughput MB/min per exchange (roq / thesis) | roq, 4 exchanges "
        "| CPU % (roq / thesis) | RSS MB (roq / thesis) | roq p50 ms | thesis latency |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for figure in sorted(data):
        for key in sorted(data[figure]):
            ours, theirs = data[figure][key], THESIS.get(figure, {}).get(key)

            def pair(metric: str, scale: float, ours: Any = ours, theirs: Any = theirs) -> str:
                mine = _show(_mean(ours[metric]) * scale)
                return f"{mine} / {_mean(theirs[metric]) * scale:,.1f}" if theirs else f"{mine} / –"

            thesis_lat = f"{_mean(theirs['latency']):,.0f}" if theirs else "–"
            lines.append(
                f"| {figure} | {level_label(key)} | {pair('throughput', 1e-6)} | "
                f"{sum(v for v in ours['throughput'] if v == v) * 1e-6:,.1f} | "
                f"{pair('cpu', 1)} | {pair('memory', 1)} | "
                f"{_show(_mean(ours['latency']))} | {thesis_lat} |"
            )
    return "\n".join(lines) + "\n"


# --- the whole run ----------------------------------------------------------------------------
def run(args: argparse.Namespace) -> None:
    levels = parse_levels(args.levels) + (parse_levels(APPENDIX) if args.appendix else [])
    figures = [f.strip() for f in args.figures.split(",") if f.strip()]
    unknown = [f for f in figures if f not in FIGURES]
    if unknown:
        raise SystemExit(f"--figures: {', '.join(unknown)} unknown (5.1, 5.2)")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="roq-thesis-", dir=args.work))
    bed = Testbed(work)
    lines = []
    try:
        bed.create()
        for figure in figures:
            bed.start(figure)
            for level in levels:
                print(f"Fig. {figure}: {level.producers} × {level.rate} msg/s …", flush=True)
                lines.append(run_level(bed, figure, level, args))
                print(json.dumps(lines[-1]), flush=True)
            bed.stop()
    finally:
        bed.destroy()  # also on Ctrl-C; SIGTERM and atexit are faultnet's
        with (out / "runs.jsonl").open("a") as runs:
            for line in lines:
                runs.write(json.dumps(line) + "\n")
    for figure in figures:
        result = analytics(work, figure, args)
        keep_table(result, "evaluation", out / f"fig{figure.replace('.', '_')}.evaluation.parquet")
    for path in render(out):
        print("wrote", path)
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--figures", default="5.1,5.2", help="5.1 (no log), 5.2 (log, R=2)")
    parser.add_argument("--levels", default=LEVELS, help="PRODUCERSxRATE,...")
    parser.add_argument("--appendix", action="store_true", help=f"also {APPENDIX}")
    parser.add_argument("--seconds", type=float, default=20.0, help="publishing per level")
    parser.add_argument("--master", default="local[2]", help="Spark master")
    parser.add_argument("--out", default=str(ROOT / "docs" / "thesis"))
    parser.add_argument("--work", default=None, help="parent of the run's scratch directory")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    parser.add_argument("--render-only", action="store_true", help="charts from --out's Parquet")
    args = parser.parse_args(argv)
    if args.render_only:
        for path in render(Path(args.out)):
            print("wrote", path)
        return
    run(args)


if __name__ == "__main__":
    main()
