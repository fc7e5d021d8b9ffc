"""Principals and permissions (issue 23, docs/security.md §5): the pure model, the admin API's
authorizer, the ZAP gate's decisions per socket domain, and the HTTP bearer tokens principals
hold (their digests, the admin's first one)."""

from __future__ import annotations

import json
import os

import pytest

from roq import limits
from roq.errors import SecurityError
from roq.gcm.access import Quota, authorize
from roq.protocol.commands import AdminCommand, Reason
from roq.protocol.principals import (
    ALL,
    Permission,
    Principal,
    decode,
    grant_prefix,
    new_token,
    refusal,
    reserve_gateway_queues,
    reserved,
    token_digest,
)
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


def test_a_principal_creates_queues_up_to_its_quota_while_another_still_can():
    """Issue 31, finding 7: queues.per.principal counts the queues under a principal's admin
    grants; the operator (admin on every queue) is held to none; the list is read only for a
    creation by a principal held to it."""
    queues = ["a.1", "a.2", "b.1", "http-0"]
    asked: list[int] = []

    def listed() -> list[str]:
        asked.append(1)
        return queues

    quota = Quota(2, listed)
    tenant_a = Principal("ta", KEY, {"a.": frozenset({Permission.ADMIN})})
    tenant_b = Principal("tb", KEY, {"b.": frozenset({Permission.ADMIN})})
    create = {"CMD": AdminCommand.CREATE_QUEUE_AUTOMATICALLY, "QName": "a.3"}
    refused = authorize(tenant_a, create, quota)
    assert refused is not None and refused["ERROR"] == Reason.FORBIDDEN
    assert refused["COMMENT"] == (
        "principal ta administers 2 queues: its quota (queues.per.principal = 2)"
    )
    assert authorize(tenant_b, {**create, "QName": "b.2"}, quota) is None  # another still can
    assert authorize(Principal("ops", KEY, {"": ALL}), create, quota) is None
    assert authorize(Principal("cluster", "", superuser=True), create, quota) is None
    calls = len(asked)
    assert authorize(tenant_a, {"CMD": AdminCommand.STOP_QUEUE, "QName": "a.1"}, quota) is None
    assert len(asked) == calls  # no count for anything but a creation


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
    # a refusal to locate names the permission the asker wants the monitor for, not admin
    locate = {"CMD": AdminCommand.GET_HOST_BY_QNAME, "QName": "q1", "Need": "publish"}
    refused = authorize(READER, locate)
    assert refused is not None
    assert refused["COMMENT"] == "principal reader lacks permission 'publish' on queue 'q1'"
    assert authorize(READER, {**locate, "Need": "subscribe"}) is None
    refused = authorize(READER, {"CMD": AdminCommand.GET_HOST_BY_QNAME, "QName": "q2"})
    assert refused is not None and refused["COMMENT"] == (  # an older client: all four named
        "principal reader lacks permission 'publish', 'subscribe', 'consume' or 'admin' "
        "on queue 'q2'"
    )
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


# --- HTTP bearer tokens (docs/http.md §Authentication) ---------------------------------------
DIGEST = token_digest("roq_a-token")


def test_tokens_are_stored_as_digests_and_round_trip():
    token = new_token()
    assert token.startswith("roq_") and len(token) >= 40 and new_token() != token
    digest = token_digest(token)
    holder = READER.with_token(digest)
    assert holder.tokens == (digest,) and token not in json.dumps(holder.encode())
    assert decode(holder.encode()) == holder
    assert decode(holder.encode()).tokens == (digest,)
    # a grant or a revocation keeps the tokens; dropping them keeps the grants
    assert holder.granted("x", [Permission.PUBLISH]).tokens == (digest,)
    assert holder.revoked("q1", [Permission.SUBSCRIBE]).tokens == (digest,)
    assert holder.without_tokens() == READER
    assert "tokens" not in READER.encode()  # a principal without tokens is written as before


def test_a_record_from_before_tokens_still_decodes():
    old = {"name": "reader", "key": KEY, "grants": {"q1": ["subscribe"]}, "format": 2}
    assert decode(old) == READER and decode(old).tokens == ()


def test_topic_grants_and_queue_grants_never_overlap():
    """Issue 31, finding 4: `topic:news` covers the HTTP topics news… and no queue; `news` the
    queues news… and no topic; `topic:` every topic."""
    both = Principal("p", KEY, {"topic:news": frozenset({Permission.PUBLISH}),
                                "q": frozenset({Permission.SUBSCRIBE})})  # fmt: skip
    assert both.allows_topic(Permission.PUBLISH, "newsroom")
    assert not both.allows_topic(Permission.PUBLISH, "sport")
    assert not both.allows(Permission.PUBLISH, "newsroom")  # no queue
    assert both.allows(Permission.SUBSCRIBE, "q1") and not both.allows_topic(
        Permission.SUBSCRIBE, "q1"
    )
    every = Principal("e", KEY, {"topic:": frozenset({Permission.SUBSCRIBE})})
    assert every.allows_topic(Permission.SUBSCRIBE, "anything")
    assert not every.allows(Permission.SUBSCRIBE, "anything")
    assert decode(both.encode()) == both and both.encode()["format"] == 2
    assert grant_prefix("*") == "" and grant_prefix("topic:*") == "topic:"


def test_a_grant_written_before_topic_grants_keeps_both_meanings():
    """A record without `format` was written when a grant covered queues and topics alike: it
    still covers both, as a queue grant and a topic grant, which its next write shows."""
    old = decode({"name": "fan", "key": KEY, "grants": {"news": ["publish", "subscribe"]}})
    assert old.allows(Permission.PUBLISH, "news1") and old.allows_topic(Permission.PUBLISH, "news1")
    assert sorted(old.encode()["grants"]) == ["news", "topic:news"]
    narrowed = decode(old.revoked("news", [Permission.PUBLISH, Permission.SUBSCRIBE]).encode())
    assert narrowed.allows_topic(Permission.SUBSCRIBE, "news1")
    assert not narrowed.allows(Permission.SUBSCRIBE, "news1")
    with pytest.raises(ValueError, match="unknown record format 3"):
        decode({"name": "fan", "key": KEY, "grants": {}, "format": 3})


def test_the_gateways_queues_are_the_clusters():
    """No grant gives publish, subscribe or consume on `<http.queue.prefix>-N`: a grant on `http`
    (or every queue) held the queue http-0, every topic's messages; admin stays grantable."""
    wide = Principal("w", KEY, {"": ALL, "topic:": ALL})
    for permission in (Permission.PUBLISH, Permission.SUBSCRIBE, Permission.CONSUME):
        assert not wide.allows(permission, "http-0")
        assert refusal(wide, [permission], "http-0") == reserved("http-0")
    assert wide.allows(Permission.ADMIN, "http-0") and wide.allows(Permission.PUBLISH, "http-x")
    assert wide.allows(Permission.PUBLISH, "https-0")
    try:
        reserve_gateway_queues("web")
        assert not wide.allows(Permission.PUBLISH, "web-3") and wide.allows(
            Permission.PUBLISH, "http-0"
        )
    finally:
        reserve_gateway_queues("http")
    cluster = Principal("cluster", "", superuser=True)
    assert cluster.allows(Permission.PUBLISH, "http-0")


def test_a_principal_holds_a_bounded_number_of_tokens():
    holder = READER
    for n in range(limits.principal_tokens_max):
        holder = holder.with_token(token_digest(f"t{n}"))
    with pytest.raises(ValueError, match="--revoke-all"):
        holder.with_token(DIGEST)
    assert decode(holder.encode()) == holder  # at the edge
    too_many = {**holder.encode(), "tokens": [DIGEST] * (limits.principal_tokens_max + 1)}
    with pytest.raises(ValueError, match="at most"):
        decode(too_many)


@pytest.mark.parametrize(
    ("tokens", "fault"),
    [
        ("abc", "'tokens' is not a list"),
        ({"d": DIGEST}, "'tokens' is not a list"),
        ([None], "not 64 lowercase hex"),
        ([7], "not 64 lowercase hex"),
        (["roq_a-token"], "not 64 lowercase hex"),  # a token itself is never stored
        ([DIGEST.upper()], "not 64 lowercase hex"),
        ([DIGEST + "0"], "not 64 lowercase hex"),
        ([DIGEST[:-1]], "not 64 lowercase hex"),
    ],
)
def test_malformed_token_lists_are_refused_with_a_reason(tokens, fault):
    with pytest.raises(ValueError, match=fault) as refused:
        decode({"name": "a", "key": KEY, "tokens": tokens})
    assert "principal a" in str(refused.value)


def test_the_first_start_gives_the_admin_a_token_and_old_files_still_load(tmp_path):
    secrets = security.generate(tmp_path)
    admin_doc = json.loads((tmp_path / security.ADMIN_FILE).read_text())
    cluster_doc = json.loads((tmp_path / security.CLUSTER_FILE).read_text())
    token = admin_doc["token"]
    (admin,) = secrets.principals
    assert admin.tokens == (token_digest(token),)
    assert token not in json.dumps(cluster_doc)  # cluster.json holds only the digest
    assert security.load_credentials(tmp_path / security.ADMIN_FILE).token == token
    assert (tmp_path / security.ADMIN_FILE).stat().st_mode & 0o777 == 0o600
    # files written before tokens: no token, and everything else as before
    old = tmp_path / "old"
    old.mkdir()
    del cluster_doc["tokens"], admin_doc["token"]
    (old / security.CLUSTER_FILE).write_text(json.dumps(cluster_doc))
    (old / security.ADMIN_FILE).write_text(json.dumps(admin_doc))
    assert security.load_cluster(old).principals[0].tokens == ()
    assert security.load_credentials(old / security.ADMIN_FILE).token == ""
    (old / security.CLUSTER_FILE).write_text(json.dumps({**cluster_doc, "tokens": {"admin": 1}}))
    with pytest.raises(SecurityError, match="'tokens'"):
        security.load_cluster(old)


# --- a host's principals file, as its monitors and exchanges follow it (issue 31, finding 6) ---
CLUSTER_KEY = "c" * 40


def _many(count: int) -> list[Principal]:
    """`count` principals with 16 tokens each: ~1.2 KB apiece in the file."""
    return [
        Principal(
            f"p{n}",
            f"{n:040d}",
            {"q": frozenset({Permission.PUBLISH})},
            tokens=tuple(token_digest(f"roq_{n}_{t}") for t in range(16)),
        )
        for n in range(count)
    ]


@pytest.fixture
def gate() -> security.Gate:
    gate = security.Gate()
    gate.replace([], CLUSTER_KEY)
    return gate


def _allowed(gate: security.Gate, key: str) -> bool:
    return gate.callback(security.ZAP_DOMAIN, key.encode())


def test_a_table_of_thousands_of_principals_is_read_whole_and_a_revocation_reaches_it(
    tmp_path, gate
):
    """It was read up to 1 MiB (~850 such principals) and the old table kept: revoked keys
    passed. 3,000 is 3.6 MB; the bound now is the declared limit's."""
    path = tmp_path / ".host-h1.principals"
    table = _many(3_000)
    security.write_principals(path, table)
    assert path.stat().st_size > 3 * 1024 * 1024
    follower = security.PrincipalsFile(path, [], gate)
    follower.check()
    assert _allowed(gate, table[-1].key)
    security.write_principals(path, table[:-1])  # the last one revoked
    follower.check()
    assert not _allowed(gate, table[-1].key) and _allowed(gate, table[0].key)
    assert limits.principals_file_bytes_max >= limits.principals_max * 1_200


@pytest.mark.parametrize("damage", ["corrupt", "not a list", "a directory", "too large", "gone"])
def test_a_table_that_cannot_be_read_denies_every_key_but_the_clusters_and_says_so(
    tmp_path, gate, caplog, damage
):
    path = tmp_path / ".host-h1.principals"
    security.write_principals(path, [READER])
    follower = security.PrincipalsFile(path, [], gate)
    follower.check()
    assert _allowed(gate, KEY)
    path.unlink()
    if damage == "corrupt":
        path.write_bytes(b'[{"name": "reader", "key": "' + KEY.encode())  # torn mid-write
    elif damage == "not a list":
        path.write_text('{"reader": 1}')
    elif damage == "a directory":
        path.mkdir()  # unreadable even by root
    elif damage == "too large":
        with path.open("wb") as file:  # sparse: no disk spent
            file.truncate(limits.principals_file_bytes_max + 1)
    with caplog.at_level("ERROR", logger="roq.transport.security"):
        follower.check()
        follower.check()  # said once per state of the file
    assert not _allowed(gate, KEY) and _allowed(gate, CLUSTER_KEY)
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and str(path) in errors[0], errors
    # the next change written is read again
    if path.is_dir():
        path.rmdir()
    security.write_principals(path, [READER])
    follower.check()
    assert _allowed(gate, KEY)


def test_a_host_that_cannot_write_the_table_removes_the_old_one(tmp_path, gate, caplog):
    path = tmp_path / ".host-h1.principals"
    security.publish_principals(path, [READER])
    follower = security.PrincipalsFile(path, [], gate)
    follower.check()
    assert _allowed(gate, KEY)
    # the next write fails for real: its temporary file's name is taken by a directory
    blocker = path.with_name(f".{path.name}.{os.getpid()}")
    blocker.mkdir()
    with caplog.at_level("ERROR", logger="roq.transport.security"):
        security.publish_principals(path, [])  # reader revoked, not written
    assert not path.exists()
    assert any("not written" in r.getMessage() for r in caplog.records)
    follower.check()
    assert not _allowed(gate, KEY) and _allowed(gate, CLUSTER_KEY)
    blocker.rmdir()
    security.publish_principals(path, [READER])
    follower.check()
    assert _allowed(gate, KEY)


def test_before_its_host_writes_the_table_a_child_uses_the_seed(tmp_path, gate):
    follower = security.PrincipalsFile(tmp_path / ".host-h1.principals", [READER], gate)
    follower.check()
    assert _allowed(gate, KEY)
