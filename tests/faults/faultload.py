"""The workload of a fault test, run as its own process in the root namespace (so a hung client
cannot hang pytest, and the test can kill it): producers send numbered messages on several keys
while a live subscriber reads; once the stop file appears, the producers stop and a new
subscriber reads the queue from the beginning. Every operation goes to a JSON-lines history
(see checker.py for the format).

    python faultload.py --zk A:2181,B:2181 --namespace /roq-x --queue q1 \
        --history h.jsonl --stop-file stop --acks all
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import threading
import time
from pathlib import Path
from typing import Any

from roq.client.publisher import Publisher, PublishError, PublishTimeout
from roq.client.subscriber import Subscriber
from roq.errors import RoqError

FLUSH_S = 10.0  # a flush not confirmed in this time is an `unknown` outcome
FINAL_READ_S = 45.0  # the read from the beginning stops here at the latest
FINAL_IDLE_S = 3.0  # ... or this long after the last record, once every acked one was read


class History:
    def __init__(self, path: Path):
        self._file = path.open("a", buffering=1)
        self._lock = threading.Lock()
        self.acked: set[tuple[str, int]] = set()

    def write(self, **event: Any) -> None:
        event["time"] = time.time()
        line = json.dumps(event) + "\n"
        with self._lock:
            self._file.write(line)
            if event["type"] == "ok":
                self.acked.add((event["producer"], event["seq"]))

    def close(self) -> None:
        with self._lock:
            self._file.close()


class Workload:
    def __init__(self, options: argparse.Namespace):
        self.options = options
        self.history = History(Path(options.history))
        self.stop = threading.Event()
        self.keys = [f"k{n}" for n in range(options.keys)]
        self.where = {"zk": options.zk, "namespace": options.namespace}

    # --- producers ------------------------------------------------------------------------
    def produce(self, worker: str) -> None:
        generation = 0
        while not self.stop.is_set():
            try:
                publisher = Publisher(
                    self.options.queue, acks=self.options.acks, linger_ms=0, **self.where
                )
            except (RoqError, OSError) as error:
                logging.warning("%s: no publisher yet: %s", worker, error)
                self.stop.wait(0.5)
                continue
            name, generation = f"{worker}.{generation}", generation + 1
            try:
                self._publish_until_broken(publisher, worker, name)
            finally:
                with contextlib.suppress(RoqError):
                    publisher.close(timeout_s=FLUSH_S)

    def _publish_until_broken(self, publisher: Publisher, worker: str, name: str) -> None:
        seq = 0
        while not self.stop.is_set():
            key = self.keys[seq % len(self.keys)]
            op = {"producer": name, "worker": worker, "seq": seq, "key": key}
            self.history.write(type="invoke", **op)
            refused_before = len(publisher.refused)
            try:
                publisher.send(f"{name}:{seq}".encode(), key=key.encode())
                publisher.flush(timeout_s=FLUSH_S)
                self.history.write(type="ok", **op)
            except PublishTimeout as error:
                self.history.write(type="unknown", error=str(error)[:200], **op)
            except PublishError as error:
                refused = len(publisher.refused) > refused_before
                self.history.write(type="fail" if refused else "unknown", error=str(error), **op)
                if not refused:
                    return  # the publisher is broken: the caller makes a new one
            seq += 1
            self.stop.wait(self.options.interval_ms / 1000)

    # --- readers --------------------------------------------------------------------------
    def read_live(self, joined: threading.Event) -> None:
        while not self.stop.is_set():
            try:
                subscriber = Subscriber(self.options.queue, **self.where)
            except (RoqError, OSError) as error:
                logging.warning("live reader: no subscriber yet: %s", error)
                self.stop.wait(0.5)
                continue
            joined.set()
            try:
                while not self.stop.is_set():
                    for record in subscriber.messages(timeout_s=0.5):
                        self._record_read("live", record)
            finally:
                subscriber.close()
            return

    def read_from_beginning(self) -> None:
        subscriber = Subscriber(self.options.queue, start="beginning", **self.where)
        deadline = time.monotonic() + FINAL_READ_S
        last = time.monotonic()
        seen: set[tuple[str, int]] = set()
        try:
            while time.monotonic() < deadline:
                if seen >= self.history.acked and time.monotonic() - last > FINAL_IDLE_S:
                    break
                for record in subscriber.messages(timeout_s=0.5):
                    last = time.monotonic()
                    message = self._record_read("final", record)
                    if message is not None:
                        seen.add(message)
        finally:
            _log_reader_state(subscriber)
            subscriber.close()

    def _record_read(self, reader: str, record: Any) -> tuple[str, int] | None:
        text = bytes(record.payload).decode(errors="replace")
        producer, _, seq = text.rpartition(":")
        key = bytes(record.key).decode(errors="replace")
        if not producer or not seq.isdigit():
            self.history.write(type="read", reader=reader, raw=text, key=key)
            return None
        self.history.write(type="read", reader=reader, producer=producer, seq=int(seq), key=key)
        return producer, int(seq)

    # --- the run --------------------------------------------------------------------------
    def run(self) -> int:
        joined = threading.Event()
        live = threading.Thread(target=self.read_live, args=(joined,), daemon=True)
        live.start()
        if not joined.wait(60):
            logging.error("the live subscriber did not join in 60 s")
            return 1
        producers = [
            threading.Thread(target=self.produce, args=(f"p{n}",), daemon=True)
            for n in range(1, self.options.producers + 1)
        ]
        for thread in producers:
            thread.start()
        self.history.write(type="phase", name="start")
        deadline = time.monotonic() + self.options.max_s
        stop_file = Path(self.options.stop_file)
        while not stop_file.exists() and time.monotonic() < deadline:
            time.sleep(0.1)
        self.stop.set()
        self.history.write(type="phase", name="stop")
        for thread in [*producers, live]:
            thread.join(2 * FLUSH_S + 5)
        self.read_from_beginning()
        self.history.write(type="phase", name="done")
        self.history.close()
        return 0


def _log_reader_state(subscriber: Subscriber) -> None:
    """What the final reader's sequencer and feeds ended with: a loss found by the checker is
    told apart (a gap given up, a batch dropped as a duplicate, a feed stopped short) here."""
    sequencer = subscriber.sequencer
    logging.warning(
        "final reader: lost %d in %d gaps, duplicates %d, held %d, corrupt %d",
        sequencer.lost,
        sequencer.gaps,
        sequencer.duplicates,
        sequencer.held,
        sequencer.corrupt,
    )
    for where, feed in subscriber.feeds.items():
        logging.warning(
            "final reader: feed %s (%s): next offset %s, catching up %s, copies %s, refusals %d",
            feed.exchange_id,
            where,
            feed.next_offset,
            feed.catching_up,
            feed.copies,
            feed.refusals,
        )


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--zk", required=True)
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--queue", default="q1")
    parser.add_argument("--history", required=True)
    parser.add_argument("--stop-file", required=True)
    parser.add_argument("--acks", default="all", choices=("leader", "all"))
    parser.add_argument("--producers", type=int, default=3)
    parser.add_argument("--keys", type=int, default=2)
    parser.add_argument("--interval-ms", type=int, default=20)
    parser.add_argument("--max-s", type=float, default=180.0)
    options = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(threadName)s %(message)s")
    logging.getLogger("roq.client").setLevel(logging.INFO)  # moves, lookups, gaps: evidence
    return Workload(options).run()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
