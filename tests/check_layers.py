"""The layering rules of DESIGN §11 and docs/architecture.md §1, checked on the import statements
of every module (inside functions too; relative imports resolved to absolute names).

- Third-party owners: only roq.transport imports zmq, only roq.coordination kazoo, only
  roq.analytics pyspark, only roq.cloud boto3 (the ec2 provisioner's client, SSM parameters),
  only roq.metrics prometheus_client.
- The pure layers, roq.log and roq.protocol, import the standard library (but not `socket`),
  bson, mypyc's librt and mypy_extensions (roq.log._native) and the roq modules their row
  allows: no sockets, no ZooKeeper. roq.system imports the
  standard library only.
- MAY_IMPORT: which roq package may import which. A package imports itself and BASE freely; a
  package without a row is a violation, so a new package states its place when it is added.
Run by `make lint` and by tests/unit/test_layers.py.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "appliance" / "roq"

OWNERS = {
    "zmq": "transport",
    "kazoo": "coordination",
    "pyspark": "analytics",
    # the AWS SDK and its stubs: roq.cloud only (the ec2 provisioner's client, SSM parameters)
    "boto3": "cloud",
    "botocore": "cloud",
    "mypy_boto3_ec2": "gcm",  # types only: the provisioner's RunInstances request
    "mypy_boto3_ssm": "cloud",
    # the Prometheus client: roq.metrics only (the listener, the exposition, the gateway's
    # counter classes passed on), so one package knows its API
    "prometheus_client": "metrics",
}

# What every part of roq may import: the package itself (its version), the error tree, the bounds
# and the back-off that grows a retry's wait within them.
BASE = {"roq", "errors", "limits", "backoff"}
# A daemon (one package per process; `roq up` is local) uses the client API (the monitor's scaling
# actuator calls the admin API, `roq up` waits for its GCM with it), the pure layers, sockets,
# ZooKeeper and the OS helpers, never another daemon's code: what two processes share lives in a
# layer below both.
DAEMON = {
    "client",
    "protocol",
    "transport",
    "coordination",
    "log",
    "system",
    "config",
    "replication",
}
ANYTHING = "*"

MAY_IMPORT: dict[str, set[str] | str] = {
    # top-level modules
    "errors": set(),
    "limits": set(),
    "backoff": set(),
    "config": {"log"},  # the key tables and typed settings; components.py builds LogSettings
    "__main__": {"cli"},
    # layers
    "protocol": set(),
    "log": set(),
    "system": {"config"},
    "transport": {"protocol"},
    "coordination": {"protocol"},
    "client": {"protocol", "transport", "coordination", "log", "system"},  # system: bench spawns
    "analytics": {"log", "protocol"},  # Spark executors run without a broker
    # Prometheus exposition and the /metrics, /healthz, /readyz listener: the metric catalogue
    # and samples are protocol's (children send them to their host)
    "metrics": {"protocol"},
    # AWS (boto3): the SSM parameter holding cluster.json is checked as transport reads it
    "cloud": {"config", "transport"},
    # log replication (leader links, copies): the exchanges' message logs and the monitor's
    # delivery-state log are copied by the same code
    "replication": {"log", "protocol", "transport"},
    # processes
    # metrics: a GCM's and a host's listener (the host serves its children's samples too)
    "gcm": DAEMON | {"cloud", "metrics"},  # cloud: the ec2 provisioner
    "host": DAEMON | {"metrics"},
    "monitor": DAEMON,
    "exchange": DAEMON,
    "local": DAEMON,
    # the HTTP gateway: publishes and reads through the client API, keeps its topics in
    # ZooKeeper through coordination, never touches zmq or kazoo itself; the principal model
    # (protocol) for its bearer tokens
    # log: fsync; metrics: its counters and /metrics (prometheus_client through roq.metrics)
    "http": {"client", "coordination", "config", "system", "protocol", "log", "metrics"},
    # drivers
    # a real cluster for tests, driven like a user (transport: it makes the cluster's keys)
    "testing": {"client", "protocol", "system", "transport"},
    "cli": ANYTHING,
}
PURE = ("log", "protocol")
PURE_THIRD_PARTY = {
    "bson",
    # mypyc's run-time library and native-int types: roq.log._native, the compiled loops
    # (byte readers and writers, no I/O)
    "librt",
    "mypy_extensions",
}
STDLIB_ONLY = ("system",)


def imports(path: Path, root: Path = PACKAGE) -> Iterator[tuple[int, str]]:
    """(line, absolute module name) of every import in the module at `path` under the package
    directory `root`; `from roq import limits` and `from . import segment` name the module
    imported (roq.limits, roq.log.segment)."""
    package = list(path.relative_to(root.parent).parts[:-1])  # ["roq", "log"] for roq/log/*
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield from ((node.lineno, name) for name in _from_names(node, package))


def _from_names(node: ast.ImportFrom, package: list[str]) -> list[str]:
    if node.level:
        if node.level - 1 >= len(package):  # beyond the top: reported as such
            dots = "." * node.level
            return [dots + (node.module or alias.name) for alias in node.names]
        base = package[: len(package) - (node.level - 1)]
    else:
        base = []
    module = ".".join(base + ([node.module] if node.module else []))
    if module == "roq" or (node.level and not node.module):
        # `from roq import limits`, `from . import segment`: the names may be modules
        return [f"{module}.{alias.name}" for alias in node.names]
    return [module]


def component(parts: tuple[str, ...]) -> str:
    """The package (or top-level module) a path under roq/ belongs to."""
    return parts[0] if len(parts) > 1 else parts[0].removesuffix(".py")


def _roq_component(name: str) -> str | None:
    """`roq.log.segment` → "log"; `roq` → "roq"; None for a module outside roq."""
    if name == "roq":
        return "roq"
    if not name.startswith("roq."):
        return None
    return name.split(".")[1]


def check_import(top: str, name: str) -> str | None:
    """Why `name` may not be imported by a module of package `top`, or None."""
    if name.startswith("."):
        return f"imports {name}, a relative import beyond the roq package"
    root = name.split(".")[0]
    owner = OWNERS.get(root)
    if owner is not None and top != owner:
        return f"imports {name}; only roq.{owner} may"
    target = _roq_component(name)
    if target is None:
        return _check_outside(top, name, root)
    allowed = MAY_IMPORT.get(top)
    if allowed is None:
        return f"roq.{top} has no row in check_layers.MAY_IMPORT"
    if target == top or target in BASE or allowed == ANYTHING or target in allowed:
        return None
    return f"roq.{top} may not import roq.{target} ({name})"


def _check_outside(top: str, name: str, root: str) -> str | None:
    stdlib = root in sys.stdlib_module_names
    if top in PURE and (root == "socket" or not (stdlib or root in PURE_THIRD_PARTY)):
        return f"roq.{top} is a pure layer but imports {name}"
    if top in STDLIB_ONLY and not stdlib:
        return f"roq.{top} imports the standard library only, not {name}"
    return None


def violations(root: Path = PACKAGE) -> list[str]:
    found = []
    for path in sorted(root.rglob("*.py")):
        top = component(path.relative_to(root).parts)
        for line, name in sorted(imports(path, root)):
            problem = check_import(top, name)
            if problem is not None:
                found.append(f"{path}:{line}: {problem}")
    return found


if __name__ == "__main__":
    problems = violations()
    for problem in problems:
        print(problem)
    sys.exit(1 if problems else 0)
