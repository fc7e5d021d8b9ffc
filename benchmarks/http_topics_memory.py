"""The HTTP gateway's topics at 100,000 (issue 29 item 4): memory, state log size and restart time.

Starts a one-machine cluster (`roq up`, ports from --base, data under --data), then, through the
gateway's own store client (`roq.client.topics.TopicClient`, commands 50-56 on the monitor of
`http-0`, from --threads threads; no HTTP on the bulk path, whose per-request CPU would make it
minutes longer):

  1. registers --topics topics (`maxTopics` set to that: the default is 10,000);
  2. subscribes one subscriber to each;
  3. checks the bound on topics: one topic more than maxTopics (store client and HTTP);
  4. kills the monitor of http-0 (SIGKILL; its host starts it again on its own log) and times
     until the topics answer again, through a new store client and through HTTP; then replays a
     copy of the state log, and compacts it, in a process of its own (times, RSS);
  5. subscribes --fan-subscribers more subscribers to each of the first --fan-topics topics
     (many subscribers on few topics), then one more past maxSubscribers;
  6. publishes, gets and acks one message through the gateway's HTTP API on --http-sample
     topics (the gateway's memory with messages of that many topics);
  7. subscribes the one-per-topic subscribers again (a write each) in rounds until the state
     log has been compacted (at most --churn-rounds rounds); 4 again;
  8. stops `roq up` (SIGTERM) and starts it again, --up-restarts times, timed as in 4.

Measures VmRSS / VmHWM (/proc) of the monitor, the gateway, the exchanges, ZooKeeper, the GCM and
host, the state log's bytes on disk (the monitor's and its copies' on the exchanges), the
monitor's CPU while idle (with py-spy, where its samples were), and the compactions the monitor
logged. Prints progress to stderr, writes the results as JSON (--out); docs/benchmarks.md, "HTTP
topics: memory with 100,000 topics and subscribers".

    PYTHONPATH=appliance .venv/bin/python benchmarks/http_topics_memory.py \
        --out benchmarks/results/http_topics_memory.json

Traffic on 127.0.0.1 only; every process it started is stopped at the end, and the data
directory removed unless --keep or something failed (then its up.log is there to read).
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import zlib
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from roq.client.topics import TopicClient
from roq.errors import CoordinationError, TopicRefused
from roq.testing.cluster import child_pids

REPO = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
TICKS = os.sysconf("SC_CLK_TCK")
QUEUE = "http-0"
NAMESPACE = "/roq"
READY_TIMEOUT_S = 120.0
ANSWER_TIMEOUT_S = 180.0


def log(text: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} {text}", file=sys.stderr, flush=True)


# --- /proc and the disk ----------------------------------------------------------------------
def proc_status(pid: int) -> dict[str, float]:
    """VmRSS and VmHWM in MB (empty if the process is gone)."""
    found: dict[str, float] = {}
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                name, _, rest = line.partition(":")
                if name in ("VmRSS", "VmHWM"):
                    found[name] = round(int(rest.split()[0]) / 1024, 1)
    except OSError:
        pass
    return found


def cpu_ticks(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return int(fields[11]) + int(fields[12])  # utime, stime


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return ""


def dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.exists() else 0


def segments(path: Path) -> list[str]:
    return sorted(f.name for f in path.rglob("*.log")) if path.exists() else []


def end_offset(state_dir: Path) -> int:
    """Where the newest epoch's state log ends (offsets only grow: compaction drops segments
    and appends its snapshot): its last segment's base offset (its name) plus its size."""
    epochs = [d for d in state_dir.glob("state.*") if d.name.split(".")[1].isdigit()]
    if not epochs:
        return 0
    newest = max(epochs, key=lambda d: int(d.name.split(".")[1]))
    return max((int(f.stem) + f.stat().st_size for f in newest.glob("*.log")), default=0)


# --- the cluster -----------------------------------------------------------------------------
@dataclass
class Cluster:
    data: Path
    base: int
    max_topics: int
    queues: int
    process: subprocess.Popen[bytes] | None = None
    token: str = ""
    log_offset: int = 0  # up.log read up to here by `new_log_lines`
    defines: list[str] = field(default_factory=list)

    @property
    def http_port(self) -> int:
        return self.base + 80

    @property
    def gcm(self) -> str:
        return f"127.0.0.1:{self.base}"

    @property
    def up_log(self) -> Path:
        return self.data / "up.log"

    @property
    def state_dir(self) -> Path:
        return self.home / "log" / "_state" / QUEUE

    def command(self) -> list[str]:
        b = self.base
        self.defines = [
            f"zk.servers=127.0.0.1:{b + 181}",
            f"ports.base={b}",
            f"hcm.port={b + 100}",
            f"http.port={b + 80}",
            f"monitor.base.port={b + 500}",
            f"statmonitor.base.port={b + 800}",
            f"exchange.base.port={b + 1000}",
            f"maxTopics={self.max_topics}",
            f"http.queues={self.queues}",
        ]
        command = [PYTHON, "-m", "roq", "up", "--data-dir", str(self.data / "data")]
        for define in self.defines:
            command += ["-D", define]
        return command

    def env(self) -> dict[str, str]:
        env = {**os.environ, "PYTHONPATH": str(REPO / "appliance"), "ROQ_HOME": str(self.home)}
        env.pop("ROQ_CREDENTIALS", None)
        env.pop("ROQ_SECURITY", None)
        return env

    @property
    def home(self) -> Path:
        return self.data / "data"

    def start(self, *, wait_gateway: bool = True) -> float:
        """`roq up`, until it says it is up (and the gateway answers); returns the monotonic
        time it was started at."""
        self.data.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with self.up_log.open("ab") as out:
            self.process = subprocess.Popen(
                self.command(), env=self.env(), stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=REPO, start_new_session=True,
            )  # fmt: skip
        deadline = time.monotonic() + READY_TIMEOUT_S
        while "roq is up" not in self.up_log.read_text(errors="replace")[self.log_offset :]:
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"roq up did not come up: see {self.up_log}")
            time.sleep(0.3)
        if not self.token:
            self.token = subprocess.run(
                [PYTHON, "-m", "roq", "keys", "token"], env=self.env(), cwd=REPO,
                capture_output=True, text=True, check=True, timeout=60,
            ).stdout.strip()  # fmt: skip
        probe = {"owner": "", "topic": ""}  # 400 once the gateway serves
        while wait_gateway and http_status(self, "/v1/topic/register", probe) in (0, 503):
            if time.monotonic() > deadline:
                raise SystemExit(f"the gateway did not answer: see {self.up_log}")
            time.sleep(0.3)
        return started

    def stop(self) -> None:
        if self.process is None:
            return
        pid = self.process.pid
        children = child_pids(pid)
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        time.sleep(1)
        for child in children:  # anything of ours still there (by its pid)
            if cmdline(child) and ("roq" in cmdline(child) or "zookeeper" in cmdline(child)):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(child, signal.SIGKILL)
        self.process = None

    def pids(self) -> dict[str, int]:
        """role → pid of what `roq up` runs now: monitor, http, exchange-1.., gcm, host."""
        assert self.process is not None
        found: dict[str, int] = {}
        exchanges = 0
        for pid in sorted(child_pids(self.process.pid)):
            line = cmdline(pid)
            if f"roq monitor {QUEUE} " in line:
                found["monitor"] = pid
            elif f"roq exchange {QUEUE} " in line:
                exchanges += 1
                found[f"exchange-{exchanges}"] = pid
            elif " roq http " in line:
                found["gateway"] = pid
            elif " roq gcm " in line:
                found["gcm"] = pid
            elif " roq host " in line:
                found["host"] = pid
            elif "zookeeper" in line.lower():
                found["zookeeper"] = pid
        return found

    def memory(self) -> dict[str, dict[str, float]]:
        return {role: proc_status(pid) for role, pid in self.pids().items()}

    def disk(self) -> dict[str, Any]:
        """The state log's bytes: the monitor's, and each copy's on the exchanges."""
        copies = self.home / "log" / "_replicas" / QUEUE
        return {
            "state_log_bytes": dir_bytes(self.state_dir),
            "state_log_segments": segments(self.state_dir),
            "state_log_end_offset": end_offset(self.state_dir),
            "copies_bytes": {c.name: dir_bytes(c) for c in sorted(copies.glob("state.*@*"))},
        }

    def new_log_lines(self) -> list[str]:
        text = self.up_log.read_bytes()
        lines = text[self.log_offset :].decode(errors="replace").splitlines()
        self.log_offset = len(text)
        return lines

    def idle_cpu(self, role: str, seconds: float) -> dict[str, Any]:
        """The share of one core `role` used over `seconds` of no traffic (percent), and, with
        py-spy at hand, where its samples were: the share in StateLog.keys (a scan of every
        live key) and the functions sampled most."""
        pid = self.pids()[role]
        spy = shutil.which("py-spy") or str(Path(PYTHON).parent / "py-spy")
        raw = self.data / f"idle-{pid}.txt"
        profiler = None
        if Path(spy).exists():
            profiler = subprocess.Popen(
                [spy, "record", "--pid", str(pid), "--duration", str(int(seconds)),
                 "--format", "raw", "--output", str(raw), "--nonblocking"],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
            )  # fmt: skip
        before = cpu_ticks(pid)
        time.sleep(seconds)
        found: dict[str, Any] = {"pct": round(100 * (cpu_ticks(pid) - before) / TICKS / seconds, 2)}
        if profiler is not None:
            profiler.wait(60)
            found.update(profile_summary(raw))
            raw.unlink(missing_ok=True)
        return found


def profile_summary(raw: Path) -> dict[str, Any]:
    """From py-spy's raw output (one "frame;frame;... count" line a stack): the samples, the
    share with StateLog.keys on the stack, and the innermost roq functions sampled most."""
    if not raw.exists():
        return {}
    total = in_keys = 0
    leaves: dict[str, int] = {}
    for line in raw.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        if not count.isdigit():
            continue
        n = int(count)
        total += n
        frames = stack.split(";")
        if any(f.startswith("StateLog.keys") for f in frames):
            in_keys += n
        roq = [f for f in frames if "roq/" in f]
        leaf = re.sub(r":\d+\)$", ")", roq[-1] if roq else frames[-1])
        leaves[leaf] = leaves.get(leaf, 0) + n
    top = sorted(leaves.items(), key=lambda kv: -kv[1])[:5]
    return {
        "samples": total,
        "share_in_statelog_keys": round(in_keys / total, 3) if total else None,
        "top_roq_functions": [[name, round(n / total, 3)] for name, n in top] if total else [],
    }


def http_status(cluster: Cluster, path: str, body: dict[str, Any]) -> int:
    return http_call(cluster, path, body)[0]


def http_call(cluster: Cluster, path: str, body: dict[str, Any]) -> tuple[int, dict[str, Any]]:
    """(status, JSON body) of one POST; (0, {}) if the gateway does not answer."""
    try:
        conn = http.client.HTTPConnection("127.0.0.1", cluster.http_port, timeout=30)
        conn.request(
            "POST", path, json.dumps(body),
            {"Authorization": f"Bearer {cluster.token}", "Content-Type": "application/json"},
        )  # fmt: skip
        response = conn.getresponse()
        raw = response.read()
        conn.close()
    except OSError:
        return 0, {}
    try:
        return response.status, json.loads(raw or b"{}")
    except ValueError:
        return response.status, {}


# --- the load --------------------------------------------------------------------------------
def topic_name(i: int) -> str:
    return f"topic-{i:06d}"


def owner_name(i: int) -> str:
    return f"owner-{i % 1000:04d}"


def subscriber_name(i: int) -> str:
    return f"sub-{i:06d}"


class Progress:
    """What the workers did, read by the sampler."""

    def __init__(self) -> None:
        self.phase = "start"
        self.done = 0
        self.total = 0
        self.started = time.monotonic()
        self.lock = threading.Lock()

    def begin(self, phase: str, total: int) -> None:
        with self.lock:
            self.phase, self.done, self.total, self.started = phase, 0, total, time.monotonic()

    def add(self, n: int = 1) -> None:
        with self.lock:
            self.done += n


def in_threads(threads: int, count: int, work: Callable[[int], None], progress: Progress) -> float:
    """work(i) for i in range(count) over `threads` threads; the seconds it took."""
    errors: list[BaseException] = []

    def run(first: int) -> None:
        try:
            for i in range(first, count, threads):
                work(i)
                progress.add()
        except BaseException as error:  # reported by the caller
            errors.append(error)

    started = time.monotonic()
    workers = [threading.Thread(target=run, args=(k,), daemon=True) for k in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    if errors:
        raise errors[0]
    return time.monotonic() - started


def retried(call: Callable[[], Any]) -> Any:
    """The call, asked again while the monitor is busy (CoordinationError: a 503)."""
    for attempt in range(10):
        try:
            return call()
        except CoordinationError:
            if attempt == 9:
                raise
            time.sleep(0.5)
    return None


class Sampler(threading.Thread):
    """Every `every` seconds: the phase's progress, the monitor's and the gateway's RSS and the
    state log's bytes, to stderr and the timeline."""

    def __init__(self, cluster: Cluster, progress: Progress, every: float):
        super().__init__(daemon=True)
        self.cluster, self.progress, self.every = cluster, progress, every
        self.timeline: list[dict[str, Any]] = []
        self.stop = threading.Event()
        self.t0 = time.monotonic()

    def run(self) -> None:
        while not self.stop.wait(self.every):
            try:
                self.sample()
            except (OSError, KeyError, AssertionError) as error:
                log(f"sampler: {error}")

    def sample(self) -> None:
        p = self.progress
        memory = self.cluster.memory()
        disk = self.cluster.disk()
        elapsed = time.monotonic() - p.started
        row = {
            "t": round(time.monotonic() - self.t0, 1),
            "phase": p.phase,
            "done": p.done,
            "rate": round(p.done / elapsed) if elapsed > 0 else 0,
            "monitor_rss_mb": memory.get("monitor", {}).get("VmRSS"),
            "gateway_rss_mb": memory.get("gateway", {}).get("VmRSS"),
            "state_log_bytes": disk["state_log_bytes"],
            "copies_bytes": sum(disk["copies_bytes"].values()),
        }
        self.timeline.append(row)
        state_mb, copies_mb = row["state_log_bytes"] / 1e6, row["copies_bytes"] / 1e6
        log(
            f"{p.phase}: {p.done}/{p.total} ({row['rate']}/s) monitor {row['monitor_rss_mb']} "
            f"MB, gateway {row['gateway_rss_mb']} MB, state log {state_mb:.1f} MB, "
            f"copies {copies_mb:.1f} MB"
        )


OPENED = re.compile(
    r"^(\S+ \S+) .*monitor \S+ state log (\S+): (\d+) state records \((\d+) bytes of log\)"
)
COMPACTED = re.compile(
    r"^(\S+ \S+) .*state log (\S+): compacted: (\d+) keys, (\d+) live bytes from offset (\d+), "
    r"(\d+) segments deleted"
)


@dataclass
class Bench:
    args: argparse.Namespace
    cluster: Cluster
    progress: Progress = field(default_factory=Progress)
    results: dict[str, Any] = field(default_factory=dict)
    client: TopicClient | None = None
    failed: bool = False  # the data directory is kept to look into

    def new_client(self) -> TopicClient:
        queues = tuple(f"http-{n}" for n in range(self.args.queues))

        def queue_of(topic: str) -> str:  # as the gateway's Gateway.queue_of
            return queues[zlib.crc32(topic.encode()) % len(queues)]

        return TopicClient(queues, queue_of, (self.cluster.gcm, None, NAMESPACE))

    def snapshot(self, name: str) -> dict[str, Any]:
        """The processes' memory and the state log's bytes now, kept under `name`."""
        taken = {
            "at": time.monotonic(),
            "memory": self.cluster.memory(),
            **self.cluster.disk(),
        }
        self.results.setdefault("snapshots", {})[name] = taken
        mon = taken["memory"].get("monitor", {})
        log(f"[{name}] monitor {mon}, gateway {taken['memory'].get('gateway')}, state log "
            f"{taken['state_log_bytes']} B, copies {taken['copies_bytes']}")  # fmt: skip
        self.collect_log()
        return taken

    def collect_log(self) -> None:
        for line in self.cluster.new_log_lines():
            opened = OPENED.match(line)
            if opened:
                at, name, records, size = opened.groups()
                event = {"at": at, "log": name, "records": int(records), "bytes": int(size)}
                self.results.setdefault("state_log_opened", []).append(event)
                log(f"monitor opened its state log: {event}")
            match = COMPACTED.match(line)
            if match:
                at, name, keys, live, offset, dropped = match.groups()
                event = {
                    "at": at,
                    "log": name,
                    "keys": int(keys),
                    "live_bytes": int(live),
                    "from_offset": int(offset),
                    "segments_deleted": int(dropped),
                    "phase": self.progress.phase,
                    "disk_after": self.cluster.disk(),
                }
                self.results.setdefault("compactions", []).append(event)
                log(f"compaction: {event}")
            elif "Traceback" in line or " ERROR " in line or " CRITICAL " in line:
                self.results.setdefault("errors_logged", []).append(line)
                log(f"logged: {line}")

    def phase(self, name: str, count: int, work: Callable[[int], None]) -> float:
        self.progress.begin(name, count)
        seconds = in_threads(self.args.threads, count, work, self.progress)
        rate = round(count / seconds) if seconds else 0
        self.results.setdefault("phases", {})[name] = {
            "count": count, "seconds": round(seconds, 1), "per_s": rate}  # fmt: skip
        log(f"{name}: {count} in {seconds:.1f} s ({rate}/s)")
        self.collect_log()
        return seconds

    # --- the phases ----------------------------------------------------------------------------
    def register(self) -> None:
        client, limit = self.client, self.args.topics
        assert client is not None

        def one(i: int) -> None:
            try:
                retried(lambda: client.register(topic_name(i), owner_name(i), limit))
            except TopicRefused as refused:  # a retry of one that had passed
                if "is taken" not in str(refused):
                    raise

        self.phase("register", self.args.topics, one)

    def subscribe(self) -> None:
        client, limit = self.client, self.args.max_subscribers
        assert client is not None

        def one(i: int) -> None:
            retried(lambda: client.subscribe(topic_name(i), subscriber_name(i), limit))

        self.phase("subscribe", self.args.topics, one)

    def fan_out(self) -> None:
        client, a = self.client, self.args
        assert client is not None

        def one(i: int) -> None:
            topic = topic_name(i % a.fan_topics)
            retried(lambda: client.subscribe(topic, f"fan-{i:06d}", a.max_subscribers))

        self.phase("fan_out", a.fan_topics * a.fan_subscribers, one)

    def bounds(self) -> None:
        """One topic past maxTopics, one subscriber past maxSubscribers (on the fanned topic
        once it holds maxSubscribers, else a refusal is not expected)."""
        client, a = self.client, self.args
        assert client is not None
        found: dict[str, Any] = {"count": client.count()}
        try:
            client.register("topic-one-too-many", "owner-0000", a.topics)
            found["topic_past_maxTopics"] = "accepted"
        except TopicRefused as refused:
            found["topic_past_maxTopics"] = f"refused: {refused}"
        extra = {"owner": "owner-0000", "topic": "topic-one-too-many-http"}
        status, body = http_call(self.cluster, "/v1/topic/register", extra)
        found["topic_past_maxTopics_http"] = {"status": status, "body": body}
        self.results["bounds"] = found
        log(f"bounds: {found}")

    def subscriber_bound(self) -> None:
        client, a = self.client, self.args
        assert client is not None
        try:
            client.subscribe(topic_name(0), "fan-one-too-many", a.max_subscribers)
            outcome = "accepted"
        except TopicRefused as refused:
            outcome = f"refused: {refused}"
        self.results["bounds"]["subscriber_past_maxSubscribers"] = outcome
        log(f"bounds: a subscriber past maxSubscribers on {topic_name(0)}: {outcome}")

    def http_sample(self) -> None:
        """One message published, got and acked through HTTP on each of the first N topics."""
        cluster, n = self.cluster, self.args.http_sample
        failures: list[str] = []

        def one(i: int) -> None:
            topic = topic_name(i)
            sub = {"subscriber": subscriber_name(i), "topic": topic}
            steps: list[tuple[str, dict[str, Any]]] = [
                ("/v1/message/publish", {"owner": owner_name(i), "topic": topic, "msg": "m"}),
                ("/v1/message/get", sub),
                ("/v1/message/ack", {**sub, "msgIdx": 1}),
            ]
            for path, body in steps:
                status, answer = http_call(cluster, path, body)
                if status != 200 and len(failures) < 10:
                    failures.append(f"{path} {topic}: {status} {answer}")

        self.phase("http_sample", n, one)
        self.results["phases"]["http_sample"]["failures"] = failures

    def churn_until_compacted(self) -> None:
        """Subscribe the one-per-topic subscribers again, round after round, until the monitor
        compacted its state log during this phase (or --churn-rounds rounds)."""
        client, a = self.client, self.args
        assert client is not None
        before = len(self.results.get("compactions", []))
        for round_ in range(1, a.churn_rounds + 1):

            def one(i: int) -> None:
                retried(lambda: client.subscribe(topic_name(i), subscriber_name(i),
                                                 a.max_subscribers))  # fmt: skip

            self.phase(f"churn_{round_}", a.topics, one)
            time.sleep(3)  # the monitor compacts on its tick
            self.collect_log()
            if len(self.results.get("compactions", [])) > before:
                break

    def probe_store(self) -> bool:
        """A topic's position through a new store client (as a gateway's new link asks)."""
        last = self.args.topics - 1
        client = self.new_client()
        try:
            client.position(topic_name(last), subscriber_name(last))
            return True
        except CoordinationError:
            return False
        finally:
            client.close()

    def probe_http(self) -> bool:
        """A get through the gateway, answered (not 503, no connection refused)."""
        get = {"subscriber": subscriber_name(0), "topic": topic_name(0)}
        return http_status(self.cluster, "/v1/message/get", get) not in (0, 503)

    def watch(self, since: float, steady_s: float) -> dict[str, Any]:
        """Both probes, each in a thread, from `since` until each answered (within 2 s a call)
        for `steady_s` without a failure, or ANSWER_TIMEOUT_S passed: per probe, when it first
        answered, since when it answers steadily, and the outages between."""
        found: dict[str, Any] = {}

        def follow(name: str, probe: Callable[[], bool]) -> None:
            first = steady = None
            outages: list[list[float]] = []  # [from, to] after the first answer
            while time.monotonic() < since + ANSWER_TIMEOUT_S:
                asked = time.monotonic()
                ok = probe()
                now = time.monotonic()
                if ok and now - asked < 2.0:
                    first = now if first is None else first  # answered then
                    steady = now if steady is None else steady
                    if now - steady >= steady_s:
                        break
                else:
                    if first is not None and steady is not None:  # an outage begins
                        outages.append([round(asked - since, 2), 0.0])
                    if outages:
                        outages[-1][1] = round(now - since, 2)
                    steady = None
                time.sleep(0.1)
            found[name] = {
                "first_answer_s": None if first is None else round(first - since, 2),
                "steady_from_s": None if steady is None else round(steady - since, 2),
                "outages_s": outages,
            }

        threads = [
            threading.Thread(target=follow, args=("store", self.probe_store), daemon=True),
            threading.Thread(target=follow, args=("http", self.probe_http), daemon=True),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if any(f["steady_from_s"] is None for f in found.values()):
            self.failed = True
        return found

    def kill_monitor(self, name: str) -> None:
        """kill -9 of the monitor of http-0: its host starts it again in place (same epoch), on
        its own state log."""
        old = self.cluster.pids()["monitor"]
        log(f"kill -9 monitor {old}")
        killed, killed_utc = time.monotonic(), stamp()
        os.kill(old, signal.SIGKILL)
        if self.client is not None:
            self.client.close()  # its links point at the dead monitor's sockets
            self.client = None
        new_pid_after = None
        while time.monotonic() < killed + ANSWER_TIMEOUT_S:
            pid = self.cluster.pids().get("monitor")
            if pid is not None and pid != old:
                new_pid_after = round(time.monotonic() - killed, 2)
                break
            time.sleep(0.05)
        answering = self.watch(killed, 10)
        self.results[name] = {
            "killed_utc": killed_utc,
            "new_monitor_process_after_s": new_pid_after,
            "answering": answering,
        }
        log(f"{name}: {self.results[name]}")
        self.snapshot(f"after_{name}")
        self.client = self.new_client()

    def offline_open(self, name: str) -> None:
        """The monitor's state log, copied aside and opened (replayed) by a process of its own:
        the replay's time and the memory of its image, then its compaction's time (the monitor's
        loop runs it, answering nothing meanwhile), without the rest of a monitor."""
        state = self.cluster.state_dir
        epochs = sorted(
            (d for d in state.glob("state.*") if d.name.split(".")[1].isdigit()),
            key=lambda d: int(d.name.split(".")[1]),
        )
        copy = self.cluster.data / "offline" / epochs[-1].name
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(epochs[-1], copy)
        out = subprocess.run(
            [PYTHON, "-c", OFFLINE_OPEN, str(copy), epochs[-1].name],
            env=self.cluster.env(), cwd=REPO, capture_output=True, text=True, check=True,
            timeout=600,
        ).stdout  # fmt: skip
        self.results[name] = json.loads(out)
        log(f"{name}: {self.results[name]}")
        shutil.rmtree(copy.parent, ignore_errors=True)

    def restart_up(self, name: str) -> None:
        """`roq up` stopped (SIGTERM) and started again on its data directory."""
        log("stopping roq up")
        if self.client is not None:
            self.client.close()
            self.client = None
        stopping = time.monotonic()
        self.cluster.stop()
        stopped = round(time.monotonic() - stopping, 1)
        log("starting roq up again")
        started_utc = stamp()
        started = self.cluster.start(wait_gateway=False)
        up_after = round(time.monotonic() - started, 2)
        answering = self.watch(started, 30)
        self.results.setdefault("restart_up", {})[name] = {
            "started_utc": started_utc,
            "stop_s": stopped,
            "roq_is_up_after_s": up_after,
            "answering": answering,
        }
        log(f"roq up restart {name}: {self.results['restart_up'][name]}")
        self.snapshot(f"after_up_restart_{name}")

    def verify(self) -> None:
        client = self.new_client()
        try:
            count = client.count()
            checked = []
            for i in (0, self.args.topics // 2, self.args.topics - 1):
                nxt, _, head = client.position(topic_name(i), subscriber_name(i))
                checked.append({"topic": topic_name(i), "next": nxt, "head": head})
        except CoordinationError as error:
            self.results["verified"] = {"error": str(error)}
            log(f"not verified: {error}")
            return
        finally:
            client.close()
        self.results["verified"] = {"topics": count, "positions": checked}
        log(f"verified: {self.results['verified']}")


# Run by `offline_open` in a process of its own: argv[1] a copy of a state log, argv[2] its
# leader id. Opens it (the replay), then compacts it; prints the times, sizes and RSS.
OFFLINE_OPEN = """
import json, sys, time
from roq import limits
from roq.log import Retention
from roq.log.log import FlushPolicy, LogSettings
from roq.log.statelog import StateLog

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)

settings = LogSettings(retention=Retention(), memory_bytes=limits.state_memory_bytes,
                       max_file_size=limits.state_segment_bytes, flush=FlushPolicy("os"))
before = rss()
started = time.perf_counter()
state = StateLog.open(sys.argv[1], settings, sys.argv[2].encode()[:16].ljust(16, b"\\0"))
seconds = time.perf_counter() - started
opened = {"seconds": round(seconds, 2), "records": len(state),
          "bytes": state.end_offset - state.start_offset, "live_bytes": state.live_bytes,
          "rss_mb_before": before, "rss_mb_after": rss()}
started = time.perf_counter()
state.compact()  # as the monitor's loop does it, in the loop
opened.update(compact_seconds=round(time.perf_counter() - started, 2),
              bytes_after_compact=state.end_offset - state.start_offset,
              rss_mb_after_compact=rss())
print(json.dumps(opened))
state.close()
"""


def stamp() -> str:
    """Now, as the daemons' log lines write it (UTC on this machine)."""
    return datetime.now().strftime("%Y-%m-%d %H:%M:%S.%f")[:-3]


def git_commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
        check=False,
    ).stdout.strip()  # fmt: skip


def per_unit(results: dict[str, Any], a: argparse.Namespace) -> dict[str, Any]:
    """Bytes per topic and per subscriber: the RSS and state log growth of each phase."""
    snaps = results["snapshots"]

    def grew(role: str, before: str, after: str) -> float:
        return float(snaps[after]["memory"][role]["VmRSS"] - snaps[before]["memory"][role]["VmRSS"])

    out: dict[str, Any] = {}
    for role in ("monitor", "gateway"):
        out[f"{role}_rss_bytes_per_topic"] = round(
            grew(role, "baseline", "topics") * 2**20 / a.topics
        )
        out[f"{role}_rss_bytes_per_subscriber"] = round(
            grew(role, "topics", "subscribers") * 2**20 / a.topics
        )
        if "fanned" in snaps:
            fan = a.fan_topics * a.fan_subscribers
            out[f"{role}_rss_bytes_per_fan_subscriber"] = round(
                grew(role, "subscribers", "fanned") * 2**20 / fan
            )

    def written(before: str, after: str, phase: str) -> int:
        """Bytes the phase appended, less the snapshots its compactions appended."""
        end = snaps[after]["state_log_end_offset"] - snaps[before]["state_log_end_offset"]
        snapshots = sum(
            c["live_bytes"] for c in results.get("compactions", []) if c["phase"] == phase
        )
        return int(end - snapshots)

    out["state_log_bytes_written_per_topic"] = round(
        written("baseline", "topics", "register") / a.topics
    )
    out["state_log_bytes_written_per_subscriber"] = round(
        written("topics", "subscribers", "subscribe") / a.topics
    )
    for name in ("offline_open_subscribers", "offline_open_churned"):
        opened = results.get(name)
        if opened:
            keys = opened["records"]
            out[f"{name}_live_bytes_per_key"] = round(opened["live_bytes"] / keys)
            grown = opened["rss_mb_after"] - opened["rss_mb_before"]
            out[f"{name}_rss_bytes_per_key"] = round(grown * 2**20 / keys)
            out[f"{name}_replay_us_per_key"] = round(opened["seconds"] * 1e6 / keys, 1)
            if "compact_seconds" in opened:
                out[f"{name}_compact_us_per_key"] = round(opened["compact_seconds"] * 1e6 / keys, 1)
    return out


def parse() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--topics", type=int, default=100_000, help="and maxTopics")
    parser.add_argument("--max-subscribers", type=int, default=10_000, help="maxSubscribers")
    parser.add_argument("--fan-topics", type=int, default=10)
    parser.add_argument(
        "--fan-subscribers", type=int, default=9_999,
        help="per fanned topic, beside its one: maxSubscribers - 1 fills it",
    )  # fmt: skip
    parser.add_argument("--http-sample", type=int, default=2_000)
    parser.add_argument("--churn-rounds", type=int, default=4)
    parser.add_argument("--threads", type=int, default=16)
    parser.add_argument("--queues", type=int, default=1, help="http.queues")
    parser.add_argument(
        "--base", type=int, default=61_000,
        help="first port (uses base..base+1200): above Linux's ephemeral ports (32768-60999), "
        "which other programs' connections may hold for a while",
    )  # fmt: skip
    parser.add_argument("--data", type=Path, default=Path("/tmp/roq-topics-memory"))
    parser.add_argument(
        "--out", type=Path, default=REPO / "benchmarks/results/http_topics_memory.json"
    )
    parser.add_argument("--sample-every", type=float, default=5.0)
    parser.add_argument("--up-restarts", type=int, default=3, help="roq up restarts at the end")
    parser.add_argument("--keep", action="store_true", help="keep the data directory")
    return parser.parse_args()


def run(bench: Bench) -> None:
    a, cluster, results = bench.args, bench.cluster, bench.results
    cluster.start()
    time.sleep(5)  # the second exchange and the copies settle
    results["pids"] = cluster.pids()
    bench.snapshot("baseline")
    results["monitor_idle_cpu_pct"] = {"baseline": cluster.idle_cpu("monitor", 10)}
    bench.client = bench.new_client()
    bench.register()
    bench.snapshot("topics")
    bench.subscribe()
    bench.snapshot("subscribers")
    results["monitor_idle_cpu_pct"]["subscribers"] = cluster.idle_cpu("monitor", 10)
    bench.bounds()
    bench.kill_monitor("restart_monitor_subscribers")
    bench.offline_open("offline_open_subscribers")
    if a.fan_topics and a.fan_subscribers:
        bench.fan_out()
        bench.snapshot("fanned")
        bench.subscriber_bound()
    if a.http_sample:
        bench.http_sample()
        bench.snapshot("http_sample")
    bench.churn_until_compacted()
    time.sleep(5)
    bench.snapshot("churned")
    results["monitor_idle_cpu_pct"]["churned"] = cluster.idle_cpu("monitor", 10)
    bench.kill_monitor("restart_monitor_churned")
    bench.offline_open("offline_open_churned")
    results["per_unit"] = per_unit(results, a)
    for n in range(1, a.up_restarts + 1):
        bench.restart_up(str(n))
        bench.verify()


def main() -> None:
    a = parse()
    if a.data.exists():
        raise SystemExit(f"{a.data} exists: remove it or name another --data")
    cluster = Cluster(a.data, a.base, a.topics, a.queues)
    # this process's store clients act with the cluster's admin credentials (`roq up` writes them)
    os.environ["ROQ_HOME"] = str(cluster.home)
    os.environ.pop("ROQ_CREDENTIALS", None)
    os.environ.pop("ROQ_SECURITY", None)
    bench = Bench(a, cluster)
    results = bench.results
    results.update({
        "command": " ".join(["benchmarks/http_topics_memory.py", *sys.argv[1:]]),
        "started_utc": datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S"),
        "commit": git_commit(),
        "args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(a).items()},
        "roq_up": " ".join(cluster.command()),
        "loadavg_start": Path("/proc/loadavg").read_text().split()[:3],
    })  # fmt: skip
    sampler = Sampler(cluster, bench.progress, a.sample_every)
    try:
        sampler.start()
        run(bench)
    finally:
        sampler.stop.set()
        if bench.client is not None:
            bench.client.close()
        cluster.stop()
        results["loadavg_end"] = Path("/proc/loadavg").read_text().split()[:3]
        results["finished_utc"] = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S")
        results["timeline"] = sampler.timeline
        for snap in results.get("snapshots", {}).values():
            snap.pop("at", None)
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(results, indent=1) + "\n")
        log(f"results in {a.out}")
        if a.keep or bench.failed or sys.exc_info()[0] is not None:
            log(f"kept {a.data} (its up.log)")
        else:
            shutil.rmtree(a.data, ignore_errors=True)
    print(json.dumps({k: v for k, v in results.items() if k != "timeline"}, indent=1))


if __name__ == "__main__":
    main()
