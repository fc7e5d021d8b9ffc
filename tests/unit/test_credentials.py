"""The cluster's secrets on disk (issue 23, docs/security.md §2): written once, private, found
by clients in the documented order, and refused with a reason when malformed."""

from __future__ import annotations

import json
import re
import stat
import subprocess
from pathlib import Path

import pytest

from roq.errors import SecurityError
from roq.system.spawn import child_environment, roq_command
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


def _roq(*args: str, credentials: Path) -> subprocess.CompletedProcess[str]:
    env = {**child_environment(), security.CREDENTIALS_ENV: str(credentials)}
    env.pop(security.SECURITY_ENV, None)
    return subprocess.run(roq_command(*args), capture_output=True, text=True, timeout=60,
                          env=env, check=False)  # fmt: skip


def test_roq_keys_token_prints_the_credentials_token_alone(tmp_path: Path):
    """`export ROQ_TOKEN=$(roq keys token)`: the admin's token and nothing else on stdout; the
    credentials of a cluster from before tokens hold none, and it says what to do."""
    security.generate(tmp_path / "s")
    admin = tmp_path / "s" / security.ADMIN_FILE
    printed = _roq("keys", "token", credentials=admin)
    assert printed.returncode == 0, printed.stderr
    assert printed.stdout == json.loads(admin.read_text())["token"] + "\n"
    old = tmp_path / "old.json"
    old.write_text(json.dumps({k: v for k, v in json.loads(admin.read_text()).items()
                               if k != "token"}))  # fmt: skip
    refused = _roq("keys", "token", credentials=old)
    assert refused.returncode == 77 and not refused.stdout
    assert str(old) in refused.stderr and "roq keys token NAME" in refused.stderr
    usage = _roq("keys", "token", "--revoke-all", credentials=admin)
    assert usage.returncode == 2 and "NAME" in usage.stderr and not usage.stdout
