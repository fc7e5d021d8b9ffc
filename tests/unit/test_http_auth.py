"""The HTTP gateway's checks that need no process: which principal a bearer token is, what a
refusal says (auth.py), and the TLS files it refuses to start with (service.check_tls).
tests/integration/test_http.py runs both through a real gateway."""

from __future__ import annotations

from pathlib import Path

import pytest

from roq import limits
from roq.errors import ConfigError
from roq.http.api import BadRequest, Rate, Share
from roq.http.auth import Access, Refused
from roq.http.service import check_tls
from roq.protocol.principals import Permission, Principal, new_token, token_digest

TOKEN = new_token()
WRITER = Principal("writer", "k" * 40, {"topic:news": frozenset({Permission.PUBLISH})}).with_token(
    token_digest(TOKEN)
)


def _refused(access: Access, header: str | None) -> Refused:
    with pytest.raises(Refused) as refused:
        access.caller(header)
    return refused.value


def test_a_token_is_its_principal_until_the_table_drops_it():
    access = Access(secured=True)
    access.replace([WRITER])
    assert access.caller(f"Bearer {TOKEN}") is WRITER
    assert access.caller(f"bearer  {TOKEN} ") is WRITER  # the scheme is case-insensitive
    access.replace([WRITER.without_tokens()])
    refused = _refused(access, f"Bearer {TOKEN}")
    assert refused.status == 401 and 'error="invalid_token"' in refused.challenge


@pytest.mark.parametrize(
    ("header", "fragment"),
    [
        (None, "needs a bearer token"),
        ("", "not 'Bearer <token>'"),
        ("Bearer", "not 'Bearer <token>'"),
        ("Bearer ", "not 'Bearer <token>'"),
        (f"Basic {TOKEN}", "not 'Bearer <token>'"),
        ("Bearer " + "x" * limits.http_authorization_chars_max, "not 'Bearer <token>'"),
        ("Bearer roq_unknown", "not known"),
        ("Bearer \udc80", "not known"),  # a lone surrogate hashes, and is no token
        (f"Bearer {token_digest(TOKEN)}", "not known"),  # the digest is not the token
    ],
    # named, not shown: TOKEN is random, and xdist's workers must collect the same ids
    ids=[
        "none",
        "empty",
        "bearer",
        "bearer-space",
        "basic",
        "too-long",
        "unknown",
        "surrogate",
        "digest",
    ],
)
def test_missing_malformed_and_unknown_tokens_are_401_with_a_challenge(header, fragment):
    access = Access(secured=True)
    access.replace([WRITER])
    refused = _refused(access, header)
    assert refused.status == 401 and fragment in refused.reason
    assert refused.challenge.startswith('Bearer realm="roq"')
    assert TOKEN not in refused.reason


def test_a_principal_without_the_permission_on_the_topic_is_403_naming_it():
    Access.check(WRITER, Permission.PUBLISH, "news1")
    with pytest.raises(Refused) as refused:
        Access.check(WRITER, Permission.SUBSCRIBE, "news1")
    assert refused.value.status == 403
    assert refused.value.reason == "principal writer lacks permission 'subscribe' on topic 'news1'"
    with pytest.raises(Refused, match="'publish' on topic 'sports'"):
        Access.check(WRITER, Permission.PUBLISH, "sports")


def test_a_queue_grant_reaches_no_topic():
    """Topics have a grant namespace of their own (issue 31, finding 4): a grant on queue prefix
    `news` (or every queue) lets no caller publish to topic `news`."""
    queues = Principal("q", "q" * 40, {"news": frozenset({Permission.PUBLISH}), "": frozenset()})
    with pytest.raises(Refused, match="'publish' on topic 'news'"):
        Access.check(queues, Permission.PUBLISH, "news")
    with pytest.raises(Refused, match="on every topic"):
        Access.check_any(queues, Permission.PUBLISH)


def test_with_security_off_no_token_is_asked():
    access = Access(secured=False)
    caller = access.caller(None)
    assert caller.superuser
    Access.check(caller, Permission.SUBSCRIBE, "anything")


def test_tls_files_are_checked_before_serving(tls_files: dict[str, Path], tmp_path: Path):
    cert, key, other = (str(tls_files[k]) for k in ("cert", "key", "other_key"))
    assert check_tls(cert, key) is True
    assert check_tls("", "") is False
    junk = tmp_path / "junk.pem"
    junk.write_text("not a certificate\n")
    for args, fragment in [
        ((cert, ""), "go together"),
        (("", key), "go together"),
        ((str(tmp_path / "none.pem"), key), f"http.tls.cert {tmp_path / 'none.pem'}: cannot read"),
        ((cert, str(tmp_path)), f"http.tls.key {tmp_path}: cannot read"),
        ((str(junk), key), f"http.tls.cert {junk}: holds no PEM certificate"),
        ((key, cert), f"http.tls.cert {key}: holds no PEM certificate"),
        ((cert, str(junk)), f"http.tls.key {junk}: holds no unencrypted PEM private key"),
        ((cert, other), f"http.tls.key {other} is not the key of the certificate"),
    ]:
        with pytest.raises(ConfigError) as refused:
            check_tls(*args)
        assert fragment in str(refused.value), (args, refused.value)
        assert refused.value.exit_code == 78


def test_a_permission_held_on_no_topic_is_refused_before_the_body_names_one():
    Access.check_any(WRITER, Permission.PUBLISH)  # news*: the body decides
    with pytest.raises(Refused) as refused:
        Access.check_any(WRITER, Permission.SUBSCRIBE)
    assert refused.value.status == 403
    assert refused.value.reason == "principal writer lacks permission 'subscribe' on every topic"
    Access.check_any(Principal("cluster", "", superuser=True), Permission.SUBSCRIBE)


def test_a_principal_holds_a_bounded_share_of_the_requests_in_progress():
    share = Share(2)
    with share.held(WRITER), share.held(WRITER):
        with pytest.raises(BadRequest) as busy, share.held(WRITER):
            pass
        assert busy.value.status == 429 and "writer has 2 requests" in busy.value.reason
        with share.held(Principal("other", "o" * 40)):  # others are not held back
            pass
        with share.held(Principal("cluster", "", superuser=True)):  # security off: no share
            pass
    with share.held(WRITER):  # released
        assert share.busy == {"writer": 1}


def test_a_principal_past_its_bytes_per_second_waits_with_retry_after():
    """Issue 31, finding 7: http.publish.bytes.per.principal, a bucket of one second's bytes per
    principal; a batch may borrow ahead, then the principal waits; others and the cluster's
    operator (admin on every topic) are not held back."""
    rate = Rate(1000)
    rate.take(WRITER, 600)
    rate.take(WRITER, 3000)  # borrows ahead: the bucket was not empty
    with pytest.raises(BadRequest) as late:
        rate.take(WRITER, 1)
    assert late.value.status == 429 and "(http.publish.bytes.per.principal)" in late.value.reason
    assert late.value.headers is not None and 2 <= int(late.value.headers["Retry-After"]) <= 3
    rate.take(Principal("other", "o" * 40), 1000)
    operator = Principal("ops", "p" * 40, {"topic:": frozenset({Permission.ADMIN})})
    for _ in range(3):
        rate.take(operator, 10_000)
    Rate(0).take(WRITER, 10**9)  # 0: no bound
    rate.refund(WRITER, 5000)  # a publish that stored nothing costs nothing
    rate.take(WRITER, 1)
    rate.buckets["writer"] = (-1e6, rate.buckets["writer"][1] - 10)  # ten seconds later...
    with pytest.raises(BadRequest):
        rate.take(WRITER, 1)  # ...a million bytes borrowed are not paid back yet
