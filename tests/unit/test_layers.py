import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from check_layers import MAY_IMPORT, check_import, violations


def test_layering_rules_hold():
    assert violations() == []


def test_every_package_has_a_row():
    root = Path(__file__).resolve().parents[2] / "appliance" / "roq"
    packages = {p.name for p in root.iterdir() if (p / "__init__.py").exists()}
    assert packages <= set(MAY_IMPORT)


@pytest.mark.parametrize(
    ("top", "name", "why"),
    [
        ("client", "roq.analytics.kpi", "may not import roq.analytics"),
        ("host", "roq.exchange.service", "may not import roq.exchange"),
        ("monitor", "roq.gcm.management", "may not import roq.gcm"),
        ("analytics", "roq.transport", "may not import roq.transport"),
        ("protocol", "roq.config", "may not import roq.config"),
        ("log", "roq.config.components", "may not import roq.config"),
        ("log", "socket", "pure layer"),
        ("protocol", "kazoo.client", "only roq.coordination"),
        ("log", "numpy", "pure layer"),
        ("system", "roq.client", "may not import roq.client"),
        ("system", "bson", "standard library only"),
        ("exchange", "zmq", "only roq.transport"),
        ("newpackage", "roq.log", "no row"),
    ],
)
def test_forbidden_imports_are_named(top, name, why):
    problem = check_import(top, name)
    assert problem is not None and why in problem


@pytest.mark.parametrize(
    ("top", "name"),
    [
        ("monitor", "roq.client.admin"),
        ("local", "roq.client.admin"),
        ("client", "roq.protocol.latency"),
        ("log", "roq.limits"),
        ("protocol", "bson"),
        ("cli", "roq.exchange.service"),
        ("analytics", "roq"),
        ("transport", "zmq"),
    ],
)
def test_allowed_imports_pass(top, name):
    assert check_import(top, name) is None


def test_relative_imports_are_resolved(tmp_path):
    root = tmp_path / "roq"
    (root / "client").mkdir(parents=True)
    (root / "log").mkdir()
    for init in (root, root / "client", root / "log"):
        (init / "__init__.py").write_text("")
    (root / "client" / "feed.py").write_text(
        "from . import sequencer\nfrom ..analytics import kpi\nfrom .. import monitor\n"
    )
    (root / "log" / "segment.py").write_text("from .format import x\nfrom ... import beyond\n")
    found = [line.split(": ", 1)[1] for line in violations(root)]
    assert found == [
        "roq.client may not import roq.analytics (roq.analytics)",
        "roq.client may not import roq.monitor (roq.monitor)",
        "imports ...beyond, a relative import beyond the roq package",
    ]
