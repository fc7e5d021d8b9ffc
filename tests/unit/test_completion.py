"""Shell completion (issue 32): `roq --install-completion` for bash and zsh, `roq
--show-completion`, and the protocol their scripts speak (typer's: `_ROQ_COMPLETE=complete_bash`
or `complete_zsh`)."""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("_ROQ", "_TYPER", "COMP_"))}
    return {**env, "HOME": str(home), **extra}


def _roq(home: Path, *args: str, **extra: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "roq", *args], env=_env(home, **extra), capture_output=True,
        text=True, timeout=60, check=False, stdin=subprocess.DEVNULL,
    )  # fmt: skip


def _roq_on_path(tmp_path: Path) -> Path:
    """A `roq` on PATH that runs this checkout, as the installed script would."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    script = bin_dir / "roq"
    script.write_text(f'#!/bin/sh\nexec {shlex.quote(sys.executable)} -m roq "$@"\n')
    script.chmod(0o755)
    return bin_dir


@pytest.mark.parametrize(
    ("words", "cword", "offered"),
    [("roq qu", 1, "queue"), ("roq queue cr", 2, "create"), ("roq sub q1 --from-b", 3,
     "--from-beginning")],
)  # fmt: skip
def test_bash_protocol_offers_commands_and_options(
    tmp_path: Path, words: str, cword: int, offered: str
) -> None:
    done = _roq(tmp_path, _ROQ_COMPLETE="complete_bash", COMP_WORDS=words, COMP_CWORD=str(cword))
    assert done.returncode == 0, done.stderr
    assert offered in done.stdout.split(), done.stdout


def test_zsh_protocol_offers_commands(tmp_path: Path) -> None:
    done = _roq(tmp_path, _ROQ_COMPLETE="complete_zsh", _TYPER_COMPLETE_ARGS="roq qu")
    assert done.returncode == 0, done.stderr
    assert '"queue":' in done.stdout, done.stdout


def test_install_completion_in_bash_completes_in_a_real_bash(tmp_path: Path) -> None:
    """From bash, `roq --install-completion` finds the shell, writes the script and sources it
    from ~/.bashrc; that bash, reading ~/.bashrc, completes `roq qu` to `queue`."""
    path = f"{_roq_on_path(tmp_path)}{os.pathsep}{os.environ.get('PATH', '')}"
    # `; true`: bash -c would exec a lone command, and roq's parent would no longer be bash
    done = subprocess.run(
        ["bash", "-c", "roq --install-completion; true"], env=_env(tmp_path, PATH=path),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert "bash completion installed" in done.stdout, done.stdout + done.stderr
    script = tmp_path / ".bash_completions" / "roq.sh"
    assert f"source '{script}'" in (tmp_path / ".bashrc").read_text()
    completes = (
        "source ~/.bashrc; COMP_WORDS=(roq qu); COMP_CWORD=1; _roq_completion roq; "
        'printf "%s\\n" "${COMPREPLY[@]}"'
    )
    done = subprocess.run(
        ["bash", "--norc", "-c", completes], env=_env(tmp_path, PATH=path),
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.stdout.split() == ["queue"], done.stdout + done.stderr


def test_install_completion_for_zsh_writes_its_function(tmp_path: Path) -> None:
    # typer's switch to name the shell instead of detecting it (no zsh on the test machine)
    done = _roq(tmp_path, "--install-completion", "zsh",
                _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1")  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    function = (tmp_path / ".zfunc" / "_roq").read_text()
    assert "#compdef roq" in function and "_ROQ_COMPLETE=complete_zsh roq" in function
    assert "fpath+=~/.zfunc" in (tmp_path / ".zshrc").read_text()


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_show_completion_prints_the_script(tmp_path: Path, shell: str) -> None:
    done = _roq(tmp_path, "--show-completion", shell,
                _TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION="1")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"_ROQ_COMPLETE=complete_{shell}" in done.stdout, done.stdout
