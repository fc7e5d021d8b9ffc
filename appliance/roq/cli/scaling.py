"""`roq scaling …`: a queue's autoscaling rules (admin 2006 / 2007) from the command line.

    roq scaling set QUEUE --name r1 --exchange-throughput 1000000      # RoQ's exchange rule
    roq scaling set QUEUE --name r2 --queue-producers 50 --host-cpu 3  # queue and host rules
    roq scaling show QUEUE [--json]

Limits are RoQ's: bytes/s for throughputs, load average for CPU, MB for RAM; 0 disables a check.
The queue's monitor gets the new rules at once (it is registered with 2008); `roq status` shows
them in force and every scaling decision. See docs/elasticity.md.
"""

from __future__ import annotations

import json
from typing import Any

import typer

from roq.cli.app import app
from roq.cli.common import GCM_OPTION, ZK_OPTION, table
from roq.cli.queues import NS_OPTION, admin_client

scaling_app = typer.Typer(help="Autoscaling rules of a queue (admin 2006/2007).")
app.add_typer(scaling_app, name="scaling", rich_help_panel="Clients")


def rules_document(
    name: str,
    host_cpu: float | None,
    host_ram: float | None,
    exchange_throughput: float | None,
    queue_producers: float | None,
    queue_throughput: float | None,
) -> dict[str, Any]:
    """The 2006 request body for the options given (a rule group only if one of its limits is)."""
    doc: dict[str, Any] = {"AUTOSCALING_NAME": name}
    groups = {
        "AUTOSCALING_HOST": {"AUTOSCALING_HOST_CPU": host_cpu, "AUTOSCALING_HOST_RAM": host_ram},
        "AUTOSCALING_XCHANGE": {"AUTOSCALING_XCHANGE_THR": exchange_throughput},
        "AUTOSCALING_Q": {
            "AUTOSCALING_Q_PROD_EXCH": queue_producers,
            "AUTOSCALING_THR_PROD_EXCH": queue_throughput,
        },
    }
    for group, limits in groups.items():
        given = {field: value for field, value in limits.items() if value is not None}
        if given:
            doc[group] = given
    return doc


@scaling_app.command("set")
def set_rules(
    queue: str,
    name: str = typer.Option("rules", "--name", help="Name of the rule set (AUTOSCALING_NAME)."),
    host_cpu: float = typer.Option(None, "--host-cpu", help="Host rule: load average limit."),
    host_ram: float = typer.Option(None, "--host-ram", help="Host rule: exchange RSS limit, MB."),
    exchange_throughput: float = typer.Option(
        None, "--exchange-throughput", help="Exchange rule: payload bytes/s per exchange."
    ),
    queue_producers: float = typer.Option(
        None, "--queue-producers", help="Queue rule: producers per exchange."
    ),
    queue_throughput: float = typer.Option(
        None, "--queue-throughput", help="Queue rule: payload bytes/s per exchange."
    ),
    gcm: str = GCM_OPTION,
    zk: str = ZK_OPTION,
    namespace: str = NS_OPTION,
) -> None:
    """Store a queue's rules (replacing the previous ones); its monitor applies them at once."""
    doc = rules_document(
        name, host_cpu, host_ram, exchange_throughput, queue_producers, queue_throughput
    )
    with admin_client(gcm, zk, namespace) as client:
        client.add_rules(queue, doc)
    typer.echo(f"rule set {name} stored for queue {queue}")


@scaling_app.command("show")
def show_rules(
    queue: str,
    as_json: bool = typer.Option(False, "--json", help="One JSON document."),
    gcm: str = GCM_OPTION,
    zk: str = ZK_OPTION,
    namespace: str = NS_OPTION,
) -> None:
    """Show a queue's stored rules."""
    with admin_client(gcm, zk, namespace) as client:
        rules = client.get_rules(queue)
    if as_json:
        typer.echo(json.dumps(rules.fields()))
        return
    typer.echo(f"rules {rules.name} (version {rules.version})")
    limits = [
        (field, f"{value:g}")
        for group in ("AUTOSCALING_HOST", "AUTOSCALING_XCHANGE", "AUTOSCALING_Q")
        for field, value in rules.groups.get(group, {}).items()
    ]
    if limits:
        typer.echo(table(("RULE", "LIMIT"), limits, header=False, indent=2))
