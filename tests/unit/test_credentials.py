"""The cluster's secrets on disk (issue 23, docs/security.md §2): written once, private, found
by clients in the documented order, and refused with a reason when malformed."""

from __future__ import annotations

import json
import re
import stat
from pathlib import Path

import pytest

from roq.errors import SecurityError
from roq.transport import security


def test_the_first_start_writes_private_files_and_a_second_keeps_them(tmp_path: Path):
    first = security.generate(tmp_path / "s")
    again = security.generate(tmp_path / "s")
    assert first == again
    for name in (security.CLUSTER_FILE, security.ADMIN_FILE):
        assert stat.S_IMODE((tmp_path / "s" / name).stat().st_mode) == 0o600
    assert stat.S_IMODE((tmp_path / "s").stat().st_mode) == 0o700
    admin = security.load_credentials(tmp_path / "s" / security.ADMIN_FILE)
    assert admin.server_public == first.keys.public and admin.zk_auth == first.zk_auth
    assert [p.name for p in first.principals] == ["admin"]
    assert first.principals[0].key == admin.keys.public


def test_clients_look_for_credentials_in_the_documented_order(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv(security.CREDENTIALS_ENV, raising=False)
    monkeypatch.delenv(security.HOME_ENV, raising=False)
    with pytest.raises(SecurityError, match="no roq credentials found"):
        security.find_credentials(None)
    security.generate(tmp_path / "roq-data" / "security")  # what `roq up` writes here
    default = Path("roq-data/security/admin.json")
    assert security.find_credentials(None) == default
    security.generate(tmp_path / "home" / "security")
    monkeypatch.setenv(security.HOME_ENV, str(tmp_path / "home"))
    assert security.find_credentials(None) == tmp_path / "home" / "security" / "admin.json"
    monkeypatch.setenv(security.CREDENTIALS_ENV, str(default))
    assert security.find_credentials(None) == default
    with pytest.raises(SecurityError, match=r"nowhere\.json"):  # explicit: no fallback
        security.find_credentials(tmp_path / "nowhere.json")
    monkeypatch.setenv(security.CREDENTIALS_ENV, str(tmp_path / "gone.json"))
    with pytest.raises(SecurityError, match=r"gone\.json"):  # named in the environment: the same
        security.find_credentials(None)


@pytest.mark.parametrize(
    "content",
    ["", "[]", "{", json.dumps({"principal": "a"}), json.dumps({"principal": "a", "public": "x"}),
     "x" * (70 * 1024)],
)  # fmt: skip
def test_malformed_credentials_are_refused_with_a_reason(tmp_path: Path, content: str):
    path = tmp_path / "c.json"
    path.write_text(content)
    with pytest.raises(SecurityError, match=re.escape(str(path))):
        security.load_credentials(path)
