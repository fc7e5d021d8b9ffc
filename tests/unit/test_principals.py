"""Principals and permissions (issue 23, docs/security.md §5): the pure model, the admin API's
authorizer and the ZAP gate's decisions per socket domain."""

from __future__ import annotations

import pytest

from roq.gcm.access import authorize
from roq.protocol.commands import AdminCommand, Reason
from roq.protocol.principals import ALL, Permission, Principal, decode, refusal
from roq.transport import security

KEY = "k" * 40
READER = Principal("reader", KEY, {"q1": frozenset({Permission.SUBSCRIBE})})


def test_deny_by_default_and_grants_by_prefix():
    nobody = Principal("nobody", KEY)
    assert not any(nobody.allows(p, "q1") for p in Permission)
    writer = nobody.granted("orders.", [Permission.PUBLISH])
    assert writer.allows(Permission.PUBLISH, "orders.eu")
    assert not writer.allows(Permission.PUBLISH, "payments")
    assert not writer.allows(Permission.SUBSCRIBE, "orders.eu")
    assert writer.granted("", ALL).allows(Permission.ADMIN, "anything")
    assert writer.revoked("orders.", [Permission.PUBLISH]).grants == {}


def test_a_refusal_names_the_missing_permission():
    assert refusal(READER, [Permission.SUBSCRIBE], "q1") is None
    why = refusal(READER, [Permission.PUBLISH], "q1")
    assert why == "principal reader lacks permission 'publish' on queue 'q1'"
    assert "revoked" in str(refusal(None, [Permission.SUBSCRIBE], "q1"))


@pytest.mark.parametrize(
    "doc",
    [
        None,
        [],
        {"name": "cluster", "key": KEY},  # the cluster's own name is not a principal's
        {"name": "../x", "key": KEY},
        {"name": "a", "key": "short"},
        {"name": "a", "key": KEY, "grants": {"q": ["fly"]}},
        {"name": "a", "key": KEY, "grants": {"q": "publish"}},
        {"name": "a", "key": KEY, "grants": {"q" * 65: ["publish"]}},
    ],
)
def test_bad_principal_documents_are_refused_with_a_reason(doc):
    with pytest.raises(ValueError):
        decode(doc)


def test_encode_decode_round_trip():
    assert decode(READER.encode()) == READER


def test_the_admin_api_needs_admin_to_change_and_any_right_to_locate():
    create = {"CMD": AdminCommand.CREATE_QUEUE_AUTOMATICALLY, "QName": "q1"}
    refused = authorize(READER, create)
    assert refused is not None and refused["ERROR"] == Reason.FORBIDDEN
    assert "lacks permission 'admin' on queue 'q1'" in refused["COMMENT"]
    assert authorize(READER, {"CMD": AdminCommand.GET_HOST_BY_QNAME, "QName": "q1"}) is None
    assert authorize(READER, {"CMD": AdminCommand.GET_HOST_BY_QNAME, "QName": "q2"}) is not None
    assert authorize(READER, {"CMD": AdminCommand.GET_STATUS}) is None
    assert authorize(None, {"CMD": AdminCommand.GET_STATUS}) is not None  # revoked
    admin = Principal("admin", KEY, {"": ALL})
    assert authorize(admin, create) is None


def test_the_gate_admits_by_socket_domain():
    gate = security.Gate()
    cluster_key = "c" * 40
    gate.replace([READER], cluster_key)
    subscribe = security.access_domain(Permission.SUBSCRIBE, queue="q1")
    publish = security.access_domain(Permission.PUBLISH, queue="q1")
    reader = security.access_domain(Permission.CONSUME, Permission.SUBSCRIBE, queue="q1")
    cluster = security.access_domain(cluster=True)
    assert gate.callback(security.ZAP_DOMAIN, KEY.encode())
    assert gate.callback(subscribe, KEY.encode())
    assert not gate.callback(publish, KEY.encode())
    assert gate.callback(reader, KEY.encode())  # one of the two is enough
    assert not gate.callback(cluster, KEY.encode())
    assert gate.callback(cluster, cluster_key.encode())
    assert not gate.callback(security.ZAP_DOMAIN, ("u" * 40).encode())
    gate.replace([])  # revoked: the cluster's own key stays
    assert not gate.callback(subscribe, KEY.encode())
    assert gate.callback(publish, cluster_key.encode())
