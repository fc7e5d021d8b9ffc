"""`roq queue …` and `roq status`: the queue lifecycle and the cluster's state, from the GCM."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import typer

from roq.cli.app import app
from roq.cli.common import GCM_OPTION, ZK_OPTION, errors_to_exit, fail
from roq.client.admin import AdminClient, AdminRefused

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
    typer.echo(f"queue {name} created on {reply.get('Host', '?')}")


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
    typer.echo(f"queue {name} started on {reply.get('Host', '?')}")


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
        typer.echo(json.dumps(queues))
        return
    typer.echo(f"{'QUEUE':<24} {'STATE':<9} {'HOST':<20} MONITOR")
    for q in queues:
        host = q["Host"] + ("" if q.get("HostAlive", True) else " (down)")
        typer.echo(f"{q['Name']:<24} {q['State']:<9} {host:<20} {q['Monitor_host']}")


@app.command(rich_help_panel="Clients")
def status(
    as_json: bool = typer.Option(False, "--json", help="One JSON document."),
    gcm: str = GCM_OPTION,
    zk: str = ZK_OPTION,
    namespace: str = NS_OPTION,
) -> None:
    """Show hosts, queues, their state, monitors and exchanges with their addresses."""
    reply = _run(gcm, zk, namespace, lambda c: c.status())
    from roq.client.live import monitor_status

    for queue in reply["Queues"]:
        if queue["State"] == "RUNNING":
            queue["Live"] = monitor_status(queue["Monitor_host"])
    if as_json:
        typer.echo(json.dumps({"Hosts": reply["Hosts"], "Queues": reply["Queues"]}))
        return
    typer.echo(_render_status(reply))


def _render_status(reply: dict[str, Any]) -> str:
    lines = [f"hosts ({len(reply['Hosts'])}):"]
    for h in reply["Hosts"]:
        lines.append(f"  {h['Name']:<20} {h['HCM']:<26} max {h['MaxExchanges']} exchanges")
    lines.append(f"queues ({len(reply['Queues'])}):")
    for q in reply["Queues"]:
        alive = "" if q.get("HostAlive", True) else " (host down)"
        lines.append(
            f"  {q['Name']:<20} {q['State']:<9} host {q['Host']}{alive} "
            f"monitor {q['Monitor_host'] or '-'} kpi {q['Stat_Monitor_host'] or '-'}"
        )
        live = {x["Id"]: x for x in (q.get("Live") or {}).get("Exchanges", [])}
        for x in q.get("Exchanges", []):
            lines.append(f"    exchange {x['Id']:<28} in {x['Front']} out {x['Back']}")
            lines.append(_live_line(live.get(x["Id"]), q))
        scaling = (q.get("Live") or {}).get("Scaling")
        if scaling:
            lines.append(_scaling_line(scaling))
    return "\n".join(lines)


def _scaling_line(scaling: dict[str, Any]) -> str:
    """One line on the queue's elasticity: policy, limits, state and the last decision."""
    cap = scaling["Max"] or "hosts"
    state = f"{scaling['InFlight']} in flight" if scaling["InFlight"] else "idle"
    if scaling["CooldownLeft"] > 0:
        state += f", cool-down {scaling['CooldownLeft']:.1f} s"
    if scaling["LowFor"] > 0:
        state += f", below low-water for {scaling['LowFor']:.1f} s"
    events = scaling.get("Events") or []
    last = f"; last: {events[-1]['Event']}: {events[-1]['Reason']}" if events else ""
    return (
        f"    scaling {scaling['Policy']} (exchanges {scaling['Min']}..{cap}, "
        f"+{scaling['ScaledOut']} -{scaling['ScaledIn']}): {state}{last}"
    )


def _live_line(live: dict[str, Any] | None, queue: dict[str, Any]) -> str:
    if live is None:
        reason = "monitor unreachable" if queue.get("Live") is None else "not reporting"
        return f"      ({reason if queue['State'] == 'RUNNING' else queue['State'].lower()})"
    state = " LEAVING" if live.get("Leaving") else ""
    return (
        f"      {live['Msgs']:>12,.0f} msg/s {live['Bytes'] / 1e6:>9.2f} MB/s "
        f"{live['Producers']:>4} publishers  cpu {live['CPU'] * 100:5.1f}%  "
        f"rss {live['RSS'] / 2**20:6.1f} MiB{state}"
    )
