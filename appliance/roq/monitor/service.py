"""roq monitor: one per logical queue. Knows the queue's exchanges, places publishers, moves them.

Ports (B = the monitor port the host allocated, 6 in all; S = its stat port, 2):

    B+0  SUB   exchange reports (heartbeat + load, `MonitorCommand.EXCHANGE_REPORT`/`LEAVING`)
    B+1  REP   placement: SUBSCRIBER_INIT → every exchange's back address;
               PUBLISHER_INIT / PUBLISHER_PANIC → the least-loaded exchange's front address
    B+2  PUB   to publishers: [producer id hex | b"*"][BSON RELOCATE / EXCHANGE_LOST]
    B+3  PUB   to subscribers: NEW_EXCHANGE, and the full EXCHANGE_LIST every monitor.list.period
    B+4  PULL  scaling rules pushed by the GCM (admin 2008; RoQ's scaling process used S+2)
    B+5  REP   control (PING / SHUTDOWN from the host)
    S+0  SUB   statistics in (exchanges, subscribers): the stat monitor, inside this process
    S+1  PUB   the KPI stream: what came in on S (validated), plus the queue KPI (CMD 23)

Scaling (`roq.monitor.scaling.Scaler`, docs/elasticity.md) hooks in at three points only: every
report feeds its load window, a timer asks the policy (`policy.py`, pure) for a decision, and new
exchanges it created are filled by re-allocating publishers. Its admin requests run in its own
actuator thread (`actuator.py`).

An exchange silent for `monitor.dead.heartbeats` of its periods is dead: its publishers are told
with the exact front address they use (RoQ's never matched) and subscribers get the new list.
The main thread runs the poll loop and owns every socket; the scaling actuator thread
(`actuator.py`) owns its AdminClient and talks to the main thread through two bounded queues.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from roq import limits
from roq.config import MonitorSettings
from roq.errors import ProtocolError
from roq.monitor.placement import (
    ExchangeView,
    Move,
    assign_replicas,
    choose_exchange,
    mark_joined,
    plan_relocation,
)
from roq.monitor.scaling import Scaler
from roq.protocol import bsonmsg
from roq.protocol.commands import (
    ChildCommand,
    MonitorCommand,
    PublisherNotice,
    Reason,
    StatCommand,
    SubscriberNotice,
)
from roq.protocol.ports import ExchangePort, MonitorPort, StatPort, port_at, sibling
from roq.transport import READABLE, Kind, Poller, bind, connect, drained, open_socket, send_nowait
from roq.transport.control import ControlServer
from roq.transport.rpc import answer

log = logging.getLogger(__name__)

BROADCAST_TOPIC = b"*"


class Monitor:
    def __init__(
        self,
        context: Any,
        queue: str,
        address: str,
        port: int,
        stat_port: int,
        settings: MonitorSettings,
    ):
        self.queue, self.address, self.port, self.stat_port = queue, address, port, stat_port
        self.name = f"monitor {queue}"
        self.limits = settings.thresholds
        self.dead_after = settings.dead_heartbeats
        self.list_period_s = settings.list_period_s
        self.kpi_period_s = settings.stat_period_s
        self.exchanges: dict[str, ExchangeView] = {}  # by front address
        self.bad_frames = 0
        self.relocations = 0
        self.replication_factor = settings.replication_factor
        self._context = context
        self._controls: dict[str, Any] = {}  # front → DEALER to the exchange's control port
        self._open_sockets(context)
        self.scaler = Scaler(
            context, queue, settings, address, port_at(port, MonitorPort.RULES),
            emit=lambda doc: self._send(self.kpi_out, [bsonmsg.encode(doc)]),
        )  # fmt: skip

    def _open_sockets(self, context: Any) -> None:
        def bound(kind: Kind, port: int, **options: Any) -> Any:
            sock = open_socket(context, kind, **options)
            bind(sock, self.address, port)
            return sock

        def at(offset: MonitorPort) -> int:
            return port_at(self.port, offset)

        self.reports = bound(Kind.SUB, at(MonitorPort.REPORTS), rcvhwm=10_000, subscribe=b"")
        self.requests = bound(Kind.REP, at(MonitorPort.PLACEMENT))
        self.to_publishers = bound(Kind.PUB, at(MonitorPort.TO_PUBLISHERS), sndhwm=10_000)
        self.to_subscribers = bound(Kind.PUB, at(MonitorPort.TO_SUBSCRIBERS), sndhwm=10_000)
        s = self.stat_port
        self.stat_in = bound(Kind.SUB, port_at(s, StatPort.IN), rcvhwm=10_000, subscribe=b"")
        self.kpi_out = bound(Kind.PUB, port_at(s, StatPort.KPI), sndhwm=10_000)
        self.control = ControlServer(context, self.address, at(MonitorPort.CONTROL), self.name)
        self.control.status = self.status

    # --- main loop -----------------------------------------------------------------------------
    def run(self, stop: threading.Event) -> None:
        poller = Poller()
        handlers = {
            self.reports: self._pump_reports,
            self.requests: lambda: answer(self.requests, self._placement, self.name, log),
            self.stat_in: self._pump_stats,
            self.control.sock: self.control.handle,
            self.scaler.sock: self.scaler.pump_rules,
        }
        for sock in handlers:
            poller.register(sock, READABLE)
        now = time.monotonic()
        next_list, next_kpi = now + self.list_period_s, now + self.kpi_period_s
        next_scale = now
        placement = port_at(self.port, MonitorPort.PLACEMENT)
        log.info("%s: placing publishers on tcp://%s:%d", self.name, self.address, placement)
        while not (stop.is_set() or self.control.stop_requested):
            for sock, _ in poller.poll(limits.poll_interval_ms):
                handlers[sock]()
            now = time.monotonic()
            self._reap(now)
            if now >= next_scale:
                self._scale(now)
                next_scale = now + limits.poll_interval_ms / 1000
            if now >= next_list:
                self._publish_list()
                self._assign_replicas()  # again each period: a restarted exchange forgot it
                next_list = now + self.list_period_s
            if now >= next_kpi:
                self._publish_queue_kpi()
                next_kpi = now + self.kpi_period_s
        log.info("%s: stopping", self.name)

    # --- exchange reports ----------------------------------------------------------------------
    def _pump_reports(self) -> None:
        for frames in drained(self.reports, limits.monitor_burst_messages):
            try:
                self._on_report(bsonmsg.decode(frames))
            except (ProtocolError, KeyError, TypeError, ValueError) as error:
                self.bad_frames += 1
                log.warning("%s: ignored a bad exchange report: %s", self.name, error)

    def _on_report(self, doc: dict[str, Any]) -> None:
        front = bsonmsg.field_str(doc, "Front")
        now = time.monotonic()
        view = self.exchanges.get(front)
        if doc["CMD"] == MonitorCommand.EXCHANGE_PULSE:
            self._on_pulse(view, doc, now)
            return
        if doc["CMD"] == MonitorCommand.EXCHANGE_SUBSCRIPTIONS:
            self._on_subscriptions(view, doc)
            return
        if view is not None and view.started != doc.get("Started", view.started):
            self._forget(view, now, "restarted")  # its memory (and what it held) is gone
            view = None
        if view is None:
            if len(self.exchanges) >= limits.monitor_exchanges_max:
                raise ValueError(f"already {limits.monitor_exchanges_max} exchanges known")
            view = self._register(doc, front, now)
        view.last_seen = now
        view.period_s = float(doc.get("Period", view.period_s))
        if doc["CMD"] == MonitorCommand.EXCHANGE_LEAVING:
            self._on_leaving(view)
            return
        if doc["CMD"] != MonitorCommand.EXCHANGE_REPORT:
            raise ValueError(f"unknown report command {doc['CMD']}")
        self._update_load(view, doc)
        self.scaler.observe(view.exchange_id, doc, now)
        self._relocate(view, now)

    def _on_pulse(self, view: ExchangeView | None, doc: dict[str, Any], now: float) -> None:
        """The process is up: it counts as a heartbeat while its loop still turns (a loop
        stalled past the bound, or a restarted process, is left to the reports)."""
        if view is None or view.started != doc.get("Started"):
            return
        if float(doc.get("LoopAge", 0.0)) * 1000 < limits.exchange_loop_stall_max_ms:
            view.last_seen = now

    def _on_subscriptions(self, view: ExchangeView | None, doc: dict[str, Any]) -> None:
        """Subscribers joined or left an exchange: a new one may now take publishers."""
        if view is None or view.started != doc.get("Started"):
            return  # its first report registers it, and carries the count too
        view.subscriptions = int(doc.get("Subs", 0))
        self._mark_joined()

    def _mark_joined(self) -> None:
        waiting = [x.exchange_id for x in self.exchanges.values() if not x.joined]
        mark_joined(list(self.exchanges.values()))
        for view in self.exchanges.values():
            if view.joined and view.exchange_id in waiting:
                log.info("%s: subscribers have joined exchange %s (%d subscriptions)",
                         self.name, view.exchange_id, view.subscriptions)  # fmt: skip

    def _register(self, doc: dict[str, Any], front: str, now: float) -> ExchangeView:
        view = ExchangeView(
            exchange_id=bsonmsg.field_str(doc, "Id"),
            front=front,
            back=bsonmsg.field_str(doc, "Back"),
            first_seen=now,
            last_seen=now,
            period_s=float(doc.get("Period", 1.0)),
            started=float(doc.get("Started", 0.0)),
            logged=bool(doc.get("Log", False)),
        )
        view.host = str(doc.get("Host", ""))
        self.exchanges[front] = view
        log.info("%s: exchange %s joined (%s)", self.name, view.exchange_id, front)
        self._to_subscribers(
            SubscriberNotice.NEW_EXCHANGE, Id=view.exchange_id, Back=view.back, Log=view.logged
        )
        return view

    def _update_load(self, view: ExchangeView, doc: dict[str, Any]) -> None:
        view.bytes_rate = float(doc.get("Bytes", 0.0))
        view.msgs_rate = float(doc.get("Msgs", 0.0))
        view.producers = int(doc.get("Producers", 0))
        view.cpu = float(doc.get("CPU", 0.0))
        view.rss = int(doc.get("RSS", 0))
        view.subscriptions = int(doc.get("Subs", 0))
        self._mark_joined()
        top = doc.get("Top", [])
        view.top = [(str(p["ID"]), float(p["Bytes"])) for p in top if isinstance(p, dict)]
        copies = doc.get("Copies", [])[: limits.monitor_copies_announced_max]
        view.copies = {str(c["Id"]): int(c["End"]) for c in copies if isinstance(c, dict)}

    def _on_leaving(self, view: ExchangeView) -> None:
        if not view.leaving:
            log.info(
                "%s: exchange %s is leaving; moving its publishers", self.name, view.exchange_id
            )
        view.leaving = True
        self._to_publishers(
            BROADCAST_TOPIC, PublisherNotice.EXCHANGE_LOST, Front=view.front, Dead=False
        )

    def _relocate(self, source: ExchangeView, now: float) -> None:
        moves = plan_relocation(source, list(self.exchanges.values()), now, self.limits)
        for move in moves:
            self._move(move, f"{move.source.exchange_id} is overloaded")

    def _scale(self, now: float) -> None:
        for move in self.scaler.tick(list(self.exchanges.values()), now, self.limits):
            self._move(move, f"{move.target.exchange_id} was added to share the load")

    def _move(self, move: Move, why: str) -> None:
        self.relocations += 1
        log.info(
            "%s: moving publisher %s (%.0f B/s) from %s to %s: %s",
            self.name, move.producer, move.bytes_rate, move.source.exchange_id,
            move.target.exchange_id, why,
        )  # fmt: skip
        self._to_publishers(
            move.producer.encode(),
            PublisherNotice.RELOCATE,
            ProducerID=move.producer,
            Exchange={"Id": move.target.exchange_id, "Front": move.target.front},
            From=move.source.front,
        )

    def _silent(self, now: float) -> list[ExchangeView]:
        return [
            v for v in self.exchanges.values() if now - v.last_seen > self.dead_after * v.period_s
        ]

    def _reap(self, now: float) -> None:
        if not self._silent(now):
            return
        # Reports that arrived while this loop served something else are not silence.
        self._pump_reports()
        dead = self._silent(now)
        for view in dead:
            self._forget(view, now, f"silent for {now - view.last_seen:.1f} s")
        if dead:
            self._publish_list()

    def _forget(self, view: ExchangeView, now: float, why: str) -> None:
        """A dead exchange: its publishers fail over (the notice names the address they use)."""
        del self.exchanges[view.front]
        self.scaler.forget(view.exchange_id)
        control = self._controls.pop(view.front, None)
        if control is not None:
            control.close(0)
        if view.leaving:  # it said it was leaving: its silence is the expected end
            log.info("%s: exchange %s (%s) left", self.name, view.exchange_id, view.front)
        else:
            log.warning("%s: exchange %s (%s) %s: declared dead",
                        self.name, view.exchange_id, view.front, why)  # fmt: skip
        self._to_publishers(
            BROADCAST_TOPIC, PublisherNotice.EXCHANGE_LOST, Front=view.front, Dead=True
        )

    # --- placement requests --------------------------------------------------------------------
    def _placement(self, request: dict[str, Any]) -> dict[str, Any]:
        command = request["CMD"]
        if command == MonitorCommand.SUBSCRIBER_INIT:
            return bsonmsg.ok(Exchanges=self._exchange_list(), Copies=self._copy_list())
        if command in (MonitorCommand.PUBLISHER_INIT, MonitorCommand.PUBLISHER_PANIC):
            return self._place(request)
        return bsonmsg.fail(Reason.UNKNOWN_COMMAND, f"unknown command {command}")

    def _place(self, request: dict[str, Any]) -> dict[str, Any]:
        producer = bsonmsg.field_str(request, "ProducerID", max_chars=64)
        avoid = request.get("Lost", "") if request["CMD"] == MonitorCommand.PUBLISHER_PANIC else ""
        chosen = choose_exchange(
            list(self.exchanges.values()), time.monotonic(), self.limits, str(avoid)
        )
        if chosen is None:
            return bsonmsg.fail(Reason.NO_CAPACITY, f"queue {self.queue} has no live exchange")
        log.info("%s: publisher %s placed on %s", self.name, producer, chosen.exchange_id)
        return bsonmsg.ok(Exchange={"Id": chosen.exchange_id, "Front": chosen.front})

    def _exchange_list(self) -> list[dict[str, Any]]:
        return [
            {"Id": x.exchange_id, "Back": x.back, "Log": x.logged} for x in self.exchanges.values()
        ]

    def _copy_list(self) -> list[dict[str, Any]]:
        """The logs of exchanges that are gone (dead or retired) but copied on a live one, each
        with the live exchanges that hold a copy, the longest copy first. Built from the
        exchanges' own reports, so it holds for as long as a copy is there to be read."""
        live = {x.exchange_id for x in self.exchanges.values()}
        holders: dict[str, list[dict[str, Any]]] = {}
        for view in self.exchanges.values():
            for leader_id, end in view.copies.items():
                if leader_id not in live and not view.leaving:
                    entry = {"Id": view.exchange_id, "Log": _log_endpoint(view.front), "End": end}
                    holders.setdefault(leader_id, []).append(entry)
        return [
            {"Id": leader_id, "Replicas": sorted(found, key=lambda r: -int(r["End"]))}
            for leader_id, found in sorted(holders.items())
        ]

    def _publish_list(self) -> None:
        self._to_subscribers(
            SubscriberNotice.EXCHANGE_LIST,
            Exchanges=self._exchange_list(),
            Copies=self._copy_list(),
        )

    # --- stat monitor --------------------------------------------------------------------------
    def _pump_stats(self) -> None:
        """Forward valid statistics to the KPI stream; count and drop the rest."""
        for frames in drained(self.stat_in, limits.monitor_burst_messages):
            if self._valid_stat(frames):
                self._send(self.kpi_out, frames)
            else:
                self.bad_frames += 1

    @staticmethod
    def _valid_stat(frames: list[bytes]) -> bool:
        if not 1 <= len(frames) <= limits.stat_frames_max:
            return False
        try:
            docs = [bsonmsg.decode([frame], limits.stat_frame_bytes_max) for frame in frames]
        except ProtocolError:
            return False
        known = {int(c) for c in StatCommand}
        return all(doc["CMD"] in known for doc in docs)

    def _publish_queue_kpi(self) -> None:
        views = list(self.exchanges.values())
        doc = {
            "CMD": int(StatCommand.QUEUE),
            "QName": f"{self.queue}:{self.port}",
            "XChanges": len(views),
            "Producers": sum(x.producers for x in views),
            "Throughput": sum(x.bytes_rate for x in views),
            "Msgs": sum(x.msgs_rate for x in views),
            "Time": time.time(),
        }
        self._send(self.kpi_out, [bsonmsg.encode(doc)])

    # --- output --------------------------------------------------------------------------------
    def _to_publishers(self, topic: bytes, notice: PublisherNotice, **fields: Any) -> None:
        self._send(self.to_publishers, [topic, bsonmsg.encode({"CMD": int(notice), **fields})])

    def _to_subscribers(self, notice: SubscriberNotice, **fields: Any) -> None:
        self._send(self.to_subscribers, [bsonmsg.encode({"CMD": int(notice), **fields})])

    def _send(self, sock: Any, frames: list[bytes]) -> None:
        if not send_nowait(sock, frames):
            log.warning("%s: a slow peer missed a notice (it will get the next list)", self.name)

    def status(self) -> dict[str, Any]:
        now = time.monotonic()
        return {
            "Queue": self.queue,
            "Relocations": self.relocations,
            "BadFrames": self.bad_frames,
            "Scaling": self.scaler.status(now),
            "Exchanges": [
                {
                    "Id": x.exchange_id,
                    "Front": x.front,
                    "Back": x.back,
                    "Msgs": x.msgs_rate,
                    "Bytes": x.bytes_rate,
                    "Producers": x.producers,
                    "CPU": x.cpu,
                    "RSS": x.rss,
                    "Leaving": x.leaving,
                    "Subscriptions": x.subscriptions,
                    "Placeable": x.is_placeable(now, self.limits.warmup_s),
                    "Replicas": list(x.replicas),
                    "Copies": [{"Id": k, "End": v} for k, v in sorted(x.copies.items())],
                    "Age": now - x.first_seen,
                }
                for x in self.exchanges.values()
            ],
            "Copies": self._copy_list(),
        }

    # --- replication ---------------------------------------------------------------------------
    def _assign_replicas(self) -> None:
        """Tell each exchange which exchanges copy its log (only what changed is logged)."""
        views = list(self.exchanges.values())
        plan = assign_replicas(views, self.replication_factor)
        by_id = {x.exchange_id: x for x in views}
        for leader_id, replica_ids in plan.items():
            leader = by_id[leader_id]
            if replica_ids != leader.replicas:
                log.info(
                    "%s: %s is copied to %s",
                    self.name,
                    leader_id,
                    ", ".join(replica_ids) or "nobody",
                )
                leader.replicas = replica_ids
            replicas = [{"Id": r, "Endpoint": _log_endpoint(by_id[r].front)} for r in replica_ids]
            self._tell_exchange(leader, {"CMD": int(ChildCommand.REPLICAS), "Replicas": replicas})

    def _tell_exchange(self, view: ExchangeView, doc: dict[str, Any]) -> None:
        sock = self._controls.get(view.front)
        if sock is None:
            sock = self._controls[view.front] = open_socket(self._context, Kind.DEALER, sndhwm=10)
            connect(sock, sibling(view.front, ExchangePort.FRONT, ExchangePort.CONTROL))
        for _ in drained(sock, limits.control_hwm_messages):  # its high-water mark
            pass  # replies carry nothing we need: discard them
        if not send_nowait(sock, [b"", bsonmsg.encode(doc)]):
            log.debug("%s: exchange %s control queue full", self.name, view.exchange_id)

    def close(self) -> None:
        self.scaler.close()
        for control in self._controls.values():
            control.close(0)
        for sock in (
            self.reports, self.requests, self.to_publishers, self.to_subscribers,
            self.stat_in, self.kpi_out,
        ):  # fmt: skip
            sock.close(0)
        self.control.close()


def _log_endpoint(front: str) -> str:
    """Where an exchange serves log reads and replication writes (F+3), from its front (F)."""
    return sibling(front, ExchangePort.FRONT, ExchangePort.LOG)
