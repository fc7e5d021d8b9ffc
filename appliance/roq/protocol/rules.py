"""Autoscaling rules (RoQ's host, exchange and logical-queue rules): validation and semantics.

A rule document (admin command 2006) carries `AUTOSCALING_NAME` and up to three rules:
`AUTOSCALING_HOST {AUTOSCALING_HOST_CPU, AUTOSCALING_HOST_RAM}`,
`AUTOSCALING_XCHANGE {AUTOSCALING_XCHANGE_THR}` and
`AUTOSCALING_Q {AUTOSCALING_Q_PROD_EXCH, AUTOSCALING_THR_PROD_EXCH}`. A limit of 0 disables
its check, as in RoQ.
"""

from __future__ import annotations

from typing import Any

RULE_FIELDS: dict[str, tuple[str, ...]] = {
    "AUTOSCALING_HOST": ("AUTOSCALING_HOST_CPU", "AUTOSCALING_HOST_RAM"),
    "AUTOSCALING_XCHANGE": ("AUTOSCALING_XCHANGE_THR",),
    "AUTOSCALING_Q": ("AUTOSCALING_Q_PROD_EXCH", "AUTOSCALING_THR_PROD_EXCH"),
}


def validate_rules(request: dict[str, Any]) -> dict[str, Any]:
    """The stored form of a 2006 request; ValueError names the offending field."""
    name = request.get("AUTOSCALING_NAME")
    if not isinstance(name, str) or not name:
        raise ValueError("the AUTOSCALING_NAME field is missing or not a non-empty string")
    rules: dict[str, Any] = {"AUTOSCALING_NAME": name}
    for group, fields in RULE_FIELDS.items():
        if group not in request:
            continue
        body = request[group]
        if not isinstance(body, dict):
            raise ValueError(f"the {group} field must be a document")
        rules[group] = {field: _limit(body, group, field) for field in fields}
    if len(rules) == 1:
        raise ValueError("no rule given: expected AUTOSCALING_HOST, _XCHANGE or _Q")
    return rules


def _limit(body: dict[str, Any], group: str, field: str) -> float:
    value = body.get(field, 0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{group}.{field} must be a number, got {value!r}")
    if value < 0:
        raise ValueError(f"{group}.{field} must not be negative, got {value}")
    return float(value)


def host_rule_fires(cpu_limit: float, ram_limit: float, cpu: float, ram: float) -> bool:
    """RoQ's HostScalingRule: CPU or RAM above its limit (a zero limit is ignored)."""
    return (cpu_limit != 0 and cpu > cpu_limit) or (ram_limit != 0 and ram > ram_limit)


def exchange_rule_fires(throughput_limit: float, throughput: float) -> bool:
    return throughput_limit != 0 and throughput > throughput_limit


def queue_rule_fires(
    producers_limit: float,
    throughput_limit: float,
    producers: float,
    throughput: float,
    exchanges: int,
) -> bool:
    """RoQ's LogicalQScalingRule: producers or throughput per exchange above the limit."""
    if exchanges <= 0:
        return False
    return (producers_limit != 0 and producers / exchanges > producers_limit) or (
        throughput_limit != 0 and throughput / exchanges > throughput_limit
    )
