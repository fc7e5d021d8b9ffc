"""`roq bench`: RoQ's load description (reference §6) run against a live queue.

The bench runs every publisher and subscriber as its own `roq bench-worker` process (so they do
not share one interpreter lock, and it works the same from the frozen executable). Workers write
one JSON line per second (progress) and a final one (totals, latency samples) on stdout; the
driver prints progress and ends with one JSON summary line.

Load description fields (all optional; RoQ's names): delay (s), duration (minutes), maxPub,
maxSub, payload (bytes), rate (msg/s per publisher, 0 = as fast as possible), spawnRate
(publishers started per second), throughput (when rate is 0: msg/s the subscribers receive in
all, so rate = throughput / (maxPub × maxSub), as RoQ's loader). roq adds: seconds
(duration in seconds, wins over duration), linger_ms, batch_bytes, key, acks, headers (each message
carries that many headers, `h0`, `h1`, ..., of header_bytes bytes of value each: log format v2).

Batched (linger_ms > 0) publishers hand messages over with `send_many`, 1,000 per call (or one
millisecond's worth at a set rate). Unbatched (linger_ms = 0) publishers call `send` once per
message, as an application without messages at hand does; the publisher then still sends what
arrived while it was busy as one batch (`client/publisher.py`), unless batch_bytes = 1 makes
every message its own frame. The summary's `records_per_batch` says which happened.
"""

from __future__ import annotations

import functools
import json
import logging
import random
import statistics
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, fields
from typing import Any

from roq import limits
from roq.errors import ConfigError
from roq.system.spawn import child_environment, roq_command


@dataclass
class LoadDescription:
    delay: float = 0.0
    duration: float = 0.0  # minutes (RoQ)
    seconds: float = 10.0
    maxPub: int = 1
    maxSub: int = 1
    payload: int = 100
    rate: int = 0
    spawnRate: int = 10
    throughput: int = 0
    linger_ms: float = limits.publisher_linger_ms_default
    batch_bytes: int = limits.publisher_batch_bytes_default
    key: str = "test"
    acks: str = "none"
    headers: int = 0
    header_bytes: int = 32

    @classmethod
    def from_json(cls, text: str, where: str) -> LoadDescription:
        try:
            raw = json.loads(text)
        except json.JSONDecodeError as error:
            raise ConfigError(f"{where}: not JSON: {error}") from None
        if not isinstance(raw, dict):
            raise ConfigError(f"{where}: expected a JSON object")
        known = {f.name: f for f in fields(cls)}
        values: dict[str, Any] = {}
        for name, value in raw.items():
            if name not in known:
                raise ConfigError(f"{where}: unknown field {name!r} (known: {', '.join(known)})")
            kind = float if known[name].type in ("float", float) else type(cls.__dict__[name])
            if not isinstance(value, (int, float, str)) or isinstance(value, bool):
                raise ConfigError(f"{where}: field {name!r} has value {value!r}")
            try:
                values[name] = kind(value)
            except ValueError:
                raise ConfigError(f"{where}: field {name!r} has value {value!r}") from None
        description = cls(**values)
        if "duration" in raw and "seconds" not in raw:
            description.seconds = description.duration * 60
        return description.checked(where)

    def checked(self, where: str = "load description") -> LoadDescription:
        if self.maxPub < 1 or self.maxSub < 0 or self.payload < 12 or self.seconds <= 0:
            raise ConfigError(f"{where}: need maxPub ≥ 1, maxSub ≥ 0, payload ≥ 12, seconds > 0")
        if not 0 <= self.headers <= limits.record_headers_max or (
            self.headers * (self.header_bytes + 3) > limits.record_headers_bytes_max
            or self.header_bytes < 0
        ):
            raise ConfigError(f"{where}: need 0 ≤ headers ≤ {limits.record_headers_max} and "
                              f"their bytes within {limits.record_headers_bytes_max}")  # fmt: skip
        if self.rate == 0 and self.throughput:
            # RoQ's TestLoaderDecription: throughput is what the subscribers receive in all,
            # rate = throughput / (maxPub × maxSub) (maxSub 0: as if 1)
            self.rate = max(1, self.throughput // (self.maxPub * max(1, self.maxSub)))
        return self


@dataclass
class WorkerResult:
    role: str
    lines: list[dict[str, Any]] = field(default_factory=list)
    final: dict[str, Any] = field(default_factory=dict)


class Worker:
    """One `roq bench-worker` process and a thread reading its JSON lines."""

    def __init__(self, role: str, args: list[str]):
        self.result = WorkerResult(role)
        self.ready = threading.Event()
        self.process = subprocess.Popen(
            roq_command("bench-worker", role, *args),
            env=child_environment(),
            # a subscriber learns on its stdin how many messages were published (`tell`)
            stdin=subprocess.PIPE if role == "sub" else subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            text=True,
        )
        self._reader = threading.Thread(target=self._read, name=f"roq-bench-{role}", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                continue
            kind = doc.get("type")
            if kind == "ready":
                self.ready.set()
            elif kind == "progress":
                self.result.lines.append(doc)
            elif kind == "done":
                self.result.final = doc
        self.ready.set()

    def tell(self, doc: dict[str, Any]) -> None:
        """One JSON line to the worker's stdin, which is then closed (a worker already gone
        does not need it)."""
        if self.process.stdin is None:
            return
        try:
            self.process.stdin.write(json.dumps(doc) + "\n")
            self.process.stdin.close()
        except (BrokenPipeError, OSError):
            pass

    def wait(self, timeout_s: float) -> None:
        try:
            self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait(timeout=5)
        self._reader.join(5)


def run(
    description: LoadDescription,
    queue: str,
    client_args: list[str],
    progress: Callable[[str], None],
) -> dict[str, Any]:
    """Run the load and return the summary (see `summarize`). Interrupted (KeyboardInterrupt:
    Ctrl-C or SIGTERM in `roq bench`) or failed, it ends every worker it started before it
    raises: none goes on loading the queue after the bench is gone."""
    common = [queue, *client_args, "--load", json.dumps(asdict(description))]
    subscribers: list[Worker] = []
    publishers: list[Worker] = []
    try:
        for _ in range(description.maxSub):
            subscribers.append(Worker("sub", common))
        for worker in subscribers:
            if (
                not worker.ready.wait(limits.bench_ready_timeout_s)
                or worker.process.poll() is not None
            ):
                raise ConfigError(
                    f"a bench subscriber did not start (exit {worker.process.poll()})"
                )
        time.sleep(description.delay)
        for worker in _spawn_publishers(description, common):
            publishers.append(worker)
        started = time.monotonic()
        _report_progress(description, publishers, subscribers, started, progress)
        for worker in publishers:
            worker.wait(description.seconds + limits.bench_publishers_grace_s)
        # each subscriber reads until it has every message published (or its drain bound):
        # what it lacks at the end is then lost, not merely behind
        published = sum(w.result.final.get("messages", 0) for w in publishers)
        for worker in subscribers:
            worker.tell({"type": "published", "messages": published})
        for worker in subscribers:
            worker.wait(limits.bench_drain_max_s + 10)
    except BaseException:
        _end_all(publishers + subscribers)
        raise
    return summarize(description, publishers, subscribers)


def _end_all(workers: list[Worker]) -> None:
    """SIGTERM to every worker still running (they stop at once), SIGKILL past the grace."""
    running = [w.process for w in workers if w.process.poll() is None]
    for process in running:
        process.terminate()
    deadline = time.monotonic() + limits.bench_stop_grace_s
    for process in running:
        try:
            process.wait(max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _spawn_publishers(description: LoadDescription, common: list[str]) -> Iterator[Worker]:
    for index in range(description.maxPub):
        if index and index % description.spawnRate == 0:
            time.sleep(1.0)
        yield Worker("pub", common)


def _report_progress(
    description: LoadDescription,
    publishers: list[Worker],
    subscribers: list[Worker],
    started: float,
    progress: Callable[[str], None],
) -> None:
    while any(w.process.poll() is None for w in publishers):
        time.sleep(1.0)
        elapsed = time.monotonic() - started
        sent = sum(w.result.lines[-1]["rate"] for w in publishers if w.result.lines)
        got = sum(w.result.lines[-1]["rate"] for w in subscribers if w.result.lines)
        # past the publishing time the publishers flush what they hold: say so rather than
        # count on past the total ("7.0/5 s")
        over = elapsed - description.seconds
        clock = (f"[{elapsed:5.1f}/{description.seconds:.0f} s]" if over <= 0
                 else f"[{description.seconds:.0f}/{description.seconds:.0f} s, flushing "
                      f"for {over:.1f} s]")  # fmt: skip
        progress(f"{clock} published {sent:,.0f} msg/s, delivered {got:,.0f} msg/s")


def summarize(
    description: LoadDescription, publishers: list[Worker], subscribers: list[Worker]
) -> dict[str, Any]:
    pub_final = [w.result.final for w in publishers]
    sub_final = [w.result.final for w in subscribers]
    failed = [
        w.result.role
        for w in publishers + subscribers
        if not w.result.final or w.result.final.get("error")
    ]
    published = sum(f.get("messages", 0) for f in pub_final)
    batches = sum(f.get("batches", 0) for f in pub_final)
    pub_seconds = max((f.get("seconds", 0.0) for f in pub_final), default=0.0) or 1e-9
    delivered = sum(f.get("messages", 0) for f in sub_final)
    sub_seconds = max((f.get("seconds", 0.0) for f in sub_final), default=0.0) or 1e-9
    latencies = sorted(x for f in sub_final for x in f.get("latency_ms", []))
    mb = description.payload / 1e6
    return {
        "publishers": description.maxPub,
        "subscribers": description.maxSub,
        "payload": description.payload,
        "linger_ms": description.linger_ms,
        "batch_bytes": description.batch_bytes,
        "seconds": description.seconds,
        "published": published,
        "published_msg_s": round(published / pub_seconds),
        "published_MB_s": round(published / pub_seconds * mb, 2),
        "records_per_batch": round(published / max(1, batches), 1),
        "delivered": delivered,
        "delivered_msg_s": round(delivered / sub_seconds),
        "delivered_MB_s": round(delivered / sub_seconds * mb, 2),
        "latency_ms": {
            "p50": _percentile(latencies, 0.50),
            "p99": _percentile(latencies, 0.99),
            "p99.9": _percentile(latencies, 0.999),
        },
        "lost": sum(max(0, published - f.get("messages", 0)) for f in sub_final),
        "duplicated": sum(f.get("duplicates", 0) for f in sub_final),
        # seconds from the publishers' end until the last subscriber had everything (or gave up)
        "drain_s": max((f.get("drain_s", 0.0) for f in sub_final), default=0.0),
        "failed_workers": failed,
        "series": {
            "published": _series(publishers),
            "delivered": _series(subscribers),
            "latency_p50_ms": _latency_series(subscribers),
        },
    }


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    return round(values[min(len(values) - 1, int(q * len(values)))], 3)


def _series(workers: list[Worker]) -> list[float]:
    per_second: dict[int, float] = {}
    for worker in workers:
        for line in worker.result.lines:
            second = int(line["t"])
            per_second[second] = per_second.get(second, 0.0) + line["rate"]
    return [per_second[s] for s in sorted(per_second)]


def _latency_series(workers: list[Worker]) -> list[float]:
    lines = [line for w in workers for line in w.result.lines if line.get("p50_ms") is not None]
    by_second: dict[int, list[float]] = {}
    for line in lines:
        by_second.setdefault(int(line["t"]), []).append(line["p50_ms"])
    return [statistics.median(by_second[s]) for s in sorted(by_second)]


def draw_chart(summary: dict[str, Any], path: str) -> None:
    """Throughput and latency over time, as a PNG (matplotlib from the `analytics` extra)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise ConfigError("--chart needs matplotlib: pip install 'roq[analytics]'") from None
    series = summary["series"]
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), sharex=True)
    top.plot(series["published"], label="published msg/s")
    top.plot(series["delivered"], label="delivered msg/s")
    top.set_ylabel("messages / s")
    top.legend()
    bottom.plot(series["latency_p50_ms"], color="tab:red", label="p50 latency")
    bottom.set_ylabel("ms")
    bottom.set_xlabel("seconds")
    bottom.legend()
    figure.suptitle(
        f"roq bench: {summary['publishers']} pub × {summary['subscribers']} sub, "
        f"{summary['payload']} B, linger {summary['linger_ms']} ms"
    )
    figure.savefig(path, dpi=100)
    plt.close(figure)


def sample(values: list[float], limit: int = limits.bench_latency_samples_max) -> list[float]:
    return values if len(values) <= limit else random.sample(values, limit)


# --- the worker processes ---------------------------------------------------------------------
def _emit(doc: dict[str, Any]) -> None:
    print(json.dumps(doc), flush=True)  # noqa: T201 — the worker's stdout is its protocol


def publisher_worker(description: LoadDescription, queue: str, client: dict[str, Any]) -> None:
    from roq.client.publisher import Publisher, PublishError

    payload = (b"%012d" % 0) + b"x" * (description.payload - 12)
    key = description.key.encode()
    publisher = Publisher(
        queue,
        linger_ms=description.linger_ms,
        batch_bytes=description.batch_bytes,
        acks=description.acks,
        **client,
    )
    _emit({"type": "ready"})
    sent, started, failed = 0, time.monotonic(), None
    end = started + description.seconds
    next_tick, last_sent = started + 1.0, 0
    # headers: with send_many one set per call (encoded once), with send() encoded per message
    headers = {f"h{i}": b"v" * description.header_bytes for i in range(description.headers)}
    if description.linger_ms > 0:
        chunk = max(1, min(1000, description.rate // 1000)) if description.rate else 1000
        payloads = [payload] * chunk  # one send_many per chunk: one lock and timestamp per call
        send_chunk = functools.partial(publisher.send_many, payloads, key, headers=headers)
    else:
        # A message per send(), in 1 ms ticks at a set rate (a sleep per message would cost this
        # 2-core machine more CPU than the broker: docs/benchmarks.md §2); a clock read per 100.
        chunk = max(1, min(100, description.rate // 1000)) if description.rate else 100
        send_chunk = functools.partial(_send_each, publisher, payload, key, chunk, headers)
    try:
        while (now := time.monotonic()) < end:
            if description.rate and sent >= description.rate * (now - started):
                time.sleep(min(0.001, end - now))
            else:
                send_chunk()
                sent += chunk
            if now >= next_tick:
                _emit({"type": "progress", "t": now - started, "rate": sent - last_sent})
                next_tick, last_sent = next_tick + 1.0, sent
        publisher.flush(limits.bench_flush_timeout_s)
    except PublishError as error:  # what it sent still counts: the subscribers wait for it
        failed = str(error)
    finally:
        _close_quietly(publisher, failed)
    _emit({"type": "done", "messages": sent, "seconds": time.monotonic() - started,
           "batches": publisher.sent_batches, "error": failed})  # fmt: skip


def _close_quietly(publisher: Any, failed: str | None) -> None:
    """Close a bench publisher; a flush that failed once is not waited for again."""
    from roq.client.publisher import PublishError

    try:
        publisher.close(timeout_s=0.1 if failed else limits.bench_flush_timeout_s)
    except PublishError as error:  # its count is reported all the same
        logging.getLogger(__name__).warning("%s", error)


def _send_each(
    publisher: Any, payload: bytes, key: bytes, count: int, headers: dict[str, bytes]
) -> None:
    if not headers:
        for _ in range(count):
            publisher.send(payload, key)
        return
    for _ in range(count):
        publisher.send(payload, key, headers=headers)


def subscriber_worker(description: LoadDescription, queue: str, client: dict[str, Any]) -> None:
    from roq.client.subscriber import Subscriber

    subscriber = Subscriber(queue, description.key.encode(), **client)
    told = _Told()
    _emit({"type": "ready"})
    counter = _Counter()
    started = time.monotonic()
    end = started + description.delay + description.seconds + 2.0
    try:
        while not told.drained(counter, end, time.monotonic()):
            for delivery in subscriber.poll(50):
                counter.add(delivery)
            counter.tick(time.monotonic(), started)
    finally:
        subscriber.close()
    first = counter.first or started
    _emit(
        {
            "type": "done",
            "messages": counter.messages,
            "seconds": max(1e-9, counter.last - first),
            "duplicates": subscriber.sequencer.duplicates,
            "gaps": subscriber.sequencer.lost,
            "latency_ms": sample(counter.all_latency),
            "drain_s": round(max(0.0, counter.last - (told.at or counter.last)), 3),
        }
    )


class _Told:
    """What the driver says on the subscriber's stdin: how many messages were published in all,
    once the publishers ended. With it the subscriber reads until it has them all, or nothing
    arrived for `bench_drain_stall_s`, or `bench_drain_max_s` passed; without it (stdin closed
    first: run by hand) it stops as before, once quiet after the run's planned end."""

    def __init__(self) -> None:
        self.published: int | None = None
        self.at: float | None = None  # when it was told
        self.closed = False
        threading.Thread(target=self._read, name="roq-bench-told", daemon=True).start()

    def _read(self) -> None:
        for line in sys.stdin:
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(doc, dict) and isinstance(doc.get("messages"), int):
                self.at, self.published = time.monotonic(), doc["messages"]
        self.closed = True

    def drained(self, counter: _Counter, end: float, now: float) -> bool:
        published, at = self.published, self.at
        if published is not None and at is not None:
            quiet_since = max(counter.last, at)
            return (
                counter.messages >= published
                or now - quiet_since >= limits.bench_drain_stall_s
                or now - at >= limits.bench_drain_max_s
            )
        if self.closed:  # no driver to tell: the run's planned end and a quiet spell
            return now > end + limits.bench_drain_max_s or (
                now > end and now - counter.last >= limits.bench_drain_quiet_s
            )
        return now > end + limits.bench_publishers_grace_s + limits.bench_drain_max_s


class _Counter:
    """Counts delivered records and samples their latency (the records' send timestamps)."""

    def __init__(self) -> None:
        self.messages = 0
        self.first = 0.0
        self.last = time.monotonic()
        self.latency: list[float] = []
        self.all_latency: list[float] = []
        self._batches = 0
        self._tick = time.monotonic() + 1.0
        self._tick_count = 0

    def add(self, delivery: Any) -> None:
        from roq.client.subscriber import records

        now = time.monotonic()
        self.first = self.first or now
        self.last = now
        self.messages += delivery.header.count - delivery.skip
        self._batches += 1
        if self._batches % 16 == 1 or delivery.header.count < 8:
            now_us = time.time_ns() // 1000
            for record in records(delivery):
                self.latency.append((now_us - record.timestamp_us) / 1000)

    def tick(self, now: float, started: float) -> None:
        if now < self._tick:
            return
        ordered = sorted(self.latency)
        p50 = ordered[len(ordered) // 2] if ordered else None
        _emit({"type": "progress", "t": now - started, "rate": self.messages - self._tick_count,
               "p50_ms": p50})  # fmt: skip
        self.all_latency.extend(sample(self.latency, 2000))
        self.all_latency = sample(self.all_latency)
        self.latency = []
        self._tick_count = self.messages
        self._tick = now + 1.0
