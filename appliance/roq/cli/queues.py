"""`roq queue …` and `roq status`: the queue lifecycle and the cluster's state, from the GCM."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import typer

from roq import limits
from roq.cli.app import app
from roq.cli.common import GCM_OPTION, ZK_OPTION, errors_to_exit, fail, table
from roq.client.admin import AdminClient, AdminRefused
from roq.errors import EXIT_NOT_SERVING
from roq.protocol.messages.admin import ChildReport, ClusterStatus, QueueStatus
from roq.protocol.messages.control import (
    MonitoredExchange,
    MonitorStatus,
    ScalingStatus,
    ShortLog,
)

queue_app = typer.Typer(help="Create, stop, start, delete and list queues.", no_args_is_help=True)
app.add_typer(queue_app, name="queue", rich_help_panel="Clients")

NS_OPTION = typer.Option("/roq", "--namespace", help="ZooKeeper namespace of the cluster.")


@contextmanager
def admin_client(gcm: str, zk: str | None, namespace: str) -> Iterator[AdminClient]:
    with errors_to_exit():
        client = AdminClient(gcm=None if zk else gcm, zk=zk, namespace=namespace)
        try:
            yield client
        except AdminRefused as refused:
            raise fail(str(refused), 1) from None
        finally:
            client.close()


def _run(gcm: str, zk: str | None, namespace: str, call: Callable[[AdminClient], Any]) -> Any:
    with admin_client(gcm, zk, namespace) as client:
        return call(client)


@queue_app.command("create")
def create(
    name: str,
    host: str = typer.Option(
        None,
        "--host",
        help="Host name or address (default: the host with the most free exchange slots).",
    ),
    gcm: str = GCM_OPTION,
    zk: str = ZK_OPTION,
    namespace: str = NS_OPTION,
) -> None:
    """Create a queue: starts its monitor and first exchange on a host."""
    reply = _run(gcm, zk, namespace, lambda c: c.create_queue(name, host))
    typer.echo(f"queue {name} created on {reply.host}")


@queue_app.command("delete")
def delete(
    name: str, gcm: str = GCM_OPTION, zk: str = ZK_OPTION, namespace: str = NS_OPTION
) -> None:
    """Delete a queue: stops its processes and removes all its state and logs."""
    _run(gcm, zk, namespace, lambda c: c.delete_queue(name))
    typer.echo(f"queue {name} deleted")


@queue_app.command("stop")
def stop(name: str, gcm: str = GCM_OPTION, zk: str = ZK_OPTION, namespace: str = NS_OPTION) -> None:
    """Stop a queue: its processes end; its record and logs stay for `roq queue start`."""
    _run(gcm, zk, namespace, lambda c: c.stop_queue(name))
    typer.echo(f"queue {name} stopped")


@queue_app.command("start")
def start(
    name: str,
    host: str = typer.Option(None, "--host", help="Start it on another host."),
    gcm: str = GCM_OPTION,
    zk: str = ZK_OPTION,
    namespace: str = NS_OPTION,
) -> None:
    """Start a stopped queue again."""
    reply = _run(gcm, zk, namespace, lambda c: c.start_queue(name, host))
    typer.echo(f"queue {name} started on {reply.host}")


@queue_app.command("list")
def list_(
    as_json: bool = typer.Option(False, "--json", help="One JSON document."),
    gcm: str = GCM_OPTION,
    zk: str = ZK_OPTION,
    namespace: str = NS_OPTION,
) -> None:
    """List the queues with their state, host and monitor."""
    queues = _run(gcm, zk, namespace, lambda c: c.list_queues())
    if as_json:
        typer.echo(json.dumps([q.fields() for q in queues]))
        return
    rows = [
        (q.name, q.state, q.host + ("" if q.host_alive else " (down)"), q.monitor_host)
        for q in queues
    ]
    typer.echo(table(("QUEUE", "STATE", "HOST", "MONITOR"), rows))


@app.command(rich_help_panel="Clients")
def status(
    as_json: bool = typer.Option(False, "--json", help="One JSON document."),
    gcm: str = GCM_OPTION,
    zk: str = ZK_OPTION,
    namespace: str = NS_OPTION,
) -> None:
    """Show hosts, queues, their state, monitors and exchanges with their addresses.

    Exit code 5 when a RUNNING queue is NOT SERVING (its monitor does not answer; the output
    says why), after printing the same; 0 when every running queue serves.
    """
    reply = _run(gcm, zk, namespace, lambda c: c.status())
    from roq.client.live import monitor_status

    lives = {q.info.name: monitor_status(q.info.monitor_host) for q in reply.queues
             if q.info.state == "RUNNING"}  # fmt: skip
    if as_json:
        queues = [
            {
                **q.fields(),
                **({"Live": _fields(lives[q.info.name])} if q.info.name in lives else {}),
            }
            for q in reply.queues
        ]
        typer.echo(json.dumps({
            "Hosts": [h.fields() for h in reply.hosts], "Queues": queues,
            "GoneHosts": [g.fields() for g in reply.gone],
            "Repairs": [r.fields() for r in reply.repairs],
        }))  # fmt: skip
    else:
        typer.echo(_render_status(reply, lives))
    if any(live is None for live in lives.values()):  # a script or probe can tell (README)
        raise typer.Exit(EXIT_NOT_SERVING)


def _fields(live: MonitorStatus | None) -> dict[str, Any] | None:
    return None if live is None else live.encode()


def _render_status(reply: ClusterStatus, lives: dict[str, MonitorStatus | None]) -> str:
    lines = [f"hosts ({len(reply.hosts)}):"]
    known = [(h.name, h.hcm, f"max {h.max_exchanges} exchanges") for h in reply.hosts]
    for g in reply.gone:
        left = f"{g.queues} queue(s) still assigned" if g.queues else "its work re-placed"
        known.append((g.name, "", f"GONE for {g.gone_s:.0f} s: {left}"))
    if known:
        lines.append(table(("HOST", "ADDRESS", "STATE"), known, header=False, indent=2))
    for r in reply.repairs:
        lines.append(f"  re-placing {r.queue}: {r.comment}")
    lines.append(f"queues ({len(reply.queues)}):")
    hosts = {h.name for h in reply.hosts}
    # what the hosts report of the children they are restarting or gave up on; "" = the monitor
    failing = {(c.queue, c.child_id if c.role == "exchange" else ""): c
               for h in reply.hosts for c in h.children}  # fmt: skip
    for q in reply.queues:
        info, status = q.info, lives.get(q.info.name)
        alive = "" if info.host_alive else " (host down)"
        lines.append(
            f"  {info.name:<20} {info.state:<9} host {info.host}{alive} "
            f"monitor {info.monitor_host or '-'} kpi {info.stat_monitor_host or '-'}"
        )
        if info.state == "RUNNING" and status is None:
            why = _why_no_monitor(info.host, info.host_alive, failing.get((info.name, "")))
            lines.append(f"    NOT SERVING: {why}")
        live = {x.exchange_id: x for x in (status.exchanges if status else ())}
        for x in q.exchanges:
            if x.follower:  # binds neither: it takes copies on its log port only
                lines.append(f"    log follower {x.exchange_id:<24} on host {x.host}")
            else:
                lines.append(f"    exchange {x.exchange_id:<28} in {x.front} out {x.back}")
            if x.lost:
                kind = "log follower" if x.follower else "exchange"
                lines.append(f"      (lost with host {x.host}; another {kind} replaced it)")
                continue
            failed = failing.get((info.name, x.exchange_id))
            lines.append(_live_line(live.get(x.exchange_id), q, status, x.host in hosts, failed))
        if status is not None:
            lines += [_short_log_line(short) for short in status.short_logs]
            lines.append(_scaling_line(status.scaling))
            lines += _publisher_lines(status)
    return "\n".join(lines)


def _publisher_lines(status: MonitorStatus) -> list[str]:
    """The queue's publishers as their KPIs (11, 12) last said, the busiest first."""
    shown = status.publishers[: limits.status_publishers_shown_max]
    lines = [
        f"    publisher {p.publisher_id:<32} {p.total_sent:>12,} sent {p.rate:>12,.0f} msg/s"
        f"  (heard {p.age_s:.0f} s ago)"
        for p in shown
    ]
    hidden = len(status.publishers) - len(shown)
    if hidden or status.publishers_untracked:
        untracked = " (the monitor tracks no more; others not listed)"
        lines.append(
            f"    … {hidden} more publishers{untracked if status.publishers_untracked else ''}"
        )
    return lines


def _short_log_line(short: ShortLog) -> str:
    """A gone exchange's log with fewer copies than replicationFactor, and its copying."""
    head = f"    log of gone {short.leader_id}: {short.copies} of {short.wanted} copies"
    if not short.targets:
        return f"{head}; no exchange can take another copy"
    mib = 2**20
    done = ", ".join(
        f"{t.exchange_id} {max(t.end, 0) / mib:.1f} of {short.end / mib:.1f} MiB"
        for t in short.targets
    )
    return f"{head}; copying from {short.source} to {done}"


def _scaling_line(scaling: ScalingStatus) -> str:
    """One line on the queue's elasticity: policy, limits, state and the last decision."""
    cap = scaling.max_exchanges or "hosts"
    state = f"{scaling.in_flight} in flight" if scaling.in_flight else "idle"
    if scaling.cooldown_left_s > 0:
        state += f", cool-down {scaling.cooldown_left_s:.1f} s"
    if scaling.low_for_s > 0:
        state += f", below low-water for {scaling.low_for_s:.1f} s"
    events = scaling.events
    last = f"; last: {events[-1].event}: {events[-1].reason}" if events else ""
    return (
        f"    scaling {scaling.policy} (exchanges {scaling.min_exchanges}..{cap}, "
        f"+{scaling.scaled_out} -{scaling.scaled_in}): {state}{last}"
    )


def _why_no_monitor(host: str, host_alive: bool, failed: ChildReport | None) -> str:
    """Why a RUNNING queue has no monitor that answers (the queue stays assigned to its host)."""
    if not host_alive:
        return f"host {host} is down; it starts the queue again, with its logs, when it restarts"
    if failed is not None:
        return f"the monitor on host {host} is {_failing(failed)}"
    return (
        f"host {host} is up but the monitor does not answer, and the host reports no failure "
        "of it (starting, or a host too old to report one: see the host's log)"
    )


def _failing(failed: ChildReport) -> str:
    """What a host reports of a child it is restarting or gave up on."""
    now = time.time()
    if failed.state == "RESTARTING":
        wait_s = failed.at - now
        when = f"next try in {wait_s:.1f} s" if wait_s > 0 else "trying again now"
        return f"restarting (failure {failed.failures}, {when}; last: {failed.last_exit})"
    return (
        f"given up after {failed.failures} failures (last: {failed.last_exit}, "
        f"{max(0.0, now - failed.at):.0f} s ago; `roq queue stop` and `start` retry)"
    )


def _live_line(
    live: MonitoredExchange | None,
    queue: QueueStatus,
    status: MonitorStatus | None,
    host_alive: bool = True,
    failed: ChildReport | None = None,
) -> str:
    if live is None:
        if failed is not None and host_alive:
            return f"      {_failing(failed)}"
        reason = "monitor unreachable" if status is None else "not reporting"
        if not host_alive:
            reason = "host down: not serving until it restarts"
        state = queue.info.state
        return f"      ({reason if state == 'RUNNING' else state.lower()})"
    leaving = " LEAVING" if live.leaving else ""
    refusing = f"\n      REFUSING APPENDS (no publisher placed here): {live.refusing}"
    if live.follower:
        held = ", ".join(f"{c.leader_id} to {c.end:,}" for c in live.copies) or "none yet"
        return (
            f"      copies held: {held}  cpu {live.cpu * 100:5.1f}%  "
            f"rss {live.rss / 2**20:6.1f} MiB{leaving}{refusing if live.refusing else ''}"
        )
    return (
        f"      {live.msgs_rate:>12,.0f} msg/s {live.bytes_rate / 1e6:>9.2f} MB/s "
        f"{live.producers:>4} publishers  cpu {live.cpu * 100:5.1f}%  "
        f"rss {live.rss / 2**20:6.1f} MiB{_in_sync(live)}{leaving}"
        f"{refusing if live.refusing else ''}"
    )


def _in_sync(live: MonitoredExchange) -> str:
    """Copies of its log in sync against min.insync.copies; below it, acks=all is refused."""
    if not live.in_sync:
        return ""
    below = "  ACKS=ALL REFUSED" if live.in_sync < live.in_sync_min else ""
    return f"  copies in sync {live.in_sync} (min {live.in_sync_min}){below}"
