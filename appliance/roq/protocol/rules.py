"""Autoscaling rules (RoQ's host, exchange and logical-queue rules): validation and semantics.

A rule document (admin command 2006) carries `AUTOSCALING_NAME` and up to three rules:
`AUTOSCALING_HOST {AUTOSCALING_HOST_CPU, AUTOSCALING_HOST_RAM}`,
`AUTOSCALING_XCHANGE {AUTOSCALING_XCHANGE_THR}` and
`AUTOSCALING_Q {AUTOSCALING_Q_PROD_EXCH, AUTOSCALING_THR_PROD_EXCH}`. A limit of 0 disables
its check, as in RoQ. `RuleSet` is the checked, stored form: the GCM stores it with a `Version`,
answers 2007 with it and pushes it to the listeners registered with 2008.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Self

from roq.errors import DecodeError
from roq.protocol.bsonmsg import Document, field_int

RULE_FIELDS: dict[str, tuple[str, ...]] = {
    "AUTOSCALING_HOST": ("AUTOSCALING_HOST_CPU", "AUTOSCALING_HOST_RAM"),
    "AUTOSCALING_XCHANGE": ("AUTOSCALING_XCHANGE_THR",),
    "AUTOSCALING_Q": ("AUTOSCALING_Q_PROD_EXCH", "AUTOSCALING_THR_PROD_EXCH"),
}


def validate_rules(request: Mapping[str, Any]) -> dict[str, Any]:
    """The stored form of a 2006 request; ValueError names the offending field."""
    name = request.get("AUTOSCALING_NAME")
    if type(name) is not str or not name:  # not BSON Code, a str subclass
        raise ValueError("the AUTOSCALING_NAME field is missing or not a non-empty string")
    rules: dict[str, Any] = {"AUTOSCALING_NAME": name}
    for group, fields in RULE_FIELDS.items():
        if group not in request:
            continue
        body = request[group]
        if not isinstance(body, Mapping):
            raise ValueError(f"the {group} field must be a document")
        rules[group] = {field: _limit(body, group, field) for field in fields}
    if len(rules) == 1:
        raise ValueError("no rule given: expected AUTOSCALING_HOST, _XCHANGE or _Q")
    return rules


def _limit(body: Mapping[str, Any], group: str, field: str) -> float:
    value = body.get(field, 0)
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{group}.{field} must be a number, got {value!r}")
    if value < 0:
        raise ValueError(f"{group}.{field} must not be negative, got {value}")
    return float(value)


@dataclass(frozen=True)
class RuleSet:
    """A queue's rules as stored: the name, the groups given with every limit of each (a float),
    and the version the GCM gave them (0: none, as in a 2006 request)."""

    name: str
    groups: Mapping[str, Mapping[str, float]]
    version: int = 0

    def limit(self, group: str, name: str) -> float:
        """A limit; 0 (its check is off) when its group was not given."""
        return self.groups.get(group, {}).get(name, 0.0)

    def fields(self) -> Document:
        doc: Document = {"AUTOSCALING_NAME": self.name}
        doc.update({group: dict(limits) for group, limits in self.groups.items()})
        if self.version:
            doc["Version"] = self.version
        return doc

    @classmethod
    def decode(cls, doc: Mapping[str, Any]) -> Self:
        """`validate_rules`, with DecodeError naming the field; `Version` is optional (0)."""
        try:
            stored = validate_rules(doc)
        except ValueError as error:
            raise DecodeError(str(error)) from None
        name = stored.pop("AUTOSCALING_NAME")
        return cls(name, stored, field_int(doc, "Version", default=0))


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
