"""Fuzz every socket of every daemon with valid-looking hostile input (issue 16).

One cluster for the module (GCM, host, and the host's monitor and exchange of queue q1); each
test sends a fixed, derandomized budget of generated cases to one socket, then checks that every
process is alive with its PID and that a publish and replay of 1,000 messages is exact. The
budget (`ROQ_FUZZ_EXAMPLES`, default 120 per socket) keeps the directory under 3 minutes with
`-n 2`; `benchmarks/fuzz_soak.py` runs the same targets for minutes with random seeds.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import generators as gen
import pytest
from harness import Processes, Target, publish_and_replay, run_cases

from roq.local.zkserver import ZooKeeperServer  # noqa: F401  (the session fixture starts it)
from roq.protocol.endpoints import port_plus
from roq.testing.cluster import LocalCluster, PortBlocks
from roq.transport import Kind, new_context

pytestmark = pytest.mark.integration

EXAMPLES = int(os.environ.get("ROQ_FUZZ_EXAMPLES", "120"))
QUEUE = "q1"


class Fuzzed:
    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster
        with cluster.admin() as admin:
            status = admin.status()
        [queue] = [q for q in status.queues if q.info.name == QUEUE]
        [exchange] = queue.exchanges
        [host] = status.hosts
        monitor, stat = queue.info.monitor_host, queue.info.stat_monitor_host
        front, gcm = exchange.front, f"tcp://{cluster.gcm}"
        self.front = front
        self.targets = {
            "gcm P+0": Target("gcm topology P+0", gcm, Kind.REQ, gen.gcm_admin(), True),
            "gcm P+3": Target("gcm admin P+3", port_plus(gcm, 3), Kind.REQ, gen.gcm_admin(), True),
            "host": Target("host hcm.port", host.hcm, Kind.REQ, gen.host_requests(), True),
            "monitor B+0": Target("monitor reports B+0", monitor, Kind.PUB,
                                  gen.exchange_reports([front])),
            "monitor B+1": Target("monitor placement B+1", port_plus(monitor, 1), Kind.REQ,
                                  gen.placement(), True),
            "monitor B+4": Target("monitor rules B+4", port_plus(monitor, 4), Kind.PUSH,
                                  gen.rules()),
            "monitor B+5": Target("monitor control B+5", port_plus(monitor, 5), Kind.REQ,
                                  gen.child_control(), True),
            "stat S+0": Target("stat monitor S+0", port_plus(stat, -1), Kind.PUB,
                               gen.statistics()),
            "exchange F": Target("exchange front F", front, Kind.DEALER, gen.exchange_front()),
            "exchange F+1": Target("exchange subscriptions F+1", port_plus(front, 1), Kind.XSUB,
                                   gen.subscription_frames()),
            "exchange F+2": Target("exchange control F+2", port_plus(front, 2), Kind.REQ,
                                   gen.child_control(), True),
            "exchange F+3": Target("exchange log F+3", port_plus(front, 3), Kind.DEALER,
                                   gen.log_port()),
        }  # fmt: skip
        self.processes = Processes(cluster)


@pytest.fixture(scope="module")
def fuzzed(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: str, port_blocks: PortBlocks
) -> Iterator[Fuzzed]:
    cluster = LocalCluster(Path(tmp_path_factory.mktemp("fuzz")), zookeeper, port_blocks)
    try:
        cluster.start_gcm()
        cluster.start_host("h1")
        cluster.wait_ready()
        with cluster.admin() as admin:
            admin.create_queue(QUEUE)
        publish_and_replay(cluster, QUEUE, 10)  # the queue serves before the first case
        yield Fuzzed(cluster)
    finally:
        cluster.stop()


@pytest.mark.parametrize(
    "socket",
    ["gcm P+0", "gcm P+3", "host", "monitor B+0", "monitor B+1", "monitor B+4", "monitor B+5",
     "stat S+0", "exchange F", "exchange F+1", "exchange F+2", "exchange F+3"],
)  # fmt: skip
def test_hostile_input_kills_blocks_and_misleads_nothing(fuzzed: Fuzzed, socket: str) -> None:
    # The fuzzer plays one of the cluster's own processes: the insider whose frames reach
    # every socket's parser (a stranger's never pass the CURVE handshake: test_security.py)
    context = new_context()
    try:
        with fuzzed.cluster.as_cluster():
            run_cases(context, fuzzed.targets[socket], fuzzed.processes, EXAMPLES)
    finally:
        context.term()
    publish_and_replay(fuzzed.cluster, QUEUE)
    assert not fuzzed.processes.problem()
    with fuzzed.cluster.admin() as admin:  # the monitor still knows its one real exchange
        [queue] = [q for q in admin.status().queues if q.info.name == QUEUE]
    assert [x.front for x in queue.exchanges] == [fuzzed.front]
