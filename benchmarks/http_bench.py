"""The HTTP gateway against a Redis-backed model of the same API (docs/benchmarks.md, §HTTP).

    export ROQ_TOKEN=$(roq keys token)   # a secured cluster's gateway asks for a bearer token
    python benchmarks/http_bench.py --roq http://127.0.0.1:8080 --roq-pid PID --redis-port 6399 \
        [--roq-zk http://127.0.0.1:8081 --roq-zk-pid PID2] [--cpu-pid NAME=PID ...]

Each run: publish rate and get+ack rate over HTTP/1.1 keep-alive with 1 and 8 concurrent
clients (each on its own topic), 100 B messages, p50/p99 of a publish, roq and the model
interleaved (round by round, so both see the same machine), and the CPU each gateway process
(and each `--cpu-pid`, e.g. the monitor of http-0 and ZooKeeper) spent per request; with
`--roq-zk`, a second gateway of the same cluster keeping its topics in ZooKeeper
(`delivery.state=zookeeper`) in the same rounds; then memory of the gateway process
(and of ZooKeeper, `--zk-pid`) after 10,000 topics with one subscriber each (10,000
subscribers); then, with `--zk`, the ack rate ZooKeeper positions allow: TopicStore.ack called
directly (no HTTP), from 1 and 8 threads, each on its own subscriber. The Redis
model is what the mq seed's data structure section says, served by the same kind of server
(Starlette on uvicorn, in this process's child) so only the storage differs: LPUSH/LTRIM per
publish, HSET of the subscriber's next index, LINDEX for a get, no durability promise past
Redis's own.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import statistics
import threading
import time
from pathlib import Path
from typing import Any

import httpx

MESSAGE = "x" * 100
HEADERS: dict[str, str] = {}  # the Authorization header every client shows (--token), set once


def _client(base: str) -> httpx.Client:
    return httpx.Client(base_url=base, timeout=30, headers=HEADERS)


def _redis_app(port: int, max_queue: int) -> Any:
    import redis
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    db = redis.Redis(port=port)

    async def register(request: Request) -> JSONResponse:
        doc = await request.json()
        if not db.hsetnx(f"{doc['topic']}-topic-attr", "owner", doc["owner"]):
            return JSONResponse({"error": "taken"}, 400)
        db.hset(f"{doc['topic']}-topic-attr", mapping={"msg-head": 0, "num-subscs": 0})
        db.incr("num-topics")
        return JSONResponse({})

    async def publish(request: Request) -> JSONResponse:
        doc = await request.json()
        attr = f"{doc['topic']}-topic-attr"
        if db.hget(attr, "owner") != doc["owner"].encode():
            return JSONResponse({"error": "not the owner"}, 400)
        pipe = db.pipeline()
        pipe.lpush(f"{doc['topic']}-topic", doc["msg"])
        pipe.ltrim(f"{doc['topic']}-topic", 0, max_queue - 1)
        pipe.hincrby(attr, "msg-head", 1)
        head = pipe.execute()[2]
        return JSONResponse({"msgIdx": head})

    async def subscribe(request: Request) -> JSONResponse:
        doc = await request.json()
        head = int(db.hget(f"{doc['topic']}-topic-attr", "msg-head") or 0)
        db.hset(f"{doc['topic']}-topic-subsc", doc["subscriber"], head + 1)
        return JSONResponse({"nextIdx": head + 1})

    async def get(request: Request) -> JSONResponse:
        doc = await request.json()
        head = int(db.hget(f"{doc['topic']}-topic-attr", "msg-head") or 0)
        following = int(db.hget(f"{doc['topic']}-topic-subsc", doc["subscriber"]) or 0)
        if following > head:
            return JSONResponse({"msgIdx": following}, 231)
        message = db.lindex(f"{doc['topic']}-topic", head - following)  # newest first
        if message is None:
            return JSONResponse({"msgIdx": following}, 230)
        return JSONResponse({"msgIdx": following, "msg": message.decode()})

    async def ack(request: Request) -> JSONResponse:
        doc = await request.json()
        db.hincrby(f"{doc['topic']}-topic-subsc", doc["subscriber"], 1)
        return JSONResponse({})

    calls = {"topic/register": register, "message/publish": publish,
             "topic/subscribe": subscribe, "message/get": get, "message/ack": ack}  # fmt: skip
    return Starlette(routes=[Route(f"/v1/{p}", c, methods=["POST"]) for p, c in calls.items()])


def _serve_redis_model(http_port: int, redis_port: int) -> None:
    import uvicorn

    uvicorn.run(_redis_app(redis_port, 10_000), host="127.0.0.1", port=http_port,
                log_level="warning", http="h11", loop="asyncio")  # fmt: skip


def _client_publish(base: str, topic: str, count: int, latencies: list[float]) -> None:
    with _client(base) as client:
        for _ in range(count):
            started = time.perf_counter()
            response = client.post(
                "/v1/message/publish", json={"owner": "bench", "topic": topic, "msg": MESSAGE}
            )
            latencies.append(time.perf_counter() - started)
            assert response.status_code == 200, response.text


def _client_get_ack(base: str, topic: str, count: int) -> None:
    with _client(base) as client:
        for _ in range(count):
            body = {"subscriber": "reader", "topic": topic}
            got = client.post("/v1/message/get", json=body)
            assert got.status_code == 200, got.text
            client.post("/v1/message/ack", json={**body, "msgIdx": got.json()["msgIdx"]})


def _run(clients: int, work: Any) -> float:
    threads = [threading.Thread(target=work, args=(n,)) for n in range(clients)]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return time.perf_counter() - started


def cpu_s(pid: int) -> float:
    """The process's user + system CPU seconds so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _cpu_ms_per(pids: dict[str, int], since: dict[str, float], requests: int) -> dict[str, float]:
    return {name: round((cpu_s(pid) - since[name]) * 1000 / requests, 3)
            for name, pid in pids.items()}  # fmt: skip


def rates(
    base: str, clients: int, count: int, tag: str, pids: dict[str, int] | None = None
) -> dict[str, Any]:
    """Publish `count` messages per client, then get+ack them all; each client its own topic;
    the CPU milliseconds each of `pids` spent per publish and per get+ack (two requests)."""
    pids = pids or {}
    with _client(base) as client:
        for n in range(clients):
            topic = f"{tag}{clients}-{n}"
            client.post("/v1/topic/register", json={"owner": "bench", "topic": topic})
            client.post("/v1/topic/subscribe", json={"subscriber": "reader", "topic": topic})
    latencies: list[float] = []
    before = {name: cpu_s(pid) for name, pid in pids.items()}
    took = _run(clients, lambda n: _client_publish(base, f"{tag}{clients}-{n}", count, latencies))
    publish_cpu = _cpu_ms_per(pids, before, clients * count)
    before = {name: cpu_s(pid) for name, pid in pids.items()}
    got = _run(clients, lambda n: _client_get_ack(base, f"{tag}{clients}-{n}", count))
    get_ack_cpu = _cpu_ms_per(pids, before, clients * count)
    latencies.sort()
    return {
        "clients": clients,
        "publish_per_s": round(clients * count / took),
        "get_ack_per_s": round(clients * count / got),
        "publish_p50_ms": round(statistics.median(latencies) * 1000, 2),
        "publish_p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 2),
        "cpu_ms_per_publish": publish_cpu,
        "cpu_ms_per_get_ack": get_ack_cpu,
    }


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return round(int(line.split()[1]) / 1024, 1)
    return 0.0


def memory(base: str, pid: int, topics: int, tag: str, zk_pid: int = 0) -> dict[str, Any]:
    before, zk_before = rss_mb(pid), rss_mb(zk_pid) if zk_pid else 0.0
    started = time.perf_counter()
    with _client(base) as client:
        for n in range(topics):
            client.post("/v1/topic/register", json={"owner": "bench", "topic": f"{tag}{n}"})
            client.post("/v1/topic/subscribe", json={"subscriber": "s", "topic": f"{tag}{n}"})
            client.post("/v1/message/publish",
                        json={"owner": "bench", "topic": f"{tag}{n}", "msg": MESSAGE})  # fmt: skip
    took = round(time.perf_counter() - started)
    result = {"topics": topics, "subscribers": topics, "rss_before_mb": before,
              "rss_after_mb": rss_mb(pid), "seconds": took}  # fmt: skip
    if zk_pid:
        result |= {"zk_rss_before_mb": zk_before, "zk_rss_after_mb": rss_mb(zk_pid)}
    return result


def zk_acks(servers: str, namespace: str, threads: int, count: int, tag: str) -> dict[str, Any]:
    """What ZooKeeper positions allow: `count` acks per thread through TopicStore.ack (a read
    of the topic, a read and a compare-and-set of the subscriber's znode), no HTTP."""
    from roq.client import credentials
    from roq.coordination import session
    from roq.coordination.paths import Paths
    from roq.coordination.topics import TopicStore

    client = session.connect(servers, 10_000, auth=credentials.zk_auth(), tls=credentials.zk_tls())
    try:
        store = TopicStore(client, Paths(namespace))
        store.ensure_root()
        for n in range(threads):
            topic = f"{tag}{threads}-{n}"
            store.register(topic, "bench", 1 << 30)
            store.subscribe(topic, "reader", 10)
            store.advance_head(topic, "bench", count)

        def acks(n: int) -> None:
            for index in range(1, count + 1):
                store.ack(f"{tag}{threads}-{n}", "reader", index)

        took = _run(threads, acks)
    finally:
        session.close(client)
    return {"threads": threads, "acks_per_s": round(threads * count / took)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--roq", required=True, help="base URL of a running roq http")
    parser.add_argument("--roq-pid", type=int, required=True, help="pid of that roq http")
    parser.add_argument("--redis-port", type=int, default=6399, help="a running redis-server")
    parser.add_argument("--model-port", type=int, default=8099, help="where the model serves")
    parser.add_argument("--count", type=int, default=2000, help="messages per client")
    parser.add_argument("--topics", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=2, help="interleaved rounds of rates")
    parser.add_argument("--zk-pid", type=int, default=0, help="ZooKeeper's pid: its RSS too")
    parser.add_argument("--zk", default="", help="ZooKeeper servers: measure the ack ceiling")
    parser.add_argument("--namespace", default="/roq", help="the cluster's zk.namespace")
    parser.add_argument("--roq-zk", default="", help="a second roq http, delivery.state=zookeeper")
    parser.add_argument("--roq-zk-pid", type=int, default=0, help="pid of that roq http")
    parser.add_argument(
        "--cpu-pid",
        action="append",
        default=[],
        metavar="NAME=PID",
        help="a process whose CPU per request is reported too (repeatable)",
    )
    parser.add_argument("--token", default=os.environ.get("ROQ_TOKEN", ""),
                        help="the gateway's bearer token (default $ROQ_TOKEN)")  # fmt: skip
    args = parser.parse_args()
    if args.token:
        HEADERS["Authorization"] = f"Bearer {args.token}"
    model = multiprocessing.Process(target=_serve_redis_model,
                                    args=(args.model_port, args.redis_port),
                                    daemon=True)  # fmt: skip
    model.start()
    model_base = f"http://127.0.0.1:{args.model_port}"
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        try:
            httpx.post(f"{model_base}/v1/x", json={})
            break
        except httpx.TransportError:
            time.sleep(0.2)
    tag = f"b{os.getpid()}-"
    others = {name: int(pid) for name, pid in (item.split("=", 1) for item in args.cpu_pid)}
    systems = [("roq", args.roq, {"gateway": args.roq_pid, **others})]
    if args.roq_zk:
        systems.append(("roq_zk", args.roq_zk, {"gateway": args.roq_zk_pid, **others}))
    assert model.pid is not None
    systems.append(("redis_model", model_base, {"model": model.pid}))
    results: dict[str, Any] = {name: [] for name, _, _ in systems}
    for round_ in range(args.rounds):
        for clients in (1, 8):
            for name, base, pids in systems:  # each its own topics: two gateways share http-0
                result = rates(base, clients, args.count, f"{tag}{name}-r{round_}-", pids)
                results[name].append({"round": round_, **result})
                print(name, results[name][-1], flush=True)
    results["roq_memory"] = memory(args.roq, args.roq_pid, args.topics, f"m{tag}", args.zk_pid)
    print("roq_memory", results["roq_memory"], flush=True)
    results["redis_model_memory"] = memory(model_base, model.pid, args.topics, f"m{tag}")
    if args.zk:
        results["zk_acks"] = [
            zk_acks(args.zk, args.namespace, threads, args.count, f"z{tag}") for threads in (1, 8)
        ]
    print(json.dumps(results, indent=1))
    model.terminate()


if __name__ == "__main__":
    main()
