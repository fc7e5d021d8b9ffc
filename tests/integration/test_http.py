"""The HTTP gateway (`roq http`, roq/http/) against a real cluster, over real HTTP on 127.0.0.1:
the mq API's table with each status code, the limits at their edge and one past, v2, restarts of
the gateway and of the exchange, two gateways, README's curl tour and 2,000 malformed requests;
bearer tokens (401, 403 by topic prefix, revocation) and HTTPS. The clusters are secured: every
call shows the admin's token unless a test says otherwise."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from roq import limits
from roq.client.live import monitor_status
from roq.coordination import session
from roq.http import snapshot
from roq.protocol.messages.control import StateLogStatus
from roq.system.spawn import child_environment, roq_command
from roq.testing.cluster import (
    LocalCluster,
    PortBlocks,
    child_pids,
    processes_with,
    wait_for,
)
from roq.transport.security import reset as security_reset

pytestmark = pytest.mark.integration

README = Path(__file__).resolve().parents[2] / "README.md"
# small limits, so every edge is cheap to reach
LIMITS = {"maxQueueSize": 3, "maxNameLen": 8, "maxMsgSize": 16, "maxTopics": 100,
          "maxSubscribers": 3}  # fmt: skip


class Api:
    """A client of one gateway, showing `token` (a cluster's admin token, or a principal's)."""

    def __init__(self, port: int, token: str, ca: Path | None = None):
        self.port, self.token = port, token
        self.base = f"{'https' if ca else 'http'}://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        verify: ssl.SSLContext | bool = ssl.create_default_context(cafile=ca) if ca else True
        self.client = httpx.Client(base_url=self.base, timeout=40, headers=headers, verify=verify)

    def post(self, path: str, **body: Any) -> httpx.Response:
        return self.client.post(path, json=body)

    def v1(self, call: str, **body: Any) -> tuple[int, dict[str, Any]]:
        response = self.post(f"/v1/{call}", **body)
        return response.status_code, response.json()

    def v2(self, call: str, **body: Any) -> tuple[int, dict[str, Any]]:
        response = self.post(f"/v2/{call}", **body)
        return response.status_code, response.json()


def start_gateway(cluster: LocalCluster, port: int = 0, **overrides: Any) -> tuple[Any, Api]:
    """A gateway on `cluster`; its Api shows the admin's token (over HTTPS with the test's
    certificate as the only CA when `http.tls.cert` is set)."""
    daemon, port = cluster.start_http(port=port, **{**LIMITS, **overrides})
    cert = overrides.get("http.tls.cert")
    api = Api(port, cluster.token, Path(cert) if cert else None)

    def ready() -> bool:
        assert daemon.process.poll() is None, daemon.log_text()
        return api.client.get("/metrics", timeout=2).status_code == 200

    wait_for(ready, 60, f"the gateway on {port}\n{cluster.logs()}", interval_s=0.2)
    return daemon, api


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory, zookeeper: str, port_blocks: PortBlocks
) -> Iterator[tuple[LocalCluster, Api]]:
    cluster = LocalCluster(tmp_path_factory.mktemp("http"), zookeeper, port_blocks)
    try:
        cluster.start_gcm()
        cluster.start_host()
        cluster.wait_ready()
        _, api = start_gateway(cluster, **{"http.queues": 2})
        yield cluster, api
    finally:
        cluster.stop()


def test_register_and_publish_refusals_and_limits(served: tuple[LocalCluster, Api]) -> None:
    _, api = served
    assert api.v1("topic/register", owner="alice", topic="t1") == (200, {})
    status, body = api.v1("topic/register", owner="bob", topic="t1")
    assert status == 400 and "taken" in body["error"]
    assert api.v1("topic/register", owner="alice", topic="t1")[0] == 400  # taken, even by its owner
    assert api.v1("message/publish", owner="bob", topic="t1", msg="x")[0] == 400  # not the owner
    status, body = api.v1("message/publish", owner="alice", topic="nope", msg="x")
    assert status == 400 and "unknown topic" in body["error"]
    # maxNameLen 8: at the edge and one past, for each name
    assert api.v1("topic/register", owner="o" * 8, topic="n" * 8)[0] == 200
    assert api.v1("topic/register", owner="o" * 9, topic="n2")[0] == 400
    assert api.v1("topic/register", owner="o", topic="n" * 9)[0] == 400
    assert api.v1("topic/subscribe", subscriber="s" * 9, topic="t1")[0] == 400
    # maxMsgSize 16 bytes of UTF-8: "é" is two
    assert api.v1("message/publish", owner="alice", topic="t1", msg="é" * 8)[0] == 200
    status, body = api.v1("message/publish", owner="alice", topic="t1", msg="x" * 17)
    assert status == 400 and "maxMsgSize" in body["error"]
    # maxSubscribers 3 per topic
    for name in ("s1", "s2", "s3"):
        assert api.v1("topic/subscribe", subscriber=name, topic="t1")[0] == 200
    assert api.v1("topic/subscribe", subscriber="s1", topic="t1")[0] == 200  # again: not new
    status, body = api.v1("topic/subscribe", subscriber="s4", topic="t1")
    assert status == 400 and "limit" in body["error"]
    assert api.v1("topic/subscribe", subscriber="s1", topic="nope")[0] == 400


def test_get_ack_eviction_and_no_message(served: tuple[LocalCluster, Api]) -> None:
    _, api = served
    topic = "g"
    assert api.v1("topic/register", owner="alice", topic=topic)[0] == 200
    assert api.v1("topic/subscribe", subscriber="early", topic=topic)[0] == 200
    status, body = api.v1("message/get", subscriber="early", topic=topic)
    assert (status, body["msgIdx"]) == (231, 1)  # an empty topic
    for n in range(1, 3):
        assert api.v1("message/publish", owner="alice", topic=topic, msg=f"m{n}") == (
            200, {"msgIdx": n})  # fmt: skip
    assert api.v1("message/get", subscriber="early", topic=topic) == (
        200,
        {"msgIdx": 1, "msg": "m1"},
    )
    assert api.v1("message/get", subscriber="early", topic=topic)[1]["msgIdx"] == 1  # until acked
    assert api.v1("message/ack", subscriber="early", topic=topic, msgIdx=2)[0] == 400  # not next
    assert api.v1("message/ack", subscriber="early", topic=topic, msgIdx=1) == (200, {"nextIdx": 2})
    assert api.v1("message/ack", subscriber="early", topic=topic, msgIdx=1)[0] == 400  # done
    assert api.v1("message/get", subscriber="early", topic=topic)[1] == {"msgIdx": 2, "msg": "m2"}
    assert api.v1("message/ack", subscriber="early", topic=topic, msgIdx=2)[0] == 200
    assert api.v1("message/get", subscriber="early", topic=topic)[0] == 231
    assert api.v1("message/ack", subscriber="early", topic=topic, msgIdx=3)[0] == 400  # unpublished
    assert api.v1("message/ack", subscriber="stranger", topic=topic, msgIdx=1)[0] == 400
    assert api.v1("message/get", subscriber="stranger", topic=topic)[0] == 400
    # a late subscriber gets only what comes after it: 231 although two messages exist
    assert api.v1("topic/subscribe", subscriber="late", topic=topic) == (200, {"nextIdx": 3})
    assert api.v1("message/get", subscriber="late", topic=topic)[0] == 231
    # maxQueueSize 3: messages 3..7 evict 1..4; "late" waits at 3, which is evicted
    for n in range(3, 8):
        assert api.v1("message/publish", owner="alice", topic=topic, msg=f"m{n}")[0] == 200
    status, body = api.v1("message/get", subscriber="late", topic=topic)
    assert (status, body["msgIdx"]) == (230, 3)
    assert api.v1("message/ack", subscriber="late", topic=topic, msgIdx=3)[0] == 200
    assert api.v1("message/get", subscriber="late", topic=topic)[0] == 230  # 4 is gone too
    assert api.v1("message/ack", subscriber="late", topic=topic, msgIdx=4)[0] == 200
    assert api.v1("message/get", subscriber="late", topic=topic)[1] == {"msgIdx": 5, "msg": "m5"}
    assert "roq_http_requests_total" in api.client.get("/metrics").text


def test_v2_batch_long_poll_and_problems(served: tuple[LocalCluster, Api]) -> None:
    _, api = served
    topic = "v2"
    assert api.v2("topic/register", owner="alice", topic=topic)[0] == 200
    assert api.v2("topic/subscribe", subscriber="p", topic=topic)[0] == 200
    assert api.v2("message/publish", owner="alice", topic=topic, msgs=["a", "b", "c"]) == (
        200, {"msgIdx": 1, "count": 3})  # fmt: skip
    assert api.v2("message/get", subscriber="p", topic=topic, wait=5)[1] == {
        "msgIdx": 1,
        "msg": "a",
    }
    for n in (1, 2, 3):
        assert api.v2("message/ack", subscriber="p", topic=topic, msgIdx=n)[0] == 200
    # an expired long poll: 231 after the wait, as problem+json
    started = time.monotonic()
    response = api.post("/v2/message/get", subscriber="p", topic=topic, wait=0.5)
    assert response.status_code == 231 and time.monotonic() - started >= 0.5
    assert response.headers["content-type"] == "application/problem+json"
    assert response.json()["title"] == "no message"
    # a long poll answered within milliseconds of a publish
    answered: list[tuple[float, dict[str, Any]]] = []

    def poll() -> None:
        response = api.post("/v2/message/get", subscriber="p", topic=topic, wait=20)
        answered.append((time.monotonic(), response.json()))

    waiter = threading.Thread(target=poll)
    waiter.start()
    time.sleep(0.5)  # the poll is parked (nothing to observe from outside; it only delays)
    other = Api(api.port, api.token)
    assert other.v2("message/publish", owner="alice", topic=topic, msg="d")[0] == 200
    published = time.monotonic()
    waiter.join(25)
    assert answered and answered[0][1] == {"msgIdx": 4, "msg": "d"}
    assert answered[0][0] - published < 0.25, answered[0][0] - published
    # problems: refused, too large, wrong method, unknown path
    response = api.post("/v2/message/publish", owner="bob", topic=topic, msg="x")
    assert response.status_code == 400 and "not the owner" in response.json()["detail"]
    big = api.client.post("/v2/message/publish", content=b"x" * (17 * 1024 * 1024))
    assert big.status_code == 413 and big.headers["content-type"] == "application/problem+json"
    assert api.client.get("/v2/message/get").status_code == 405
    assert api.client.post("/v2/nothing", json={}).status_code == 404
    assert api.v2("message/publish", owner="alice", topic=topic, msgs=[])[0] == 400
    assert api.v2("message/publish", owner="alice", topic=topic, msgs=["x"] * 1001)[0] == 400
    assert api.v2("message/get", subscriber="p", topic=topic, wait=31)[0] == 400


def _expired_count(api: Api) -> float:
    text = api.client.get("/metrics").text
    found = re.search(r"^roq_http_expired_messages_total (\S+)$", text, re.MULTILINE)
    assert found, text
    return float(found.group(1))


def test_v2_message_meta_is_returned_expired_ones_withheld_and_delayed_ones_held(
    served: tuple[LocalCluster, Api],
) -> None:
    """Issue 33 item 7: a v2 publish's headers, id, ttl and delay come back with the message;
    the gateway never returns an expired message (230, counted once) nor a delayed one before
    its time (231; a long poll answers at its time), and v1 answers stay the seed's."""
    _, api = served
    topic, given = "meta", "7d444840-9dc0-11d1-b245-5ffdce74fad2"
    assert api.v2("topic/register", owner="alice", topic=topic)[0] == 200
    assert api.v2("topic/subscribe", subscriber="s", topic=topic)[0] == 200
    before_ms = time.time() * 1000
    sent = api.v2("message/publish", owner="alice", topic=topic, headers={"k": "v"},
                  msgs=[{"msg": "kept", "id": given, "ttl": 3_600_000}, {"msg": "brief",
                        "ttl": 500}])  # fmt: skip
    assert sent == (200, {"msgIdx": 1, "count": 2})
    status, got = api.v2("message/get", subscriber="s", topic=topic)
    assert status == 200, got
    assert got["msg"] == "kept" and got["headers"] == {"k": "v"} and "notBefore" not in got
    assert got["id"] == given.replace("-", "")
    assert before_ms + 3_600_000 - 1 <= got["expiresAt"] <= time.time() * 1000 + 3_600_000
    assert api.v1("message/get", subscriber="s", topic=topic)[1] == {"msgIdx": 1, "msg": "kept"}
    assert api.v2("message/ack", subscriber="s", topic=topic, msgIdx=1)[0] == 200

    # "brief" expires 500 ms after its publish: once the clock is past it, never returned
    counted = _expired_count(api)
    status, got = api.v2("message/get", subscriber="s", topic=topic)
    expires_at = got["expiresAt"]
    wait_for(lambda: time.time() * 1000 > expires_at + 50, 30, "the clock past expiresAt")
    for _ in range(2):
        response = api.post("/v2/message/get", subscriber="s", topic=topic, wait=1)
        assert response.status_code == 230, response.text
        problem = response.json()
        assert problem["type"] == "urn:roq:mq:message-expired" and problem["msgIdx"] == 2
        assert problem["expiresAt"] == expires_at and "expired at" in problem["detail"]
        assert "msg" not in problem
    assert api.v1("message/get", subscriber="s", topic=topic) == (
        230, {"error": "message evicted", "msgIdx": 2})  # fmt: skip
    assert _expired_count(api) == counted + 1  # each expired message once
    assert api.v2("message/ack", subscriber="s", topic=topic, msgIdx=2)[0] == 200

    # a delayed message, and one behind it: 231 until its time, then a long poll answers
    sent = api.v2("message/publish", owner="alice", topic=topic,
                  msgs=[{"msg": "later", "delay": 3_000}, "behind"])  # fmt: skip
    assert sent == (200, {"msgIdx": 3, "count": 2})
    response = api.post("/v2/message/get", subscriber="s", topic=topic)
    assert response.status_code == 231, response.text
    due = response.json()["notBefore"]
    assert "is not due before" in response.json()["detail"] and response.json()["msgIdx"] == 3
    assert api.v1("message/get", subscriber="s", topic=topic) == (
        231, {"error": "no message", "msgIdx": 3})  # fmt: skip
    status, got = api.v2("message/get", subscriber="s", topic=topic, wait=20)
    answered_ms = time.time() * 1000
    assert (status, got) == (200, {"msgIdx": 3, "msg": "later", "notBefore": due})
    assert due <= answered_ms < due + 5_000, answered_ms - due
    assert api.v2("message/ack", subscriber="s", topic=topic, msgIdx=3)[0] == 200
    assert api.v2("message/get", subscriber="s", topic=topic)[1] == {"msgIdx": 4, "msg": "behind"}


def test_v2_meta_fields_out_of_bounds_are_400_naming_the_field(
    served: tuple[LocalCluster, Api],
) -> None:
    _, api = served
    topic = "metabad"
    assert api.v2("topic/register", owner="alice", topic=topic)[0] == 200
    assert api.v2("topic/subscribe", subscriber="s", topic=topic)[0] == 200
    too_many = {f"h{n}": "" for n in range(limits.record_headers_max + 1)}
    for body, named in [
        ({"msg": "a", "headers": too_many}, "'headers': 33 headers"),
        ({"msg": "a", "headers": {"k": 1}}, "'headers' must be an object of strings"),
        ({"msg": "a", "id": "xyz"}, "'id': 'xyz' is not a message id"),
        ({"msg": "a", "ttl": 0}, "'ttl' must be a whole number of milliseconds"),
        ({"msgs": ["a", {"msg": "b", "delay": 1.5}]}, "'msgs[1].delay' must be a whole number"),
        ({"msgs": ["a", "b"], "id": "ab" * 16}, "'id' names one message"),
    ]:
        response = api.post("/v2/message/publish", owner="alice", topic=topic, **body)
        assert response.status_code == 400, response.text
        assert named in response.json()["detail"], response.text
    # nothing of the refused publishes was stored; v1 ignores the fields, as any unknown one
    assert api.v1("message/publish", owner="alice", topic=topic, msg="v1", headers={"k": "v"},
                  ttl=1) == (200, {"msgIdx": 1})  # fmt: skip
    assert api.v2("message/get", subscriber="s", topic=topic)[1] == {"msgIdx": 1, "msg": "v1"}


def test_readme_curl_tour(served: tuple[LocalCluster, Api]) -> None:
    """The README's curl lines, run as they are but for the port and $ROQ_TOKEN, which is the
    admin's token that the README's `export ROQ_TOKEN=$(roq keys token)` line prints."""
    cluster, api = served
    text = README.read_text()
    exported = re.search(r"^export ROQ_TOKEN=\$\((roq [^)]*)\)(\s+#.*)?$", text, re.MULTILINE)
    assert exported, "README: the line that sets ROQ_TOKEN"
    printed = cluster.cli("--credentials", str(cluster.credentials),
                          *shlex.split(exported.group(1))[1:])  # fmt: skip
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == f"{cluster.token}\n"  # the token alone: $(...) is the token
    lines = [line for line in text.splitlines() if line.startswith("curl ")]
    assert len(lines) >= 5 and all("Bearer $ROQ_TOKEN" in line for line in lines)
    outputs = []
    for line in lines:
        command, _, comment = line.partition("  #")
        command = command.replace("$ROQ_TOKEN", cluster.token)
        args = shlex.split(command.replace("localhost:8080", f"127.0.0.1:{api.port}"))
        done = subprocess.run(args, capture_output=True, text=True, timeout=30, check=False)
        assert done.returncode == 0, (line, done.stderr)
        outputs.append((done.stdout, comment.strip()))
    expected = [json.loads(c) for _, c in outputs if c.startswith("{")]
    assert expected and all(json.loads(out) in expected for out, c in outputs if c.startswith("{"))
    assert re.search(r"231$", outputs[-1][0].strip())


def test_keep_alive_requests_are_not_held_by_nagle(served: tuple[LocalCluster, Api]) -> None:
    """uvicorn writes a response's head and body apart: without TCP_NODELAY on the gateway's
    connections the body waited for the client's delayed ACK, 40 ms per keep-alive request."""
    _, api = served
    took = []
    for _ in range(20):
        started = time.monotonic()
        assert api.client.get("/metrics").status_code == 200
        took.append(time.monotonic() - started)
    took.sort()
    assert took[10] < 0.02, f"median {took[10] * 1000:.1f} ms on one keep-alive connection"


def test_two_gateways_answer_alike(served: tuple[LocalCluster, Api]) -> None:
    cluster, first = served
    daemon, second = start_gateway(cluster, **{"http.queues": 2})
    try:
        topic = "two"
        assert second.v1("topic/register", owner="alice", topic=topic)[0] == 200
        assert first.v1("topic/subscribe", subscriber="x", topic=topic)[0] == 200
        assert second.v1("topic/subscribe", subscriber="y", topic=topic)[0] == 200
        assert first.v1("message/publish", owner="alice", topic=topic, msg="one")[0] == 200
        assert second.v1("message/publish", owner="alice", topic=topic, msg="two")[0] == 200
        assert second.v1("message/get", subscriber="x", topic=topic)[1] == {
            "msgIdx": 1,
            "msg": "one",
        }
        assert second.v1("message/ack", subscriber="x", topic=topic, msgIdx=1)[0] == 200
        assert first.v1("message/get", subscriber="x", topic=topic)[1] == {
            "msgIdx": 2,
            "msg": "two",
        }
        assert first.v1("message/get", subscriber="y", topic=topic)[1]["msg"] == "one"
        assert second.v1("topic/register", owner="z", topic=topic)[0] == 400  # taken via first
    finally:
        cluster.kill(daemon)


FUZZED_FIELDS = ["owner", "topic", "subscriber", "msg", "msgs", "msgIdx", "wait", "zz",
                 "headers", "id", "ttl", "delay"]  # fmt: skip


def test_malformed_requests_are_answered_4xx(served: tuple[LocalCluster, Api]) -> None:
    _, api = served
    seen: list[int] = []
    paths = [f"/v{v}/{p}" for v in (1, 2, 3) for p in (
        "topic/register", "message/publish", "topic/subscribe", "message/get", "message/ack",
        "x", "")]  # fmt: skip
    values = st.one_of(
        st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=300),
        st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers()),
        st.just("x" * 200_000), st.just(2**70), st.just(-1),
    )  # fmt: skip
    documents = st.dictionaries(
        st.sampled_from(FUZZED_FIELDS),
        values, max_size=6,
    )  # fmt: skip
    raw = st.one_of(
        st.binary(max_size=200),
        documents.map(lambda d: json.dumps(d).encode()),
        st.sampled_from([b"{", b"[1,2]", b'"x"', b"null", b"{" * 5000 + b"}" * 5000,
                         b'{"topic": "\\ud800", "owner": "a"}', b'{"wait": NaN}']),
    )  # fmt: skip

    @settings(max_examples=2000, deadline=None, database=None,
              suppress_health_check=list(HealthCheck))  # fmt: skip
    @given(method=st.sampled_from(["POST"] * 6 + ["GET", "PUT", "DELETE"]),
           path=st.sampled_from(paths), body=raw)  # fmt: skip
    def one(method: str, path: str, body: bytes) -> None:
        response = api.client.request(method, path, content=body)
        seen.append(response.status_code)
        assert 400 <= response.status_code < 500 or response.status_code in (230, 231, 200), (
            method, path, body[:200], response.status_code, response.text[:300])  # fmt: skip
        # 200/230/231 only when the fuzzer happened to send a valid call
        if response.status_code in (200, 230, 231):
            assert method == "POST" and path.startswith(("/v1/", "/v2/"))

    one()
    assert len(seen) >= 2000
    assert sum(400 <= code < 500 for code in seen) >= 1900
    # alive and serving
    assert api.v1("topic/register", owner="alice", topic="after")[0] == 200
    assert api.v1("topic/subscribe", subscriber="after", topic="after")[0] == 200
    assert api.v1("message/publish", owner="alice", topic="after", msg="ok")[0] == 200
    assert api.v1("message/get", subscriber="after", topic="after")[1] == {"msgIdx": 1, "msg": "ok"}


# --- bearer tokens and TLS (docs/http.md §Authentication, docs/security.md §5) --------------
def keys(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    """`roq keys ...` as the cluster's admin (explicitly: another test's cluster may have made
    itself this process's default since)."""
    where = ("--zk", cluster.zk, "--namespace", cluster.namespace)
    done = cluster.cli("--credentials", str(cluster.credentials), "keys", *args, *where)
    assert done.returncode == 0, (args, done.stdout, done.stderr)
    return done


def principal_with_token(cluster: LocalCluster, name: str, prefix: str, permission: str) -> str:
    """A principal made as a user would (`roq keys create`, `grant`, `token`); its token."""
    keys(cluster, "create", name, "--out", str(cluster.tmp / f"{name}.json"))
    keys(cluster, "grant", name, prefix, permission)
    issued = keys(cluster, "token", name)
    token = issued.stdout.strip()
    assert issued.stdout == f"{token}\n" and token.startswith("roq_"), issued.stdout
    return token


def status_of(api: Api, path: str, **body: Any) -> int:
    return api.post(path, **body).status_code


def test_calls_without_a_valid_token_are_401_and_the_gateway_serves_on(
    served: tuple[LocalCluster, Api],
) -> None:
    cluster, api = served
    body = {"owner": "alice", "topic": "anon"}
    for headers in ({}, {"Authorization": f"Bearer {cluster.token}x"},
                    {"Authorization": "Bearer"}, {"Authorization": f"Basic {cluster.token}"},
                    {"Authorization": "Bearer roq_" + "x" * 600}):  # fmt: skip
        anonymous = httpx.Client(base_url=api.base, timeout=10, headers=headers)
        v1 = anonymous.post("/v1/topic/register", json=body)
        assert v1.status_code == 401 and "error" in v1.json(), (headers, v1.text)
        assert v1.headers["www-authenticate"].startswith('Bearer realm="roq"')
        v2 = anonymous.post("/v2/message/get", json={"subscriber": "s", "topic": "anon"})
        assert v2.status_code == 401 and v2.headers["content-type"] == "application/problem+json"
        assert v2.json()["status"] == 401 and v2.json()["detail"]
        assert v2.headers["www-authenticate"].startswith('Bearer realm="roq"')
        metrics = anonymous.get("/metrics")
        assert metrics.status_code == 401 and "www-authenticate" in metrics.headers
        assert "roq_http" not in metrics.text
        anonymous.close()
    assert cluster.token not in (cluster.tmp / f"http-{api.port}.log").read_text()  # never logged
    assert api.v1("topic/register", **body)[0] == 200  # the admin's token: served on
    assert api.client.get("/metrics").status_code == 200


def test_tokens_act_as_their_principal_per_topic_prefix_until_revoked(
    served: tuple[LocalCluster, Api],
) -> None:
    cluster, admin = served
    writer = Api(admin.port, principal_with_token(cluster, "newsdesk", "topic:news", "publish"))
    reader = Api(admin.port, principal_with_token(cluster, "fan", "topic:sport", "subscribe"))
    # usable once the table reached the gateway (its watch): within seconds
    wait_for(lambda: status_of(writer, "/v1/topic/register", owner="w", topic="news1") == 200,
             5, "the new principal's token is usable")  # fmt: skip
    assert writer.v1("message/publish", owner="w", topic="news1", msg="hi") == (200, {"msgIdx": 1})
    assert writer.v2("message/publish", owner="w", topic="news1", msgs=["a"])[0] == 200
    status, body = writer.v1("message/get", subscriber="w", topic="news1")
    assert status == 403, body
    # no grant of subscribe anywhere: refused from the head, before the body names the topic
    assert body["error"] == "principal newsdesk lacks permission 'subscribe' on every topic"
    status, body = writer.v2("topic/subscribe", subscriber="w", topic="news1")
    assert status == 403 and "lacks permission 'subscribe'" in body["detail"]
    status, body = writer.v1("topic/register", owner="w", topic="sport1")
    assert status == 403 and "'publish' on topic 'sport1'" in body["error"]
    # subscribe only, on another prefix: reads and acks, cannot write
    wait_for(lambda: status_of(reader, "/v1/topic/subscribe", subscriber="f", topic="x") != 401,
             5, "the reader's token is usable")  # fmt: skip
    assert admin.v1("topic/register", owner="a", topic="sport1")[0] == 200
    assert reader.v1("topic/subscribe", subscriber="f", topic="sport1") == (200, {"nextIdx": 1})
    assert admin.v1("message/publish", owner="a", topic="sport1", msg="goal")[0] == 200
    assert reader.v2("message/get", subscriber="f", topic="sport1", wait=5)[1] == {
        "msgIdx": 1, "msg": "goal"}  # fmt: skip
    assert reader.v1("message/ack", subscriber="f", topic="sport1", msgIdx=1)[0] == 200
    status, body = reader.v1("message/publish", owner="a", topic="sport1", msg="x")
    assert status == 403
    assert body["error"] == "principal fan lacks permission 'publish' on every topic"
    assert reader.v1("message/get", subscriber="f", topic="news1")[0] == 403
    assert reader.client.get("/metrics").status_code == 200  # any valid token
    listed = keys(cluster, "list").stdout
    assert re.search(r"^newsdesk .*tokens: 1$", listed, re.MULTILINE), listed
    assert re.search(r"^admin .*tokens: 1$", listed, re.MULTILINE), listed
    # revoked: the principal (with its tokens), and one principal's tokens alone
    keys(cluster, "revoke", "newsdesk")
    wait_for(lambda: status_of(writer, "/v1/message/publish", owner="w", topic="news1", msg="x")
             == 401, 5, "the revoked principal's token refused")  # fmt: skip
    keys(cluster, "token", "fan", "--revoke-all")
    wait_for(lambda: status_of(reader, "/v1/message/get", subscriber="f", topic="sport1") == 401,
             5, "the dropped token refused")  # fmt: skip
    assert re.search(r"^fan .*tokens: 0$", keys(cluster, "list").stdout, re.MULTILINE)
    assert admin.v1("message/get", subscriber="f", topic="sport1")[0] == 231  # others go on


def test_a_topic_grant_reaches_no_queue_of_the_gateway_over_zeromq(
    served: tuple[LocalCluster, Api],
) -> None:
    """Issue 31, finding 4: a grant on `http` let its holder read queue http-0 over ZeroMQ (every
    topic's messages) and publish forged records into it. Now a topic is granted as
    `topic:http`, and the gateway's queues are the cluster's: even a queue grant on `http` gives
    no publish or subscribe on http-N (each refused by the GCM naming why)."""
    cluster, admin = served
    token = principal_with_token(cluster, "tenant", "topic:http", "publish")
    keys(cluster, "grant", "tenant", "topic:http", "subscribe")
    keys(cluster, "grant", "tenant", "http", "publish", "subscribe")  # as topics were granted
    tenant = Api(admin.port, token)
    wait_for(lambda: status_of(tenant, "/v1/topic/register", owner="t", topic="http1") == 200,
             10, "the tenant's token usable")  # fmt: skip
    assert tenant.v1("message/publish", owner="t", topic="http1", msg="mine")[0] == 200
    for topic in ("other1", "other2", "other3", "other4"):  # someone else's, in both queues
        assert admin.v1("topic/register", owner="o", topic=topic)[0] == 200
        assert admin.v1("message/publish", owner="o", topic=topic, msg="secret")[0] == 200
    credentials = str(cluster.tmp / "tenant.json")
    gcm = ("--gcm", cluster.gcm)
    for queue in ("http-0", "http-1"):
        for args in (["sub", queue, "--from-beginning", "--count", "1", "--timeout", "10"],
                     ["pub", queue, "--count", "1"]):  # fmt: skip
            done = cluster.cli("--credentials", credentials, *args, *gcm, timeout_s=60)
            assert done.returncode != 0, (args, done.stdout)
            assert "secret" not in done.stdout
            assert f"queue '{queue}' is the HTTP gateway's" in done.stderr, (args, done.stderr)
    assert admin.v1("topic/subscribe", subscriber="s", topic="http1")[0] == 200  # served on
    # admin on the gateway's queues (stop, start) names no owner or subscriber over ZeroMQ
    keys(cluster, "grant", "tenant", "http", "admin")
    env = {**child_environment(), "ROQ_CREDENTIALS": credentials}

    def asked() -> str:
        done = subprocess.run(
            [sys.executable, "-c", TOPIC_ASK, cluster.gcm, cluster.namespace],
            env=env, capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        return done.stdout + done.stderr

    # once the grant reached the GCM and the monitor (within seconds): refused by the monitor
    said: list[str] = []
    wait_for(lambda: said.append(asked()) or "lacks the cluster role of topic commands"
             in said[-1], 30, "the monitor's refusal of a topic command")  # fmt: skip


# A topic command to http-0's monitor over ZeroMQ (found through the GCM: the principal cannot
# read ZooKeeper), with the credentials of $ROQ_CREDENTIALS.
TOPIC_ASK = """
import sys
from roq.client.topics import TopicClient
from roq.errors import RoqError, TopicRefused
store = TopicClient(("http-0",), lambda topic: "http-0", (sys.argv[1], None, sys.argv[2]))
try:
    print(store.position("http1", "s"))
except (RoqError, TopicRefused) as error:
    print(error)
finally:
    store.close()
"""


def _tenants(cluster: LocalCluster, port: int, prefix: str) -> tuple[Api, Api]:
    """Two principals, each allowed to publish and subscribe on topic:<prefix>, as their Apis."""
    apis = []
    for name in (f"{prefix}-a", f"{prefix}-b"):
        api = Api(port, principal_with_token(cluster, name, f"topic:{prefix}", "publish"))
        keys(cluster, "grant", name, f"topic:{prefix}", "subscribe")
        wait_for(_knows(api, f"{prefix}n"), 10, f"{name}'s grants known")
        apis.append(api)
    return apis[0], apis[1]


def _knows(api: Api, unknown: str) -> Any:
    """Whether the gateway knows the principal's grant of subscribe: then a topic that does not
    exist is a 400 (a 401 or 403 before)."""
    return lambda: status_of(api, "/v1/topic/subscribe", subscriber="x", topic=unknown) == 400


def _stores(
    served: tuple[LocalCluster, Api], store: str, **overrides: Any
) -> tuple[LocalCluster, Api]:
    """The served gateway (topics in the state log), or one keeping them in ZooKeeper; a new one
    on the state log with `overrides`."""
    cluster, admin = served
    if store == "log" and not overrides:
        return cluster, admin
    _, api = start_gateway(cluster, **{"delivery.state": store, **overrides})
    return cluster, api


@pytest.mark.parametrize("store", ["log", "zookeeper"])
def test_a_principal_cannot_read_ack_or_reset_another_principals_subscriber(
    served: tuple[LocalCluster, Api], store: str
) -> None:
    """Issue 31, finding 3: a subscriber's name was a free string, so any principal allowed to
    subscribe to a topic read, acknowledged or reset another's position by naming it. Now a
    subscriber is the principal's that subscribed it: another's get, ack and subscribe are 403
    and change nothing; a principal holding admin on the topic may still act on it."""
    cluster, admin = _stores(served, store)
    alice, bob = _tenants(cluster, admin.port, f"sub{store[0]}")
    topic = f"sub{store[0]}1"
    assert alice.v1("topic/register", owner="a", topic=topic)[0] == 200
    assert alice.v1("topic/subscribe", subscriber="s", topic=topic) == (200, {"nextIdx": 1})
    assert alice.v2("message/publish", owner="a", topic=topic, msgs=["m1", "m2"])[0] == 200
    refused = [
        bob.v1("message/get", subscriber="s", topic=topic),
        bob.v1("message/ack", subscriber="s", topic=topic, msgIdx=1),
        bob.v1("topic/subscribe", subscriber="s", topic=topic),
    ]
    for status, body in refused:
        assert (status, body.get("error")) == (
            403,
            f"subscriber 's' of topic '{topic}' belongs to another principal",
        ), refused
    status, problem = bob.v2("message/get", subscriber="s", topic=topic)
    assert status == 403 and problem["title"] == "forbidden", problem
    # alice's position is where she left it: nothing read for her, acknowledged or reset
    assert alice.v1("message/get", subscriber="s", topic=topic) == (200, {"msgIdx": 1, "msg": "m1"})
    # bob's own subscriber of the same topic is his: a name of his own
    assert bob.v1("topic/subscribe", subscriber="t", topic=topic) == (200, {"nextIdx": 3})
    assert alice.v1("message/get", subscriber="t", topic=topic)[0] == 403
    # the admin (admin on every topic) acts on any subscriber
    assert admin.v1("message/ack", subscriber="s", topic=topic, msgIdx=1) == (200, {"nextIdx": 2})
    assert alice.v1("message/get", subscriber="s", topic=topic) == (200, {"msgIdx": 2, "msg": "m2"})


@pytest.mark.parametrize("store", ["log", "zookeeper"])
def test_a_principal_cannot_publish_as_another_principals_owner(
    served: tuple[LocalCluster, Api], store: str
) -> None:
    """Issue 31, finding 3: the owner was a free string, so any principal allowed to publish
    on a topic's prefix published to it as its owner. Now the owner is the principal's that
    registered the topic: another's publish (v1 and v2) is 403 and takes no index."""
    cluster, admin = _stores(served, store)
    alice, bob = _tenants(cluster, admin.port, f"own{store[0]}")
    topic = f"own{store[0]}1"
    assert alice.v1("topic/register", owner="a", topic=topic)[0] == 200
    status, body = bob.v1("message/publish", owner="a", topic=topic, msg="forged")
    assert (status, body.get("error")) == (
        403,
        f"owner 'a' of topic '{topic}' belongs to another principal",
    ), body
    assert bob.v2("message/publish", owner="a", topic=topic, msgs=["forged"])[0] == 403
    assert bob.v1("message/publish", owner="b", topic=topic, msg="x")[0] == 400  # not the owner
    assert alice.v1("message/publish", owner="a", topic=topic, msg="real") == (200, {"msgIdx": 1})
    assert admin.v1("message/publish", owner="a", topic=topic, msg="ops") == (200, {"msgIdx": 2})


@pytest.mark.parametrize("store", ["log", "zookeeper"])
def test_a_principal_at_its_topic_quota_registers_no_more_while_another_still_can(
    served: tuple[LocalCluster, Api], store: str
) -> None:
    """Issue 31, finding 7: maxTopics is the cluster's, so one tenant with a narrow grant took
    every topic (10,000 in 42 s) and nobody could register. Now each principal registers at
    most http.topics.per.principal, counted through every gateway and queue together; past it
    a 403 naming the setting, while the others register on."""
    cluster, admin = _stores(served, store, **{"http.topics.per.principal": 3})
    greedy, other = _tenants(cluster, admin.port, f"quota{store[0]}")
    prefix = f"quota{store[0]}"
    for n in range(3):  # spread over both queues (http.queues 2)
        assert greedy.v1("topic/register", owner="g", topic=f"{prefix}g{n}")[0] == 200
    status, body = greedy.v1("topic/register", owner="g", topic=f"{prefix}g3")
    assert status == 403 and body["error"].startswith(
        f"principal {prefix}-a holds 3 topics: its quota (http.topics.per.principal)"
    ), body
    status, problem = greedy.v2("topic/register", owner="g", topic=f"{prefix}g4")
    assert status == 403 and "http.topics.per.principal" in problem["detail"], problem
    assert other.v1("topic/register", owner="o", topic=f"{prefix}o0")[0] == 200  # others go on
    assert greedy.v1("message/publish", owner="g", topic=f"{prefix}g0", msg="x")[0] == 200
    for n in range(4):  # the cluster's operator (admin on topic:*) is held to none
        assert admin.v1("topic/register", owner="a", topic=f"{prefix}a{n}")[0] == 200


def test_https_with_the_configured_certificate(
    served: tuple[LocalCluster, Api], tls_files: dict[str, Path]
) -> None:
    cluster, _ = served
    tls = {"http.tls.cert": str(tls_files["cert"]), "http.tls.key": str(tls_files["key"])}
    daemon, api = start_gateway(cluster, **tls)  # verifies the certificate (it is the only CA)
    try:
        assert api.base.startswith("https://")
        assert api.v2("topic/register", owner="t", topic="tls")[0] == 200
        assert api.v2("topic/subscribe", subscriber="s", topic="tls")[0] == 200
        assert api.v2("message/publish", owner="t", topic="tls", msg="secret")[0] == 200
        assert api.v2("message/get", subscriber="s", topic="tls", wait=5)[1]["msg"] == "secret"
        assert f"https://127.0.0.1:{api.port}" in daemon.log_text()
        with pytest.raises(httpx.TransportError):  # plain HTTP to the TLS port: no answer
            httpx.get(f"http://127.0.0.1:{api.port}/metrics", timeout=5,
                      headers={"Authorization": f"Bearer {cluster.token}"})  # fmt: skip
        with pytest.raises(httpx.ConnectError):  # a client that does not trust it: refused
            httpx.get(f"{api.base}/metrics", timeout=5)
        assert api.client.get("/metrics").status_code == 200  # and it serves on
    finally:
        cluster.kill(daemon)
    # a file that is not there, or a key of another certificate: no start, exit 78, named
    for cert, key, named in ((cluster.tmp / "none.pem", tls_files["key"], "none.pem"),
                             (tls_files["cert"], tls_files["other_key"], "other.pem")):  # fmt: skip
        bad, _ = cluster.start_http(**{"http.tls.cert": str(cert), "http.tls.key": str(key)})
        assert bad.process.wait(30) == 78, bad.log_text()
        assert "http.tls" in bad.log_text() and named in bad.log_text(), bad.log_text()


def exchanges_of(host_pid: int) -> set[int]:
    """The host's exchange processes of the gateway's queue."""
    return {pid for pid in child_pids(host_pid) if pid in processes_with("exchange http-0")}


def test_restarts_of_gateway_and_exchange_keep_everything(cluster: LocalCluster) -> None:
    cluster.start_gcm()
    cluster.start_host()
    cluster.wait_ready()
    daemon, api = start_gateway(cluster, maxTopics=4)
    assert api.v1("topic/register", owner="o", topic="t")[0] == 200
    for name in ("u", "v", "w"):  # maxTopics 4: at the edge, then one past
        assert api.v1("topic/register", owner="o", topic=name)[0] == 200
    status, body = api.v1("topic/register", owner="o", topic="x")
    assert status == 400 and "too many topics" in body["error"]
    assert api.v1("topic/subscribe", subscriber="s", topic="t")[0] == 200
    for n in (1, 2, 3):
        assert api.v1("message/publish", owner="o", topic="t", msg=f"m{n}")[0] == 200
    assert api.v1("message/ack", subscriber="s", topic="t", msgIdx=1)[0] == 200
    port = int(api.base.rsplit(":", 1)[1])
    cluster.kill(daemon)  # SIGKILL: nothing is saved on the way out
    daemon, api = start_gateway(cluster, port=port)
    assert api.v1("message/get", subscriber="s", topic="t")[1] == {"msgIdx": 2, "msg": "m2"}
    assert api.v1("topic/register", owner="x", topic="t")[0] == 400  # still registered
    # the exchange of the gateway's queue, killed: its host starts it again on the same log
    host = next(d for d in cluster.daemons if d.name == "h1")
    exchanges = exchanges_of(host.process.pid)
    assert exchanges
    for pid in exchanges:
        os.kill(pid, signal.SIGKILL)
    wait_for(lambda: exchanges_of(host.process.pid) - exchanges, 30, "the exchange started again")
    # a publish after the exchange's restart is stored (the publisher follows it)
    wait_for(lambda: api.v1("message/publish", owner="o", topic="t", msg="m4")[0] == 200, 30,
             f"a publish after the exchange restarted\n{cluster.logs()}")  # fmt: skip
    cluster.kill(daemon)
    daemon, api = start_gateway(cluster, port=port)
    assert api.v1("message/ack", subscriber="s", topic="t", msgIdx=2)[0] == 200
    assert api.v1("message/get", subscriber="s", topic="t")[1] == {"msgIdx": 3, "msg": "m3"}
    assert api.v1("message/ack", subscriber="s", topic="t", msgIdx=3)[0] == 200
    assert api.v1("message/get", subscriber="s", topic="t")[1] == {"msgIdx": 4, "msg": "m4"}
    # a normal stop: SIGTERM, exit 0
    daemon.process.terminate()
    assert daemon.process.wait(30) == 0, daemon.log_text()[-3000:]


def _read_from_logs(api: Api) -> int:
    text = api.client.get("/metrics", timeout=5).text
    found = re.search(r"^roq_http_log_messages_read_total (\S+)$", text, re.M)
    assert found, text
    return int(float(found.group(1)))


def test_a_gateway_starts_from_its_snapshot_and_reads_only_the_log_after_it(
    cluster: LocalCluster,
) -> None:
    """SIGTERM saves the index (http/snapshot.py); the next start files its messages from the
    snapshot and reads from the log only what came after (here: one message another gateway
    published meanwhile). A damaged snapshot is reported and not used: the log is read from
    the beginning and every message is still there."""
    cluster.start_gcm()
    cluster.start_host()
    cluster.wait_ready()
    daemon, api = start_gateway(cluster, maxQueueSize=5)
    port = int(api.base.rsplit(":", 1)[1])
    assert api.v1("topic/register", owner="o", topic="t")[0] == 200
    for n in range(1, 31):  # 30 published, the newest 5 kept (27..31 once m31 comes)
        if n == 27:
            assert api.v1("topic/subscribe", subscriber="s", topic="t")[1] == {"nextIdx": 27}
        assert api.v1("message/publish", owner="o", topic="t", msg=f"m{n}")[0] == 200
    wait_for(lambda: _read_from_logs(api) == 30, 30, "the gateway read its 30 messages")
    daemon.process.terminate()
    assert daemon.process.wait(30) == 0, daemon.log_text()[-3000:]
    saved = cluster.tmp / "http" / f".http-{port}" / "http-0"
    assert saved.exists(), daemon.log_text()[-3000:]
    other, other_api = start_gateway(cluster, maxQueueSize=5)  # publishes while the first is down
    assert other_api.v1("message/publish", owner="o", topic="t", msg="m31")[0] == 200
    daemon, api = start_gateway(cluster, port=port, maxQueueSize=5)
    wait_for(lambda: _read_from_logs(api) >= 1, 30, f"m31 read\n{daemon.log_text()}")
    assert "(topics: 1, messages: 5)" in daemon.log_text()
    assert api.v1("message/get", subscriber="s", topic="t")[1] == {"msgIdx": 27, "msg": "m27"}
    assert api.v1("message/ack", subscriber="s", topic="t", msgIdx=27)[0] == 200
    assert api.v1("message/get", subscriber="s", topic="t")[1] == {"msgIdx": 28, "msg": "m28"}
    assert _read_from_logs(api) == 1  # the 30 before came from the snapshot
    # a flipped byte in the snapshot: reported, not used; the log has everything
    cluster.kill(daemon)
    damaged = bytearray(saved.read_bytes())
    damaged[len(damaged) // 2] ^= 0x01
    saved.write_bytes(bytes(damaged))
    daemon, api = start_gateway(cluster, port=port, maxQueueSize=5)
    wait_for(lambda: _read_from_logs(api) == 31, 30, f"the log read again\n{daemon.log_text()}")
    assert "the snapshot is not used, queue http-0 is read from the beginning" in daemon.log_text()
    assert "fails its CRC" in daemon.log_text()
    for n in range(28, 31):
        assert api.v1("message/get", subscriber="s", topic="t")[1] == {"msgIdx": n, "msg": f"m{n}"}
        assert api.v1("message/ack", subscriber="s", topic="t", msgIdx=n)[0] == 200
    assert api.v1("message/get", subscriber="s", topic="t")[1] == {"msgIdx": 31, "msg": "m31"}
    # a whole snapshot (every CRC right) whose log position makes no sense: reported, the log
    # is read from the beginning
    daemon.process.terminate()
    assert daemon.process.wait(30) == 0
    head = json.loads(next(snapshot._frames(saved, saved.read_bytes()))[2])
    good = snapshot.read(saved, "http-0", head["identity"])
    assert good is not None
    nonsense = {"exchanges": {"x": "not an offset"}, "streams": [["not hex", "", 1]]}
    snapshot.write(saved, snapshot.Snapshot("http-0", head["identity"], nonsense, good.topics))
    daemon, api = start_gateway(cluster, port=port, maxQueueSize=5)
    wait_for(lambda: _read_from_logs(api) == 31, 30, f"the log read again\n{daemon.log_text()}")
    assert "the snapshot's log position is unusable" in daemon.log_text()
    assert api.v1("message/get", subscriber="s", topic="t")[1] == {"msgIdx": 31, "msg": "m31"}
    other.process.terminate()
    assert other.process.wait(30) == 0


def _segments(cluster: LocalCluster, queue: str) -> list[int]:
    """The base offsets of the segments of the queue's exchange logs on h1, oldest first."""
    found = (cluster.tmp / "h1" / "log" / queue).glob("*/*.log")
    return sorted(int(path.stem) for path in found if path.stem.isdigit())


def test_segments_that_no_topic_needs_are_deleted_and_a_new_gateway_reads_only_the_rest(
    cluster: LocalCluster,
) -> None:
    """Retention by the gateways' floors (monitor/topics.py, TOPIC_FLOOR 57): once a gateway
    saved its index, the whole segments before the oldest message any topic keeps are deleted
    from the queue's log, without any retention setting; a gateway that never ran before reads
    what is left and serves every kept message."""
    cluster.start_gcm()
    cluster.start_host(maxFileSize=4096)
    cluster.wait_ready()
    limits_ = {"maxQueueSize": 3, "maxMsgSize": 1000}
    daemon, api = start_gateway(cluster, **limits_)
    for topic in ("a", "b"):
        assert api.v1("topic/register", owner="o", topic=topic)[0] == 200
    body = "x" * 400
    for n in range(1, 101):  # 100 messages of 400 bytes per topic: about 25 segments
        if n == 98:
            for topic in ("a", "b"):
                assert api.v1("topic/subscribe", subscriber="s", topic=topic)[1] == {"nextIdx": 98}
        for topic in ("a", "b"):
            msg = f"{topic}{n} {body}"
            assert api.v1("message/publish", owner="o", topic=topic, msg=msg)[0] == 200
    before = _segments(cluster, "http-0") + _segments(cluster, "http-1")
    assert len(before) > 10, before
    wait_for(lambda: _read_from_logs(api) == 200, 30, "the gateway read its 200 messages")
    daemon.process.terminate()  # its last snapshot, and its floors to the monitors
    assert daemon.process.wait(30) == 0, daemon.log_text()[-3000:]

    def deleted() -> bool:
        return len(_segments(cluster, "http-0") + _segments(cluster, "http-1")) <= 4

    wait_for(deleted, 30, f"the old segments deleted\n{cluster.logs()}")
    assert "deleted: no reader needs them" in cluster.logs()
    _, fresh = start_gateway(cluster, **limits_)  # another port: no snapshot, reads the logs
    for topic in ("a", "b"):
        for n in (98, 99, 100):
            got = fresh.v1("message/get", subscriber="s", topic=topic)[1]
            assert got == {"msgIdx": n, "msg": f"{topic}{n} {body}"}
            assert fresh.v1("message/ack", subscriber="s", topic=topic, msgIdx=n)[0] == 200
    assert _read_from_logs(fresh) < 40  # of 200: the rest was deleted


def test_a_publisher_that_failed_with_its_queue_stopped_is_replaced_once_it_runs_again(
    cluster: LocalCluster,
) -> None:
    """The gateway's queue stopped under it: publishes answer 503 naming why, the gateway serves
    on, and its publisher fails for good once it has waited its bound for an exchange; the
    queue started again, a publish gets a new publisher, is stored and read back, and /metrics
    counts the replacement. With the topics in ZooKeeper: with them in the queue's state log,
    the stopped queue refuses a publish before its publisher is reached (the next test)."""
    zookeeper_store = {"delivery.state": "zookeeper"}
    cluster.start_gcm()
    cluster.start_host(**zookeeper_store)
    cluster.wait_ready()
    daemon, api = start_gateway(cluster, maxQueueSize=100, **zookeeper_store)
    assert api.v1("topic/register", owner="o", topic="t")[0] == 200
    assert api.v1("topic/subscribe", subscriber="s", topic="t")[0] == 200
    assert api.v1("message/publish", owner="o", topic="t", msg="before")[0] == 200
    cluster.cli("queue", "stop", "http-0", "--gcm", cluster.gcm, timeout_s=60).check_returncode()
    refused: list[int] = []

    def refused_now() -> bool:
        status, body = api.v1("message/publish", owner="o", topic="t", msg="while-stopped")
        refused.append(status)
        return status == 503 and "not stored" in body["error"]

    wait_for(refused_now, 60, f"a publish refused while http-0 is stopped: {refused}")
    assert api.client.get("/metrics", timeout=5).status_code == 200  # it serves on
    # the publisher waits for an exchange for limits.placement_timeout_ms, then fails for good
    wait_for(lambda: "I/O thread failed" in daemon.log_text(), 60, "the gateway's publisher failed")
    cluster.cli("queue", "start", "http-0", "--gcm", cluster.gcm, timeout_s=60).check_returncode()
    wait_for(lambda: api.v1("message/publish", owner="o", topic="t", msg="after")[0] == 200, 60,
             f"a publish once http-0 runs again\n{cluster.logs()}")  # fmt: skip
    assert "replacing it" in daemon.log_text()
    replaced = re.search(r"^roq_http_publishers_replaced_total (\S+)$",
                         api.client.get("/metrics", timeout=5).text, re.M)  # fmt: skip
    assert replaced is not None and float(replaced.group(1)) >= 1
    # what the stopped queue refused was never stored: read as evicted, between the two
    read: list[str] = []
    while "after" not in read and len(read) < 100:
        got = api.v1("message/get", subscriber="s", topic="t")[1]
        read.append(got.get("msg", got.get("error", "")))
        assert api.v1("message/ack", subscriber="s", topic="t", msgIdx=got["msgIdx"])[0] == 200
    assert read[0] == "before" and read[-1] == "after", read
    assert set(read[1:-1]) <= {"message evicted"}, read


def test_topics_in_the_state_log_answer_503_while_their_queue_is_stopped_and_resume_after(
    cluster: LocalCluster,
) -> None:
    """The topics' state is in the state log of http-0's monitor: stopped with its queue, every
    call on a topic answers 503 naming the queue (within the gateway's bound, 10 s), the gateway
    serves on; started again, the state is where it was: the head, the subscriber's position,
    the messages."""
    cluster.start_gcm()
    cluster.start_host()
    cluster.wait_ready()
    _, api = start_gateway(cluster)
    assert api.v1("topic/register", owner="o", topic="t")[0] == 200
    assert api.v1("topic/subscribe", subscriber="s", topic="t")[0] == 200
    for n in range(3):
        assert api.v1("message/publish", owner="o", topic="t", msg=f"m{n}")[1] == {"msgIdx": n + 1}
    assert api.v1("message/ack", subscriber="s", topic="t", msgIdx=1)[0] == 200
    cluster.cli("queue", "stop", "http-0", "--gcm", cluster.gcm, timeout_s=60).check_returncode()
    started = time.monotonic()
    status, body = api.v1("message/publish", owner="o", topic="t", msg="while-stopped")
    assert (status, "http-0" in body["error"]) == (503, True), body
    assert time.monotonic() - started < limits.http_monitor_wait_s + 5
    assert api.v1("message/get", subscriber="s", topic="t")[0] == 503
    assert api.client.get("/metrics", timeout=5).status_code == 200  # it serves on
    cluster.cli("queue", "start", "http-0", "--gcm", cluster.gcm, timeout_s=60).check_returncode()
    wait_for(lambda: api.v1("message/get", subscriber="s", topic="t")[0] == 200, 60,
             f"a get once http-0 runs again\n{cluster.logs()}")  # fmt: skip
    assert api.v1("message/get", subscriber="s", topic="t")[1] == {"msgIdx": 2, "msg": "m1"}
    # A stop longer than the publisher's wait for an exchange (30 s: loaded machines) fails the
    # gateway's publisher: the first publish replaces it and answers 503, its index unused.
    answers: list[dict[str, Any]] = []

    def stored() -> bool:
        status, body = api.v1("message/publish", owner="o", topic="t", msg="m3")
        answers.append(body)
        return status == 200

    wait_for(stored, 30, f"a publish once http-0 runs again: {answers}\n{cluster.logs()}")
    assert answers[-1]["msgIdx"] == 3 + len(answers)  # the head was kept: 4, or 5 after a 503


def _zxid(zk: Any, cluster: LocalCluster, name: str) -> int:
    """ZooKeeper's transaction id now: the creation zxid of a probe znode made for it."""
    path = f"{cluster.namespace}/probe-{name}"
    zk.create(path, b"")
    return int(zk.exists(path).czxid)


def _settled(cluster: LocalCluster, queue: str) -> bool:
    """The queue's monitor copies its state log in sync and the copies floor's scale-out is done
    (replicationFactor 2: its second exchange joined)."""
    with cluster.admin() as admin:
        record = next(q for q in admin.list_queues() if q.name == queue)
    status = monitor_status(record.monitor_host)
    if status is None or status.state is None or status.state.in_sync < 2:
        return False
    return len(status.exchanges) >= 2 and not status.scaling.in_flight


def _quiet(zk: Any, cluster: LocalCluster, name: str) -> bool:
    """No ZooKeeper transaction but the probes' own over half a second."""
    first = _zxid(zk, cluster, f"{name}-1")
    time.sleep(0.5)  # the window observed
    return _zxid(zk, cluster, f"{name}-2") - first == 1


def test_topics_on_the_state_log_write_nothing_to_zookeeper_and_outlive_their_monitor(
    cluster: LocalCluster,
) -> None:
    """Issue 29's structural check for the gateway: 100 publishes, 100 gets and 100 acks move
    ZooKeeper's zxid by less than 1 % of the calls (with the ZooKeeper store: one transaction
    per publish and per ack), and no topic znode exists. Then the monitor of http-0 is killed
    (kill -9): started again by its host, it reads its state log back, and the head, the
    position and the registration are what the gateway was told."""
    copies = {"replicationFactor": 2}  # the state log's copy: an exchange of the other host
    cluster.start_gcm()
    cluster.start_host("h1", **copies)
    cluster.start_host("h2", **copies)
    cluster.wait_ready(hosts=2)
    _, api = start_gateway(cluster)
    assert api.v1("topic/register", owner="o", topic="t")[0] == 200
    assert api.v1("topic/subscribe", subscriber="s", topic="t")[0] == 200
    # (in CI the scale-out's 4 transactions once fell inside the measure)
    wait_for(lambda: _settled(cluster, "http-0"), 60, f"http-0 settled\n{cluster.logs()}")
    calls = 300
    zk = session.connect(cluster.zk, 4000, auth=cluster.zk_auth)
    try:
        probes = iter(range(1000))
        wait_for(lambda: _quiet(zk, cluster, f"quiet{next(probes)}"), 30, "ZooKeeper quiet")
        before = _zxid(zk, cluster, "before")
        for n in range(calls // 3):
            assert api.v1("message/publish", owner="o", topic="t", msg=f"m{n}")[0] == 200
            assert api.v1("message/get", subscriber="s", topic="t")[1]["msg"] == f"m{n}"
            assert api.v1("message/ack", subscriber="s", topic="t", msgIdx=n + 1)[0] == 200
        after = _zxid(zk, cluster, "after")
        assert after - before - 1 < calls / 100, f"{after - before - 1} ZooKeeper transactions"
        topics = f"{cluster.namespace}/http/topics"
        assert not zk.exists(topics) or not zk.get_children(topics)
    finally:
        session.close(zk)

    def monitors() -> list[int]:
        return processes_with("monitor http-0 --bind", str(cluster.tmp))

    [monitor] = monitors()
    os.kill(monitor, signal.SIGKILL)
    wait_for(lambda: monitors() not in ([], [monitor]), 30, "the monitor of http-0 again")
    wait_for(lambda: api.v1("message/publish", owner="o", topic="t", msg="last")[0] == 200, 30,
             f"a publish once the monitor is back\n{cluster.logs()}")  # fmt: skip
    assert api.v1("message/get", subscriber="s", topic="t")[1] == {"msgIdx": 101, "msg": "last"}
    assert api.v1("topic/register", owner="x", topic="t")[0] == 400  # still registered


def _state_of(cluster: LocalCluster, queue: str) -> tuple[str, StateLogStatus] | None:
    """(the host of the queue's monitor, its state log) once that monitor serves (it is not
    reading a predecessor's log); None while it cannot say."""
    with cluster.admin() as admin:
        record = next(q for q in admin.list_queues() if q.name == queue)
    status = monitor_status(record.monitor_host)
    if status is None or status.state is None or status.state.recovering:
        return None
    return record.host, status.state


class _Answered:
    """What the gateways answered: each topic's owner and messages (message n at n - 1), each
    subscriber's next index. Every call through a gateway is checked against it."""

    def __init__(self, cluster: LocalCluster, owners: dict[str, str]):
        self.cluster, self.owners = cluster, owners
        self.published: dict[str, list[str]] = {topic: [] for topic in owners}
        self.following: dict[tuple[str, str], int] = {}  # (topic, subscriber) -> next index

    def register(self, api: Api) -> None:
        for topic, owner in self.owners.items():
            assert api.v1("topic/register", owner=owner, topic=topic)[0] == 200

    def publish(self, api: Api, topic: str, *messages: str) -> None:
        """Answered 200 with the topic's next index: none taken twice, none skipped."""
        call = {"msgs": list(messages)} if len(messages) > 1 else {"msg": messages[0]}
        answer = api.v2("message/publish", owner=self.owners[topic], topic=topic, **call)
        first = len(self.published[topic]) + 1
        assert answer == (200, {"msgIdx": first, "count": len(messages)}), answer
        self.published[topic] += messages

    def subscribe(self, api: Api, topic: str, subscriber: str) -> None:
        answer = api.v1("topic/subscribe", subscriber=subscriber, topic=topic)
        assert answer == (200, {"nextIdx": len(self.published[topic]) + 1}), answer
        self.following[topic, subscriber] = answer[1]["nextIdx"]

    def get(self, api: Api, topic: str, subscriber: str) -> None:
        """The subscriber's next message as acknowledged so far (231 past the head); a 503 (the
        monitor or the index not there yet) is asked again for 60 s, any other answer fails."""
        index = self.following[topic, subscriber]
        expected: tuple[int, dict[str, Any]] = (231, {"error": "no message", "msgIdx": index})
        if index <= len(self.published[topic]):
            expected = (200, {"msgIdx": index, "msg": self.published[topic][index - 1]})
        answers: list[tuple[int, dict[str, Any]]] = []

        def answered() -> bool:
            answers.append(api.v1("message/get", subscriber=subscriber, topic=topic))
            return answers[-1][0] != 503

        wait_for(answered, 60, f"{expected} from {api.port}\n{self.cluster.logs()}")
        assert answers[-1] == expected, (api.port, expected, answers[-3:], self.cluster.logs())

    def read(self, api: Api, topic: str, subscriber: str, until: int = 0) -> None:
        """Get and acknowledge the subscriber's messages up to index `until` (0: the head)."""
        until = until or len(self.published[topic])
        while (index := self.following[topic, subscriber]) <= until:
            self.get(api, topic, subscriber)
            answer = api.v1("message/ack", subscriber=subscriber, topic=topic, msgIdx=index)
            assert answer == (200, {"nextIdx": index + 1}), answer
            self.following[topic, subscriber] = index + 1

    def check(self, api: Api) -> None:
        """Every subscriber's next message; every topic registered, refused to another owner;
        an acknowledged message refused to its subscriber."""
        for topic, subscriber in self.following:
            self.get(api, topic, subscriber)
        for topic in self.owners:
            status, body = api.v1("topic/register", owner="x", topic=topic)
            assert status == 400 and "is taken" in body["error"], body
            status, body = api.v1("message/publish", owner="x", topic=topic, msg="no")
            assert status == 400 and "not the owner" in body["error"], body
        for (topic, subscriber), index in self.following.items():
            if index > 1:
                answer = api.v1("message/ack", subscriber=subscriber, topic=topic, msgIdx=index - 1)
                assert answer[0] == 400 and "is not the next" in answer[1]["error"], answer


def test_topics_on_the_state_log_outlive_the_loss_of_their_monitors_host(
    cluster: LocalCluster,
) -> None:
    """The host of http-0's monitor is killed with its children (kill -9 of its process group:
    the monitor and the exchanges on it) and stays gone. The GCM re-places the monitor on the
    other host under a new epoch, which reads the state log's copy kept by that host's exchange
    before it serves. Through the gateway, as answered before the loss: every topic registered
    with its owner; every head (a publish takes the next index, none is used twice); every
    subscriber's position (a get gives its next unacknowledged message, an acknowledged one
    never comes again); and every message answered 200 before the loss is read, also through
    a gateway started after it (its index rebuilt from the logs, the lost exchange's from its
    copy). `http.acks=all`: a 200 to a publish then means the messages are on the other host
    too (with `leader`, the loss of the exchange's host may lose what it had not copied yet)."""
    cluster.start_gcm(**{"host.loss.grace": 500})
    # room on the survivor for the re-placed monitor and the lost exchange's replacement
    room = {"replicationFactor": 2, "exchange.max.perhost": 4}
    hosts = {name: cluster.start_host(name, **room) for name in ("h1", "h2")}
    cluster.wait_ready(hosts=2)
    gateway: dict[str, Any] = {"maxQueueSize": 100, "maxTopics": 5, "http.acks": "all"}
    _, api = start_gateway(cluster, **gateway)
    wait_for(lambda: _settled(cluster, "http-0"), 60, f"http-0 settled\n{cluster.logs()}")
    lost, before = wait_for(lambda: _state_of(cluster, "http-0"), 30, "http-0's state log")
    survivor = "h2" if lost == "h1" else "h1"
    assert before.copies and all(c.startswith(f"{survivor}-") for c in before.copies), before
    answered = _Answered(cluster, {"t0": "o0", "t1": "o1", "t2": "o2", "empty": "oe"})
    answered.register(api)
    for topic in answered.owners:
        answered.subscribe(api, topic, "a")
    for topic in ("t0", "t1", "t2"):
        answered.subscribe(api, topic, "b")
    for n in range(1, 6):
        answered.publish(api, "t0", f"t0-{n}")
    answered.publish(api, "t1", "t1-1", "t1-2", "t1-3")
    answered.subscribe(api, "t1", "c")  # from index 4
    answered.publish(api, "t1", "t1-4", "t1-5", "t1-6", "t1-7")
    answered.publish(api, "t2", "t2-1")
    answered.read(api, "t0", "a", 3)
    answered.read(api, "t1", "a")  # all of them
    answered.read(api, "t1", "c", 4)
    assert answered.following == {("t0", "a"): 4, ("t0", "b"): 1, ("t1", "a"): 8,
                                   ("t1", "b"): 1, ("t1", "c"): 5, ("t2", "a"): 1,
                                   ("t2", "b"): 1, ("empty", "a"): 1}  # fmt: skip

    # each 200 was sent once its write was on both copies: the host is killed at once
    cluster.kill(hosts[lost])  # its process group: the monitor and the exchanges die with it
    killed = time.monotonic()
    wait_for(lambda: not cluster.queue_processes("http-0", host=lost), 10,
             f"http-0's processes on {lost} gone")  # fmt: skip

    def re_placed() -> StateLogStatus | None:
        found = _state_of(cluster, "http-0")
        if found is None or found[0] != survivor or found[1].leader_id == before.leader_id:
            return None
        return found[1]

    after = wait_for(re_placed, 60, f"http-0's monitor re-placed on {survivor}\n{cluster.logs()}")
    assert after.records >= 13, after  # the count, 4 topics, 8 positions: read before serving
    answered.check(api)  # its first gets wait for the gateway to find the re-placed monitor
    served_s = time.monotonic() - killed
    _, fresh = start_gateway(cluster, **gateway)  # its index read from the logs after the loss
    answered.check(fresh)
    assert _read_from_logs(fresh) >= 13  # all, from the logs (a new port: no snapshot of its own)
    # publishes go on at the next index, through either gateway
    answered.publish(api, "t0", "t0-6")
    answered.publish(fresh, "t0", "t0-7")
    answered.publish(fresh, "t1", "t1-8", "t1-9")
    answered.publish(api, "t2", "t2-2")
    answered.publish(fresh, "empty", "empty-1")
    # every subscriber reads on from where it acknowledged, to the end, through both gateways
    for n, (topic, subscriber) in enumerate(sorted(answered.following)):
        answered.read((api, fresh)[n % 2], topic, subscriber)
        answered.get((fresh, api)[n % 2], topic, subscriber)  # 231: nothing more
    # the count of topics too: maxTopics 5, 4 registered before the loss
    assert fresh.v1("topic/register", owner="o", topic="t4")[0] == 200
    status, body = api.v1("topic/register", owner="o", topic="t5")
    assert status == 400 and "too many topics" in body["error"], body
    print(f"served {served_s:.1f} s after the kill")  # with -s


def test_topics_kept_in_zookeeper_move_into_the_state_log_when_a_gateway_starts_on_it(
    cluster: LocalCluster,
) -> None:
    """Migration: a gateway that kept its topics in ZooKeeper (`delivery.state=zookeeper`, as
    every gateway did before 26 Nov) is replaced by one on the state log: the topics, owners,
    heads and positions are imported, the znodes deleted, and the subscriber goes on where it
    was; a second start imports nothing again."""
    cluster.start_gcm()
    cluster.start_host()
    cluster.wait_ready()
    old, api = start_gateway(cluster, **{"delivery.state": "zookeeper"})
    for topic in ("t", "u"):
        assert api.v1("topic/register", owner="o", topic=topic)[0] == 200
        assert api.v1("topic/subscribe", subscriber="s", topic=topic)[0] == 200
    for n in range(3):
        assert api.v1("message/publish", owner="o", topic="t", msg=f"m{n}")[0] == 200
    assert api.v1("message/ack", subscriber="s", topic="t", msgIdx=1)[0] == 200
    port = int(api.base.rsplit(":", 1)[1])
    cluster.kill(old)
    new, api = start_gateway(cluster, port=port)
    assert "moved 2 topics from ZooKeeper" in new.log_text()
    assert api.v1("message/get", subscriber="s", topic="t")[1] == {"msgIdx": 2, "msg": "m1"}
    assert api.v1("message/publish", owner="o", topic="t", msg="m3")[1] == {"msgIdx": 4}
    assert api.v1("message/publish", owner="x", topic="u", msg="no")[0] == 400  # its owner kept
    assert api.v1("message/get", subscriber="s", topic="u")[0] == 231  # subscribed, nothing yet
    zk = session.connect(cluster.zk, 4000, auth=cluster.zk_auth)
    try:
        assert zk.get_children(f"{cluster.namespace}/http/topics") == []
    finally:
        session.close(zk)
    cluster.kill(new)
    again, api = start_gateway(cluster, port=port)
    assert again.log_text().count("topics from ZooKeeper") == 1  # the first start's (one log)
    assert api.v1("message/get", subscriber="s", topic="t")[1] == {"msgIdx": 2, "msg": "m1"}


def test_roq_up_serves_the_gateway(tmp_path: Path, port_blocks: PortBlocks) -> None:
    """`roq up` starts `roq http` once its host is up; SIGTERM stops all of it with exit 0."""
    http_port = port_blocks.take(1)
    values = {
        "zk.servers": f"127.0.0.1:{port_blocks.take(1)}",  # free: `roq up` starts its ZooKeeper
        "ports.base": port_blocks.take(6),
        "hcm.port": port_blocks.take(1),
        "http.port": http_port,
        "monitor.base.port": port_blocks.take(60),
        "statmonitor.base.port": port_blocks.take(20),
        "exchange.base.port": port_blocks.take(40),
        "ports.max.perkind": 10,
    }
    args = ["up", "--data-dir", str(tmp_path / "data")]
    for key, value in values.items():
        args += ["-D", f"{key}={value}"]
    log_path = tmp_path / "up.log"
    with log_path.open("wb") as log_file:
        process = subprocess.Popen(roq_command(*args), env=child_environment(),
                                   stdout=log_file, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # fmt: skip
    try:
        admin = tmp_path / "data" / "security" / "admin.json"
        wait_for(admin.exists, 30, "roq up wrote its credentials")
        api = Api(http_port, json.loads(admin.read_text())["token"])

        def serving() -> bool:
            assert process.poll() is None, log_path.read_text()
            return api.client.get("/metrics", timeout=2).status_code == 200

        wait_for(serving, 90, "roq up's gateway", interval_s=0.3)
        assert f"http://127.0.0.1:{http_port}" in log_path.read_text()  # the banner says where
        assert api.v1("topic/register", owner="a", topic="t")[0] == 200
        assert api.v1("topic/subscribe", subscriber="s", topic="t")[0] == 200
        assert api.v1("message/publish", owner="a", topic="t", msg="hi")[0] == 200
        assert api.v1("message/get", subscriber="s", topic="t")[1] == {"msgIdx": 1, "msg": "hi"}
        process.terminate()
        assert process.wait(60) == 0, log_path.read_text()[-3000:]
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(10)


def test_with_security_off_no_token_is_asked_and_that_is_logged(
    tmp_path: Path, zookeeper: str, port_blocks: PortBlocks, monkeypatch: pytest.MonkeyPatch
) -> None:
    # LocalCluster(secure=False) makes this process and its `roq` commands talk without
    # security: monkeypatch puts the environment back afterwards, reset() the process's state
    for name in ("ROQ_SECURITY", "ROQ_CREDENTIALS"):
        monkeypatch.setenv(name, os.environ.get(name, ""))
    cluster = LocalCluster(tmp_path, zookeeper, port_blocks, secure=False)
    try:
        cluster.start_gcm()
        cluster.start_host()
        cluster.wait_ready()
        daemon, api = start_gateway(cluster)  # cluster.token is "": no Authorization header
        assert "Authorization" not in api.client.headers
        assert api.v2("topic/register", owner="o", topic="open")[0] == 200
        assert api.client.get("/metrics").status_code == 200
        assert "SECURITY IS OFF: no bearer token is asked" in daemon.log_text()
    finally:
        cluster.stop()
        security_reset()
