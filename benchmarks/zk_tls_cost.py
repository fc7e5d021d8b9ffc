"""The cost of ZooKeeper TLS (issue 31, finding 1): the same ZooKeeper work over TLS and over plain
TCP, interleaved round by round (tls, plain, plain, tls, ...), so both see the same machine.

Two ZooKeepers of this tree's `local/zkserver.py` (`roq up`'s), one serving TLS only with the
certificates of a cluster generated here, one plain; every session is roq's own
(`coordination/session.py`), with the cluster's digest credential. Per round and side:
- session: the time to open a session (TCP, the TLS handshake, the session, the credential),
  median of --sessions;
- principal admin ops/s: what `roq keys grant` and `roq keys revoke` do, a compare-and-set of
  a principal's record (`PrincipalStore.update`: a read and a versioned write), for --seconds;
- znode ops/s: a create, a read, a write and a delete of a 200 B znode with the cluster's ACL
  (the GCM's and host's kind of request), for --seconds.
With --queues, also `roq queue create` + `roq queue delete` through the admin API of a `roq up`
cluster per side (its GCM writes ZooKeeper; the host starts and stops the queue's processes).

    python benchmarks/zk_tls_cost.py --rounds 6 --out benchmarks/results/zk-tls.jsonl [--queues]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TREE = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(TREE / "appliance"))

from roq.coordination import session  # noqa: E402
from roq.coordination.principals import PrincipalStore  # noqa: E402
from roq.local.zkserver import ZooKeeperServer  # noqa: E402
from roq.protocol.principals import Permission, Principal  # noqa: E402
from roq.transport import security  # noqa: E402


def session_ms(servers: str, auth: str, tls: Any, count: int) -> float:
    times = []
    for _ in range(count):
        start = time.perf_counter()
        client = session.connect(servers, 10_000, auth=auth, tls=tls)
        client.exists("/")  # the session answers
        times.append((time.perf_counter() - start) * 1000)
        session.close(client)
    return statistics.median(times)


def principal_ops(client: Any, namespace: str, seconds: float) -> float:
    store = PrincipalStore(client, namespace)
    name = f"bench{os.getpid()}"
    store.put(Principal(name, security.KeyPair.new().public))
    grants = [{"q": frozenset({Permission.PUBLISH})}, {}]  # a grant, then its revocation
    done, end = 0, time.monotonic() + seconds
    while time.monotonic() < end:
        grant = grants[done % 2]
        store.update(name, lambda p, grant=grant: Principal(p.name, p.key, grant))
        done += 1
    store.remove(name)
    return done / seconds


def znode_ops(client: Any, namespace: str, seconds: float) -> float:
    client.ensure_path(f"{namespace}/bench")
    data, done, end = b"x" * 200, 0, time.monotonic() + seconds
    while time.monotonic() < end:
        path = f"{namespace}/bench/n{done}"
        client.create(path, data)
        client.get(path)
        client.set(path, data)
        client.delete(path)
        done += 4
    return done / seconds


def queue_ops(gcm: str, credentials: Path, seconds: float) -> float:
    """Queue creates and deletes through the admin API, as the cluster's admin (in this
    process: no interpreter start per operation)."""
    from roq.client.admin import AdminClient

    security.reset()
    security.use(security.load_credentials(credentials))
    done, start = 0, time.monotonic()
    with AdminClient(gcm=gcm, timeout_ms=30_000) as admin:
        while time.monotonic() < start + seconds:
            admin.create_queue(f"zq{done}")
            admin.delete_queue(f"zq{done}")
            done += 2
    return done / (time.monotonic() - start)


def round_of(side: str, servers: str, secrets: Any, args: argparse.Namespace) -> dict[str, Any]:
    tls = secrets.zk_tls if side == "tls" else None
    namespace = f"/zk-tls-bench-{os.getpid()}"
    client = session.connect(servers, 10_000, auth=secrets.zk_auth, tls=tls)
    try:
        client.ensure_path(namespace)
        return {
            "side": side,
            "session_ms": round(session_ms(servers, secrets.zk_auth, tls, args.sessions), 2),
            "principal_ops_s": round(principal_ops(client, namespace, args.seconds), 1),
            "znode_ops_s": round(znode_ops(client, namespace, args.seconds), 1),
        }
    finally:
        client.delete(namespace, recursive=True)
        session.close(client)


def run(args: argparse.Namespace) -> None:
    work = Path(tempfile.mkdtemp(prefix="zk-tls-bench-"))
    secrets = security.generate(work / "security")
    servers = {
        "tls": ZooKeeperServer(work / "zk-tls", args.port, tls=secrets.zk_tls),
        "plain": ZooKeeperServer(work / "zk-plain", args.port + 1),
    }
    clusters = start_clusters(args, work) if args.queues else {}
    try:
        for server in servers.values():
            server.start()
        with Path(args.out).open("a") as out:
            for n in range(args.rounds):
                for side in ("tls", "plain") if n % 2 == 0 else ("plain", "tls"):
                    result = round_of(side, servers[side].connect_string, secrets, args)
                    if side in clusters:
                        cluster, gcm = clusters[side]
                        credentials = cluster.data / "security" / security.ADMIN_FILE
                        result["queue_ops_s"] = round(queue_ops(gcm, credentials, args.seconds), 2)
                    result["round"] = n
                    out.write(json.dumps(result) + "\n")
                    out.flush()
                    print(json.dumps(result), flush=True)
    finally:
        for cluster in clusters.values():
            cluster[0].stop()
        for server in servers.values():
            server.stop()


def start_clusters(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """A `roq up` per side (its own ZooKeeper, TLS or plain), each with its own keys."""
    from upcluster import UpCluster

    clusters = {}
    for offset, side in ((0, "tls"), (2000, "plain")):
        base = args.queue_base + offset
        defines = [f"zk.tls={'true' if side == 'tls' else 'false'}", "http.enabled=false",
                   f"zk.servers=127.0.0.1:{base + 90}"]  # its own ZooKeeper  # fmt: skip
        cluster = UpCluster.start(TREE, base, f"zk-tls-{side}", defines)
        clusters[side] = (cluster, f"127.0.0.1:{base}")
    return clusters


def summarize(path: str) -> None:
    rows = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    for metric in ("session_ms", "principal_ops_s", "znode_ops_s", "queue_ops_s"):
        sides = {s: [r[metric] for r in rows if r["side"] == s and metric in r]
                 for s in ("tls", "plain")}  # fmt: skip
        if not all(sides.values()):
            continue
        medians = {s: statistics.median(v) for s, v in sides.items()}
        print(f"{metric}: tls {medians['tls']} (n={len(sides['tls'])}), plain {medians['plain']}"
              f" (n={len(sides['plain'])}), tls/plain {medians['tls'] / medians['plain']:.3f}; "
              f"tls {sorted(sides['tls'])}, plain {sorted(sides['plain'])}")  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--port", type=int, default=42181)
    parser.add_argument("--queues", action="store_true")
    parser.add_argument("--queue-base", type=int, default=43000)
    parser.add_argument("--out", default="benchmarks/results/zk-tls.jsonl")
    parser.add_argument("--summarize", metavar="JSONL")
    args = parser.parse_args()
    if args.summarize:
        summarize(args.summarize)
    else:
        run(args)


if __name__ == "__main__":
    main()
