"""The frozen executable on its own: version, help, and every bad configuration or environment
ends with one line naming the problem and the documented exit code, within a bound."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest
from appliance_support import ROOT, last_line, run_frozen

from roq import errors
from roq.testing.cluster import PortBlocks

pytestmark = pytest.mark.e2e


def test_version(frozen_roq: Path) -> None:
    import roq

    result = run_frozen(frozen_roq, "--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"roq {roq.__version__}")


@pytest.mark.parametrize(
    "mode",
    [
        "gcm",
        "host",
        "up",
        "http",
        "monitor",
        "exchange",
        "queue",
        "status",
        "pub",
        "sub",
        "bench",
        "log",
    ],
)
def test_every_mode_is_in_the_executable(frozen_roq: Path, mode: str) -> None:
    result = run_frozen(frozen_roq, mode, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage: roq " + mode in " ".join(result.stdout.split())


@pytest.mark.parametrize(
    ("content", "reason"),
    [
        ("ports.base=abc\n", "expected an integer"),
        ("zk.sesion.timeout=5000\n", "unknown key"),
    ],
)
def test_invalid_config_file_exits_78(
    frozen_roq: Path, tmp_path: Path, content: str, reason: str
) -> None:
    path = tmp_path / "GCM.properties"
    path.write_text(content)
    result = run_frozen(frozen_roq, "gcm", "-c", str(path))
    assert result.returncode == errors.EXIT_CONFIG
    assert reason in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_missing_config_file_exits_78(frozen_roq: Path, tmp_path: Path) -> None:
    result = run_frozen(frozen_roq, "host", "-c", str(tmp_path / "nope.properties"))
    assert result.returncode == errors.EXIT_CONFIG
    assert (
        result.stderr.strip()
        == f"roq: {tmp_path / 'nope.properties'}: configuration file not found"
    )


def test_unreachable_zookeeper_exits_69_within_bound(
    frozen_roq: Path, port_blocks: PortBlocks
) -> None:
    # A port bound but not listening refuses connections, and no other process (another
    # test's ZooKeeper) can take it meanwhile.
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        dead = holder.getsockname()[1]
        started = time.monotonic()
        # The shipped GCM.properties is accepted: the failure is the next step, ZooKeeper.
        result = run_frozen(
            frozen_roq,
            "gcm",
            "-c",
            str(ROOT / "config" / "GCM.properties"),
            "-D",
            f"zk.servers=127.0.0.1:{dead}",
            "-D",
            f"ports.base={port_blocks.take(6)}",
            timeout_s=40,
        )
    assert result.returncode == errors.EXIT_UNAVAILABLE
    assert time.monotonic() - started < 25
    assert f"cannot reach ZooKeeper at 127.0.0.1:{dead}" in last_line(result.stderr)
    assert "Traceback" not in result.stderr


def test_unwritable_log_directory_exits_73(frozen_roq: Path, tmp_path: Path) -> None:
    # The tests may run as root, which ignores permissions: a path through a file fails for all.
    blocker = tmp_path / "file"
    blocker.write_text("")
    result = run_frozen(frozen_roq, "host", "-D", f"directory={blocker}/log")
    assert result.returncode == errors.EXIT_CANTCREAT
    assert (
        result.stderr.strip()
        == f"roq: log directory {blocker}/log is not writable: Not a directory"
    )


def test_port_taken_exits_75(frozen_roq: Path, zookeeper: str, port_blocks: PortBlocks) -> None:
    base = port_blocks.take(6)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", base))
        squatter.listen()
        result = run_frozen(
            frozen_roq,
            "gcm",
            "-D",
            f"ports.base={base}",
            "-D",
            f"zk.servers={zookeeper}",
            "-D",
            "zk.namespace=/roq-test-port-taken",
            timeout_s=40,
        )
    assert result.returncode == errors.EXIT_TEMPFAIL, result.stderr
    assert str(base) in last_line(result.stderr)
    assert "Traceback" not in result.stderr


def test_host_port_taken_exits_75(
    frozen_roq: Path, zookeeper: str, port_blocks: PortBlocks, tmp_path: Path
) -> None:
    port = port_blocks.take(1)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        result = run_frozen(
            frozen_roq,
            "host",
            "-D",
            f"hcm.port={port}",
            "-D",
            f"zk.servers={zookeeper}",
            "-D",
            "zk.namespace=/roq-test-port-taken",
            "-D",
            f"directory={tmp_path}/log",
            timeout_s=40,
        )
    assert result.returncode == errors.EXIT_TEMPFAIL, result.stderr
    assert str(port) in last_line(result.stderr)
    assert "Traceback" not in result.stderr


def test_analytics_dependencies_stay_out(frozen_roq: Path) -> None:
    # pyspark and friends belong to spark-submit's Python, not to the appliance.
    bundled = " ".join(p.name.lower() for p in (frozen_roq.parent / "_internal").iterdir())
    for name in ("pyspark", "py4j", "pyarrow", "matplotlib", "numpy", "pandas"):
        assert name not in bundled
    assert sum(f.stat().st_size for f in frozen_roq.parent.rglob("*") if f.is_file()) < 100e6


def test_http_port_taken_exits_75(frozen_roq: Path, port_blocks: PortBlocks) -> None:
    """`roq http` imports its server (uvicorn, starlette: hidden imports of the spec) before it
    binds: a taken port proves they are in the executable and gives the daemons' exit 75."""
    port = port_blocks.take(1)
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        result = run_frozen(frozen_roq, "http", "-D", f"http.port={port}", timeout_s=40)
    assert result.returncode == errors.EXIT_TEMPFAIL, result.stderr
    assert str(port) in last_line(result.stderr)
    assert "Traceback" not in result.stderr
