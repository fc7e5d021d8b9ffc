"""The GCM against a real ZooKeeper: admin API robustness, leader election and fail-over."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import bson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roq.client.admin import AdminClient, AdminRefused
from roq.coordination import session
from roq.coordination.paths import Paths
from roq.coordination.registry import Registry
from roq.protocol import bsonmsg
from roq.protocol.commands import AdminCommand, Result
from roq.protocol.ports import GcmPort, MonitorPort, endpoint_at, sibling
from roq.testing.cluster import LocalCluster, PortBlocks, wait_for
from roq.transport import READABLE, Kind, Poller, bind, new_context, open_socket
from roq.transport.rpc import Requester
from roq.transport.security import reset as security_reset

pytestmark = pytest.mark.integration


def _leader_ready(cluster: LocalCluster, base: int) -> None:
    with AdminClient(gcm=f"127.0.0.1:{base}", timeout_ms=500, retries=1) as admin:
        wait_for(lambda: admin.list_queues() == [], 30, f"GCM on {base} leading")


@pytest.fixture
def gcm_only(cluster: LocalCluster) -> LocalCluster:
    cluster.start_gcm()
    _leader_ready(cluster, cluster.gcm_base)
    return cluster


UTF8 = st.characters(codec="utf-8", exclude_characters="\x00")  # what BSON strings can hold
FRAMES = st.one_of(
    st.binary(max_size=300),
    st.builds(
        lambda d: bson.encode(d)[: len(bson.encode(d)) // 2],
        st.dictionaries(
            st.text(UTF8, max_size=5),
            st.integers(-(2**63), 2**63 - 1),
            min_size=1,
            max_size=3,
        ),
    ),
    st.builds(
        bson.encode,
        st.dictionaries(
            st.sampled_from(["CMD", "QName", "Host", "x"]),
            st.one_of(st.integers(-3, 3000), st.text(UTF8, max_size=8), st.none(), st.booleans()),
            max_size=4,
        ),
    ),
)


def test_admin_api_answers_every_garbage_frame_and_keeps_serving(gcm_only: LocalCluster):
    context = new_context()
    requester = Requester(context, f"tcp://127.0.0.1:{gcm_only.gcm_base + 3}", timeout_ms=5000)

    @settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
    @given(frames=st.lists(FRAMES, min_size=1, max_size=3))
    def one(frames: list[bytes]) -> None:
        reply = bsonmsg.decode_reply(requester.request_raw(frames)[0])
        assert reply["RESULT"] in (Result.OK, Result.FAIL)
        if reply["RESULT"] == Result.FAIL:
            assert reply["COMMENT"]

    try:
        one()
        # Still serving, and still answering correctly.
        reply = requester.request({"CMD": int(AdminCommand.LIST_QUEUES)})
        assert reply["RESULT"] == Result.OK and reply["Queues"] == []
    finally:
        requester.close()
        context.term()


@pytest.mark.parametrize(
    ("frames", "fragment"),
    [
        ([b"\x00\x01garbage"], "not a BSON document"),
        ([bson.encode({"CMD": 2000, "QName": "q"})[:10]], "not a BSON document"),
        ([bson.encode({"x": 1})], "CMD field is missing"),
        ([bson.encode({"CMD": 4242})], "INVALID CMD Value 4242"),
        ([bson.encode({"CMD": 2003})], "QName field is not present"),
        ([bson.encode({"CMD": 2003, "QName": "bad name!", "Host": "h"})], "queue name"),
        ([bson.encode({"CMD": 2000}), bson.encode({"CMD": 2000})], "expected 1 frame"),
    ],
)
def test_malformed_requests_get_1101_with_the_reason(gcm_only: LocalCluster, frames, fragment):
    context = new_context()
    requester = Requester(context, f"tcp://127.0.0.1:{gcm_only.gcm_base + 3}", timeout_ms=5000)
    try:
        reply = bsonmsg.decode_reply(requester.request_raw(frames)[0])
    finally:
        requester.close()
        context.term()
    assert reply["RESULT"] == Result.FAIL
    assert fragment in reply["COMMENT"]


def test_unknown_queue_and_unknown_host_are_refused(gcm_only: LocalCluster):
    with gcm_only.admin() as admin:
        with pytest.raises(AdminRefused, match="not registered") as raised:
            admin.get_host_by_qname("nope")
        assert raised.value.reason == "unknown_queue"
        with pytest.raises(AdminRefused, match="host ghost is not registered"):
            admin.create_queue("q1", host="ghost")
        with pytest.raises(AdminRefused, match="no host is registered"):
            admin.create_queue("q1")
        assert admin.list_queues() == []


def test_standby_answers_lead_lost_then_takes_over_after_kill(cluster: LocalCluster):
    first = cluster.start_gcm()
    _leader_ready(cluster, cluster.gcm_base)
    second = cluster.start_gcm()
    second_base = int(second.name.split("-")[1])
    context = new_context()
    standby = Requester(context, endpoint_at("127.0.0.1", second_base, GcmPort.ADMIN), 5000)
    try:
        reply = wait_for(
            lambda: standby.request({"CMD": int(AdminCommand.LIST_QUEUES)}), 20, "standby answering"
        )
        assert reply["RESULT"] == Result.LEAD_LOST
        assert reply["LEADER"] == f"tcp://127.0.0.1:{cluster.gcm_base + 3}"
        # A client pointed at the standby follows it to the leader.
        with AdminClient(gcm=f"127.0.0.1:{second_base}") as admin:
            assert admin.list_queues() == []
        os.killpg(first.process.pid, signal.SIGKILL)
        first.process.wait(timeout=10)
        # Within the session timeout (4 s here) the standby leads.
        wait_for(
            lambda: standby.request({"CMD": int(AdminCommand.LIST_QUEUES)})["RESULT"] == Result.OK,
            15,
            "standby to take over",
        )
        with AdminClient(zk=cluster.zk, namespace=cluster.namespace) as admin:
            assert admin.list_queues() == []
    finally:
        standby.close()
        context.term()


def test_broadcast_has_three_bson_frames(gcm_only: LocalCluster):
    from roq.transport import Kind, connect, open_socket

    context = new_context()
    sock = open_socket(context, Kind.SUB, rcvtimeo_ms=5000)
    connect(sock, f"tcp://127.0.0.1:{gcm_only.gcm_base + 5}")
    try:
        frames = sock.recv_multipart()
    finally:
        sock.close(0)
        context.term()
    assert len(frames) == 3
    assert bson.decode(frames[0]) == {"CMD": 1500, "CMD_ID": 1500}
    assert bson.decode(frames[1]) == {"Queues": []}
    assert bson.decode(frames[2]) == {"hosts": [], "Hosts": []}


def test_a_client_written_from_the_wiki_reads_the_broadcast(
    tmp_path: Path, zookeeper: str, port_blocks: PortBlocks, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Seed 000, "The Broadcasted information": subscribe to tcp://[GCM]:5005 (ports.base+5),
    three parts, CMD_ID 1500, {"Queues": [{Name, Host, State}]}, {"hosts": [address]}. Written
    with pyzmq and bson alone, as such a client would be: RoQ had no CurveZMQ, so the cluster
    runs with security off (LocalCluster(secure=False), as test_http's security-off test)."""
    for name in ("ROQ_SECURITY", "ROQ_CREDENTIALS"):
        monkeypatch.setenv(name, os.environ.get(name, ""))
    cluster = LocalCluster(tmp_path, zookeeper, port_blocks, secure=False)
    try:
        _read_broadcast_as_the_wiki_says(cluster)
    finally:
        cluster.stop()
        security_reset()


def _read_broadcast_as_the_wiki_says(cluster: LocalCluster) -> None:
    import zmq

    cluster.start_with_queue()
    context = zmq.Context()
    sock = context.socket(zmq.SUB)
    sock.setsockopt(zmq.SUBSCRIBE, b"")
    sock.setsockopt(zmq.RCVTIMEO, 2000)
    sock.setsockopt(zmq.LINGER, 0)
    sock.connect(f"tcp://127.0.0.1:{cluster.gcm_base + 5}")
    seen: list[tuple[int, list[dict[str, object]], list[str]]] = []

    def one_with_the_queue() -> bool:
        header, queues, hosts = (bson.decode(part) for part in sock.recv_multipart())
        seen.append((header["CMD_ID"], queues["Queues"], hosts["hosts"]))
        return any(q["Name"] == "q1" and q["State"] is True for q in queues["Queues"])

    try:
        wait_for(one_with_the_queue, 30, "q1 running in the broadcast", interval_s=0)
    finally:
        sock.close()
        context.term()
    command, queues, hosts = seen[-1]
    assert command == 1500
    assert [(q["Name"], q["Host"]) for q in queues] == [("q1", "h1")]
    assert hosts == ["127.0.0.1"]


LIST = {"CMD": int(AdminCommand.LIST_QUEUES)}
RULES = {"AUTOSCALING_NAME": "r1", "AUTOSCALING_XCHANGE": {"AUTOSCALING_XCHANGE_THR": 60_000}}


def test_rules_listeners_survive_a_leader_kill(cluster: LocalCluster):
    first = cluster.start_gcm()
    cluster.start_host("h1")
    cluster.wait_ready()
    second = cluster.start_gcm()
    second_base = int(second.name.split("-")[1])
    context = new_context()
    listener = open_socket(context, Kind.PULL)
    port = cluster.ports.take(1)
    with cluster.as_cluster():  # a rules listener is a monitor's: the GCM pushes to the cluster
        bind(listener, "127.0.0.1", port)
    standby = Requester(context, endpoint_at("127.0.0.1", second_base, GcmPort.ADMIN), 5000)
    poller = Poller()
    poller.register(listener, READABLE)
    try:
        with cluster.admin() as admin:
            admin.create_queue("q1")
            admin.request({"CMD": 2008, "QName": "q1", "Address": f"tcp://127.0.0.1:{port}"})
        wait_for(lambda: standby.request(LIST)["RESULT"] == Result.LEAD_LOST, 20, "standby")
        os.killpg(first.process.pid, signal.SIGKILL)
        first.process.wait(timeout=10)
        wait_for(lambda: standby.request(LIST)["RESULT"] == Result.OK, 15, "standby leading")
        with AdminClient(gcm=f"127.0.0.1:{second_base}") as admin:
            admin.add_rules("q1", RULES)  # only the new leader can push this
        assert poller.poll(5000), "the new leader did not push the rules to the listener"
        pushed = bsonmsg.decode([listener.recv()])
        assert pushed["QName"] == "q1" and pushed["AUTOSCALING_NAME"] == "r1"
        assert pushed["Version"] == 1
    finally:
        standby.close()
        listener.close(0)
        context.term()


def test_listeners_are_refused_for_unknown_queues_and_go_with_the_queue(gcm_only: LocalCluster):
    gcm_only.start_host("h1")
    gcm_only.wait_ready()
    with gcm_only.admin() as admin:
        with pytest.raises(AdminRefused, match="not registered"):
            admin.request({"CMD": 2008, "QName": "nope", "Address": "tcp://127.0.0.1:1"})
        admin.create_queue("q1")
        admin.request({"CMD": 2008, "QName": "q1", "Address": "tcp://127.0.0.1:1"})
        admin.delete_queue("q1")
        admin.create_queue("q1")  # a fresh queue of the same name: only its monitor listens
        monitor = admin.get_host_by_qname("q1").monitor_host
    rules = sibling(monitor, MonitorPort.REPORTS, MonitorPort.RULES)
    client = session.connect(gcm_only.zk, 4000, auth=gcm_only.zk_auth)
    registry = Registry(client, Paths(gcm_only.namespace))
    try:
        wait_for(lambda: registry.listeners("q1"), 10, "the monitor registered (2008)")
        assert registry.listeners("q1") == [rules]
    finally:
        session.close(client)


def test_gcm_and_host_outlive_an_expired_zookeeper_session(cluster: LocalCluster):
    """Both processes frozen past the session timeout (what an overloaded machine or a paused
    VM does): ZooKeeper expires their sessions and the host's ephemeral record. After they
    resume, the GCM leads again instead of crashing on the expired session, and the host
    registers again and takes a queue. Found on a 2-core machine at load 14, where the GCM
    died with SessionExpiredError and took its `roq up` cluster down."""
    gcm = cluster.start_gcm(**{"zk.session.timeout": 2000})
    _leader_ready(cluster, cluster.gcm_base)
    host = cluster.start_host("h1", **{"zk.session.timeout": 2000})
    cluster.wait_ready(hosts=1)

    watcher = session.connect(cluster.zk, 4000, auth=cluster.zk_auth)
    registry = Registry(watcher, Paths(cluster.namespace))
    for daemon in (gcm, host):
        os.kill(daemon.process.pid, signal.SIGSTOP)
    try:
        wait_for(lambda: registry.hosts() == [], 15, "the frozen host's record to expire")
        wait_for(lambda: registry.leader() is None, 15, "the frozen leader's record to expire")
    finally:
        for daemon in (gcm, host):
            os.kill(daemon.process.pid, signal.SIGCONT)
        session.close(watcher)

    cluster.wait_ready(hosts=1, timeout_s=20)
    # one attempt with room for the start of a monitor and an exchange on a loaded machine: a
    # create retried after a timeout is answered "already exists"
    with cluster.admin(timeout_ms=20_000, retries=1) as admin:
        assert admin.create_queue("after-expiry").host == "h1"
    assert gcm.process.poll() is None and host.process.poll() is None, cluster.logs()
    assert "registered again after its ZooKeeper session expired" in host.log_text()
