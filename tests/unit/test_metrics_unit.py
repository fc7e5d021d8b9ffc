"""The metric catalogue, its exposition, the metrics and health listener, the scrape
configuration, the Grafana dashboard and the metrics table of docs/operations.md."""

from __future__ import annotations

import json
import re
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

import bson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from roq import config, limits
from roq.cli.metrics import scrape_yaml
from roq.coordination.targets import Target
from roq.errors import DecodeError
from roq.http.index import TopicIndex
from roq.http.metrics import Metrics
from roq.local.up import metrics_ports, port_keys
from roq.metrics import Health, Listener, bound_queues, render
from roq.protocol.metrics import (
    BY_NAME,
    CATALOGUE,
    COUNTER,
    GAUGE,
    MetricsReply,
    Sample,
    sample,
)

ROOT = Path(__file__).resolve().parents[2]
LABELS = {"queue", "exchange", "host", "group", "role", "state", "decision", "replica"}
# In the dashboard but in no cluster of one host without a scaling decision: the Prometheus test
# (tests/integration/test_metrics.py) cannot see them scraped.
CONDITIONAL = {
    "roq_exchange_replication_lag_bytes": "a replica: a second host",
    "roq_monitor_scaling_decisions_total": "a scaling decision",
}


# --- the catalogue --------------------------------------------------------------------------
@pytest.mark.parametrize("metric", CATALOGUE, ids=lambda m: m.name)
def test_every_metric_follows_prometheus_naming(metric):
    assert re.fullmatch(r"roq_[a-z0-9_]+", metric.name)
    assert metric.kind in (COUNTER, GAUGE)
    assert metric.name.endswith("_total") == (metric.kind == COUNTER), "counters end _total"
    assert set(metric.labels) <= LABELS, "a label outside the bounded set"
    assert metric.help.endswith(".") or metric.help.endswith(")")


def test_names_are_unique():
    assert len(BY_NAME) == len(CATALOGUE)


# --- samples on the wire --------------------------------------------------------------------
def test_a_reply_goes_through_bson_and_back():
    samples = (sample("roq_exchange_messages_in_total", 12, "q1", "x1"),
               sample("roq_group_lag_messages", 3, "q1", "g"))  # fmt: skip
    doc = bson.decode(bson.encode(MetricsReply("exchange q1/x1", samples).encode()))
    back, refused = MetricsReply.decode(doc)
    assert back.samples == samples and back.name == "exchange q1/x1" and refused == 0


@pytest.mark.parametrize(
    "entry",
    [
        ["roq_nope_total", [], 1.0],  # unknown name
        ["roq_group_lag_messages", ["q1"], 1.0],  # a label missing
        ["roq_group_lag_messages", ["q1", 7], 1.0],  # a label not a string
        ["roq_group_lag_messages", ["q1", "x" * 500], 1.0],  # past metrics_label_chars_max
        ["roq_group_lag_messages", ["q1", "g"], float("nan")],
        ["roq_group_lag_messages", ["q1", "g"], True],
        ["roq_group_lag_messages", ["q1", "g"]],
        "not a list",
    ],
)
def test_a_bad_sample_is_refused_not_fatal(entry):
    with pytest.raises(DecodeError):
        Sample.decode(entry)
    good = sample("roq_up", 1, "host").fields()
    reply, refused = MetricsReply.decode({"RESULT": 0, "NAME": "x", "SAMPLES": [entry, good]})
    assert refused == 1 and [s.name for s in reply.samples] == ["roq_up"]


def test_a_reply_holds_at_most_the_bound_of_samples():
    many = [sample("roq_up", n, "host") for n in range(limits.metrics_samples_max + 5)]
    assert len(MetricsReply("x", many).encode()["SAMPLES"]) == limits.metrics_samples_max


# --- exposition -----------------------------------------------------------------------------
def test_render_gives_prometheus_families_with_types_and_help():
    text = render([
        sample("roq_exchange_messages_in_total", 5, "q1", "x1"),
        sample("roq_exchange_messages_in_total", 7, "q2", "x2"),
        sample("roq_exchange_messages_in_total", 9, "q2", "x2"),  # the same series: first kept
        sample("roq_group_lag_messages", 3, "q1", "g"),
    ]).decode()  # fmt: skip
    assert "# TYPE roq_exchange_messages_in_total counter" in text
    assert 'roq_exchange_messages_in_total{exchange="x2",queue="q2"} 7.0' in text
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families["roq_exchange_messages_in"].type == "counter"
    assert families["roq_group_lag_messages"].type == "gauge"
    assert len(families["roq_exchange_messages_in"].samples) == 2


def test_series_past_the_queue_bound_are_dropped_and_counted():
    samples = [sample("roq_monitor_exchanges", 1, q) for q in ("c", "a", "b")]
    samples.append(sample("roq_up", 1, "host"))  # no queue label: always kept
    kept, dropped = bound_queues(samples, 2)
    assert sorted(s.labels[0] for s in kept) == ["a", "b", "host"] and dropped == 1


def test_the_gateways_counts_are_counters():
    metrics = Metrics(TopicIndex(10, 1 << 20), lambda: 3, lambda: 4)
    text = metrics.render().decode()
    assert "# TYPE roq_http_publishers_replaced_total counter" in text
    assert "roq_http_publishers_replaced_total 3.0" in text
    assert "roq_http_log_messages_read_total 4.0" in text
    assert "roq_http_publishers_replaced " not in text


# --- the listener ---------------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


@pytest.fixture
def served():
    problems: list[str] = []
    broken: list[bool] = []

    def collect() -> list[Sample]:
        if broken:
            raise ValueError("a collector failed")
        return [sample("roq_up", 1, "host")]

    health = Health(lambda: list(problems))
    listener = Listener("127.0.0.1", _free_port(), "host", collect, health)
    listener.start()
    yield listener, problems, broken
    listener.stop()


def test_the_listener_serves_metrics_and_health(served):
    listener, problems, broken = served
    status, text = _get(listener.url + "/metrics")
    assert status == 200 and 'roq_up{role="host"} 1.0' in text
    assert 'roq_series_dropped_total{role="host"} 0.0' in text
    assert _get(listener.url + "/healthz") == (200, "ok\n")
    assert _get(listener.url + "/readyz") == (200, "ready\n")
    problems += ["ZooKeeper session not connected", "exchange q1/x1: restarting"]
    assert _get(listener.url + "/readyz") == (503, "\n".join(problems) + "\n")
    assert _get(listener.url + "/nothing")[0] == 404
    broken.append(True)
    status, text = _get(listener.url + "/metrics")
    assert status == 500 and "a collector failed" in text
    assert _get(listener.url + "/healthz")[0] == 200  # it serves on


def test_a_stalled_main_loop_fails_healthz(served):
    listener, _, _ = served
    listener.health.turned = time.monotonic() - limits.health_loop_stall_s - 1
    status, text = _get(listener.url + "/healthz")
    assert status == 503 and "main loop has not turned" in text
    assert _get(listener.url + "/readyz")[0] == 503


def test_a_taken_port_is_port_in_use(served):
    from roq.errors import PortInUse

    listener, _, _ = served
    second = Listener("127.0.0.1", listener.port, "gcm", list, Health())
    with pytest.raises(PortInUse, match="metrics port"):
        second.start()


# --- `roq up`'s ports -----------------------------------------------------------------------
def _up_settings(gcm: dict[str, str], hcm: dict[str, str]) -> config.UpSettings:
    return config.UpSettings.from_settings(config.load_gcm(None, gcm), config.load_hcm(None, hcm))


def test_roq_up_serves_metrics_on_the_default_layout_and_follows_port_base():
    gcm: dict[str, str] = {}
    hcm: dict[str, str] = {}
    assert metrics_ports(_up_settings(gcm, hcm), gcm, hcm)
    assert gcm == {"metrics.port": "5070"} and hcm == {"hcm.metrics.port": "5110"}
    keys = port_keys(41000)
    assert keys["metrics.port"] == "41070" and keys["hcm.metrics.port"] == "41110"
    own = {"ports.base": "7000"}  # a layout of one's own: those ports may be another's
    assert not metrics_ports(_up_settings(own, {}), own, {})
    off = {"metrics.port": "0"}  # -D metrics.port=0: none
    assert not metrics_ports(_up_settings(off, {"hcm.metrics.port": "0"}), off,
                             {"hcm.metrics.port": "0"})  # fmt: skip


# --- `roq metrics scrape-config` ------------------------------------------------------------
TARGETS = [
    Target("gcm", "gcm-a", "127.0.0.1:5070"),
    Target("host", "h1", "127.0.0.1:5110"),
    Target("http", "127.0.0.1:8080", "127.0.0.1:8080", "https", token=True),
]


def test_scrape_config_has_a_job_per_role(tmp_path):
    text = scrape_yaml(TARGETS, 1, "/roq", tmp_path / "token")
    assert 'job_name: "roq-host"' in text and 'targets: ["127.0.0.1:5110"]' in text
    assert "scrape_interval: 1s" in text and "scheme: https" in text
    assert f'credentials_file: "{tmp_path / "token"}"' in text
    without = scrape_yaml(TARGETS, 15, "/roq", None)
    assert "roq-http left out" in without and "credentials_file" not in without


@pytest.mark.skipif(shutil.which("promtool") is None, reason="promtool: the prometheus package")
def test_prometheus_accepts_the_scrape_config(tmp_path):
    token = tmp_path / "token"
    token.write_text("t")
    path = tmp_path / "prometheus.yml"
    path.write_text(scrape_yaml(TARGETS, 1, "/roq", token))
    checked = subprocess.run(["promtool", "check", "config", str(path)], capture_output=True,
                             text=True, timeout=60, check=False)  # fmt: skip
    assert checked.returncode == 0, checked.stdout + checked.stderr


# --- the dashboard --------------------------------------------------------------------------
DASHBOARD = ROOT / "config" / "grafana" / "roq.json"


def dashboard_expressions() -> list[str]:
    """Every PromQL expression of config/grafana/roq.json: its panels' and its variables'."""
    doc = json.loads(DASHBOARD.read_text())
    found = [t["expr"] for panel in doc["panels"] for t in panel["targets"]]
    for variable in doc["templating"]["list"]:
        if variable["type"] == "query":
            found.append(variable["definition"])
    return found


def dashboard_metrics() -> set[str]:
    """The metric names (as scraped: a histogram's `_bucket`) its expressions name."""
    return {name for expr in dashboard_expressions() for name in re.findall(r"\broq_\w+", expr)}


def exposed_names() -> set[str]:
    """Every sample name the cluster's listeners and a gateway may expose."""
    names = set(BY_NAME) | {"roq_series_dropped_total"}
    metrics = Metrics(TopicIndex(10, 1 << 20), lambda: 0)
    metrics.observe("publish", 200, 0.001)
    for family in metrics.registry.collect():
        names |= {s.name for s in family.samples}
    return names


def test_the_dashboard_is_valid_and_names_only_exposed_metrics():
    doc = json.loads(DASHBOARD.read_text())
    assert doc["panels"] and all(panel["targets"] for panel in doc["panels"])
    assert len({panel["id"] for panel in doc["panels"]}) == len(doc["panels"])
    assert dashboard_metrics() - exposed_names() == set()
    assert set(CONDITIONAL) <= dashboard_metrics() & set(BY_NAME)
    for what in ("roq_exchange_messages_in_total", "roq_group_lag_messages"):
        assert what in dashboard_metrics()


# --- docs/operations.md ---------------------------------------------------------------------
def test_operations_md_documents_every_metric_as_declared():
    text = (ROOT / "docs" / "operations.md").read_text()
    section = text[text.index("## Metrics") : text.index("## Health")]
    rows = re.findall(r"^\| `(roq_\w+)` \| (\w+) \| ([^|]*) \|", section, re.M)
    documented = {
        name: (kind, tuple(re.findall(r"`(\w+)`", labels))) for name, kind, labels in rows
    }
    declared = {m.name: (m.kind, m.labels) for m in CATALOGUE}
    assert documented == declared


# --- a child's samples over its control socket (in process, on loopback) --------------------
def test_a_child_answers_metrics_on_its_control_socket_as_its_host_asks():
    import threading

    from roq.host.metrics import _ask
    from roq.protocol.metrics import MetricsRequest
    from roq.transport import new_context
    from roq.transport.control import ControlServer

    context = new_context()
    control = ControlServer(context, "127.0.0.1", _free_port(), "exchange q1/x1")
    control.metrics = lambda: [sample("roq_exchange_messages_in_total", 5, "q1", "x1")]
    stop = threading.Event()

    def serve() -> None:  # the child's main loop, as far as its control socket goes
        while not stop.is_set():
            if control.sock.poll(50):
                control.handle()

    loop = threading.Thread(target=serve, name="child-loop")
    loop.start()
    try:
        doc = _ask(context, control.endpoint, MetricsRequest().encode(), 2000)
        assert doc is not None
        reply, refused = MetricsReply.decode(doc)
        assert reply.samples == (sample("roq_exchange_messages_in_total", 5, "q1", "x1"),)
        assert refused == 0
    finally:
        stop.set()
        loop.join()
        control.close()
        context.term()
