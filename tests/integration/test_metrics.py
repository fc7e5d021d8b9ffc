"""A real Prometheus (the Debian package's, 2.42) scrapes a `roq up` cluster under load with the
configuration `roq metrics scrape-config` wrote, and its HTTP API answers per-queue message rates
and a consumer group's lag; the Grafana dashboard's metrics are among those it scraped; `roq
health` and `/readyz` say ready, and not ready while the cluster's ZooKeeper is stopped."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from roq.client.consumer import Consumer
from roq.client.publisher import Publisher
from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import LocalCluster, PortBlocks, processes_with, wait_for

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = "/usr/bin/prometheus"
# In the dashboard, but no series in a one-host cluster without a scaling decision
# (tests/unit/test_metrics_unit.py checks that they are declared)
CONDITIONAL = {"roq_exchange_replication_lag_bytes", "roq_monitor_scaling_decisions_total"}


@dataclass
class Up:
    process: subprocess.Popen[bytes]
    base: int
    data: Path
    log: Path
    helper: LocalCluster

    @property
    def gcm(self) -> str:
        return f"127.0.0.1:{self.base}"

    @property
    def zk(self) -> str:
        return f"127.0.0.1:{self.base + 90}"

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")[-4000:]

    def cli(self, *args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
        return self.helper.cli(*args, timeout_s=timeout_s)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory, port_blocks: PortBlocks) -> Iterator[Up]:
    """`roq up --port-base`, its own ZooKeeper, its gateway; q1 created."""
    tmp = tmp_path_factory.mktemp("metrics")
    base = port_blocks.take(1200)  # the layout spans base .. base + 1000 + the exchanges'
    helper = LocalCluster(tmp, "", port_blocks)  # its keys and CLI; it starts nothing
    args = ["up", "--data-dir", str(tmp / "data"), "--port-base", str(base),
            "-D", f"security.dir={helper.security_dir}", "-D", "ports.max.perkind=10"]  # fmt: skip
    log = tmp / "up.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            roq_command(*args), env=child_environment(), stdin=subprocess.DEVNULL,
            stdout=out, stderr=subprocess.STDOUT, start_new_session=True, cwd=tmp,
        )  # fmt: skip
    cluster = Up(process, base, tmp / "data", log, helper)
    try:
        wait_for(lambda: "roq is up" in log.read_text() or process.poll() is not None, 90, "up")
        assert process.poll() is None, cluster.log_text()
        made = cluster.cli("queue", "create", "q1", "--gcm", cluster.gcm)
        assert made.returncode == 0, made.stderr + cluster.log_text()
        yield cluster
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=10)
        for pid in processes_with(str(tmp / "data")):
            os.kill(pid, signal.SIGKILL)


@dataclass
class Prometheus:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def query(self, expr: str) -> list[dict[str, object]]:
        answer = httpx.get(f"{self.url}/api/v1/query", params={"query": expr}, timeout=5)
        body = answer.json()
        assert body["status"] == "success", body
        return list(body["data"]["result"])

    def value(self, expr: str) -> float:
        """The expression's one value, 0 while it has none."""
        found = self.query(expr)
        return float(found[0]["value"][1]) if found else 0.0  # type: ignore[index]

    def names(self) -> set[str]:
        answer = httpx.get(f"{self.url}/api/v1/label/__name__/values", timeout=5)
        return set(answer.json()["data"])

    def targets_up(self) -> dict[str, str]:
        answer = httpx.get(f"{self.url}/api/v1/targets", timeout=5).json()
        return {t["scrapeUrl"]: t["health"] for t in answer["data"]["activeTargets"]}


@pytest.fixture
def prometheus(up: Up, tmp_path: Path, port_blocks: PortBlocks) -> Iterator[Prometheus]:
    """Prometheus with the configuration `roq metrics scrape-config` wrote (every second),
    the gateway's job with a token file."""
    if not os.access(PROMETHEUS, os.X_OK):
        pytest.fail(f"{PROMETHEUS} is missing: make system-deps installs the prometheus package")
    token = tmp_path / "token"
    token.write_text(up.helper.token)
    config = tmp_path / "prometheus.yml"

    def written() -> bool:  # the gateway registers once it has opened its queue
        done = up.cli("metrics", "scrape-config", "--zk", up.zk, "--interval", "1",
                      "--token-file", str(token), "--out", str(config))  # fmt: skip
        assert done.returncode == 0, done.stderr
        return "roq-http" in config.read_text() and "left out" not in config.read_text()

    wait_for(written, 60, "the gateway's listener registered")
    port = port_blocks.take(1)
    log = tmp_path / "prometheus.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=1h"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
        )  # fmt: skip
    server = Prometheus(f"http://127.0.0.1:{port}", process, log)
    try:
        wait_for(lambda: httpx.get(f"{server.url}/-/ready", timeout=2).status_code == 200, 60,
                 "prometheus ready")  # fmt: skip
        yield server
    finally:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
        shutil.rmtree(tmp_path / "tsdb", ignore_errors=True)


def _publish(gcm: str, stop: threading.Event, sent: list[int]) -> None:
    """Load: batches of 50 messages on q1 until `stop`, each flushed (acks leader)."""
    with Publisher("q1", gcm=gcm, acks="leader") as publisher:
        while not stop.is_set():
            for n in range(50):
                publisher.send(f"m{sent[0] + n}".encode())
            publisher.flush(timeout_s=10)
            sent[0] += 50
            stop.wait(0.05)


@pytest.mark.timeout(300)
def test_prometheus_scrapes_per_queue_rates_and_consumer_lag(up: Up, prometheus: Prometheus):
    stop, sent = threading.Event(), [0]
    errors: list[BaseException] = []

    def load() -> None:
        try:
            _publish(up.gcm, stop, sent)
        except BaseException as error:  # the assertion below names it
            errors.append(error)

    loader = threading.Thread(target=load, name="load", daemon=True)
    loader.start()
    try:
        # a consumer group that takes some messages and settles only part of them: lag
        with Consumer("q1", "g1", gcm=up.gcm) as consumer:
            taken = []
            for delivery in consumer.deliveries(timeout_s=30):
                taken.append(delivery)
                if len(taken) >= 20:
                    break
            for delivery in taken[:5]:
                delivery.ack()
            consumer.flush()
            _assert_queried(up, prometheus, errors)
    finally:
        stop.set()
        loader.join(30)
    assert not errors, errors


def _assert_queried(up: Up, prometheus: Prometheus, errors: list[BaseException]) -> None:
    # first what the consumer's lease (work.lease.ms, 30 s without a request) holds
    in_flight = 'roq_group_in_flight_messages{queue="q1",group="g1"}'
    wait_for(lambda: prometheus.value(in_flight) > 0, 25,
             f"g1's messages in flight\n{prometheus.targets_up()}")  # fmt: skip
    lag = 'roq_group_lag_messages{queue="q1",group="g1"}'
    wait_for(lambda: prometheus.value(lag) > 0, 60, "g1's lag")
    assert prometheus.value('roq_group_acked_total{queue="q1",group="g1"}') >= 5
    rate = 'sum(rate(roq_exchange_messages_in_total{queue="q1"}[5s]))'
    wait_for(lambda: not errors and prometheus.value(rate) > 0, 60,
             f"a message rate for q1\n{prometheus.targets_up()}\n{errors}")  # fmt: skip
    print(f"q1: {prometheus.value(rate):.0f} msg/s in, g1 lag {prometheus.value(lag):.0f}")
    assert prometheus.value('sum(rate(roq_exchange_bytes_in_total{queue="q1"}[5s]))') > 0
    assert prometheus.value("max(roq_gcm_leader)") == 1
    assert prometheus.value('sum(roq_host_children{state="running"})') >= 2
    health = prometheus.targets_up()
    assert len(health) == 3 and set(health.values()) == {"up"}, health
    # the gateway's request series appear once it has answered a request (the scrapes of its
    # /metrics are not counted): one it refuses, 404
    gateway = f"http://127.0.0.1:{up.base + 80}"
    auth = {"Authorization": f"Bearer {up.helper.token}"}
    assert httpx.get(f"{gateway}/v1/nothing", headers=auth, timeout=5).status_code == 404
    _assert_dashboard_names_scraped(prometheus)
    checked = up.cli("health", "--zk", up.zk)
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert checked.stdout.count(" ok ") == 3, checked.stdout


def dashboard_metrics() -> set[str]:
    """The metric names config/grafana/roq.json's expressions (panels, variables) name."""
    doc = json.loads((ROOT / "config" / "grafana" / "roq.json").read_text())
    exprs = [t["expr"] for panel in doc["panels"] for t in panel["targets"]]
    exprs += [v["definition"] for v in doc["templating"]["list"] if v["type"] == "query"]
    return {name for expr in exprs for name in re.findall(r"\broq_\w+", expr)}


def _assert_dashboard_names_scraped(prometheus: Prometheus) -> None:
    wait_for(lambda: "roq_http_requests_total" in prometheus.names(), 30, "the gateway's series")
    missing = dashboard_metrics() - prometheus.names() - CONDITIONAL
    assert missing == set(), f"the dashboard names metrics no target exposes: {missing}"


@pytest.mark.timeout(300)
def test_readyz_fails_while_zookeeper_is_stopped(up: Up):
    urls = {role: f"http://127.0.0.1:{up.base + offset}"
            for role, offset in (("gcm", 70), ("host", 110))}  # fmt: skip
    for url in urls.values():
        assert httpx.get(f"{url}/readyz", timeout=5).status_code == 200
    zookeeper = [p for p in processes_with(str(up.data / "zookeeper")) if _is_java(p)]
    assert len(zookeeper) == 1, zookeeper
    os.kill(zookeeper[0], signal.SIGSTOP)
    try:
        for role, url in urls.items():
            wait_for(lambda u=url: httpx.get(f"{u}/readyz", timeout=5).status_code == 503, 30,
                     f"the {role}'s /readyz failing")  # fmt: skip
            answer = httpx.get(f"{url}/readyz", timeout=5)
            assert "ZooKeeper session not connected" in answer.text, answer.text
            assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200  # alive
        checked = up.cli("health", *(arg for u in urls.values() for arg in ("--url", u)))
        assert checked.returncode == 69, checked.stdout + checked.stderr
        assert "ZooKeeper session not connected" in checked.stdout
    finally:
        os.kill(zookeeper[0], signal.SIGCONT)
    for role, url in urls.items():
        wait_for(lambda u=url: httpx.get(f"{u}/readyz", timeout=5).status_code == 200, 90,
                 f"the {role} ready again\n{up.log_text()}")  # fmt: skip


def _is_java(pid: int) -> bool:
    try:
        return b"QuorumPeerMain" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
