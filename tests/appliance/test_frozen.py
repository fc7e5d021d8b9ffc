"""The frozen executable on its own: version, help, and every bad configuration or environment
ends with one line naming the problem and the documented exit code, within a bound."""

from __future__ import annotations

import socket
import subprocess
import time
import uuid
from pathlib import Path

import pytest
from appliance_support import ROOT, frozen_env, last_line, run_frozen

from roq import errors
from roq.testing.cluster import PortBlocks
from roq.transport import security

pytestmark = pytest.mark.e2e


def test_version(frozen_roq: Path) -> None:
    import roq

    result = run_frozen(frozen_roq, "--version")
    assert (result.returncode, result.stdout.strip()) == (0, f"roq {roq.__version__}")


def test_the_compiled_batch_loops_are_in_the_executable(frozen_roq: Path) -> None:
    """The build compiles roq.log._native first (appliance_support._build, as `make dist` after
    `make setup`); the executable carries it and the libraries its C code imports."""
    internal = frozen_roq.parent / "_internal"
    assert sorted(p.name.split(".")[0] for p in (internal / "roq" / "log").glob("_native*.so")) == [
        "_native",
        "_native__mypyc",
    ]
    assert list((internal / "librt").glob("strings*.so")), "librt.strings is not bundled"


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


def _own_keys(tmp_path: Path) -> list[str]:
    """A daemon's first start writes the cluster's keys: here, not in the checkout's roq-data.
    Keys of its own need a namespace of its own: znodes carry the digest ACL of their writer.
    The tests' shared ZooKeeper is plain (each test's keys have a CA of their own)."""
    return ["-D", f"security.dir={tmp_path / 'security'}", "-D", "zk.tls=false"]


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
    frozen_roq: Path, port_blocks: PortBlocks, tmp_path: Path
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
            *_own_keys(tmp_path),
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
    result = run_frozen(frozen_roq, "host", "-D", f"directory={blocker}/log", *_own_keys(tmp_path))
    assert result.returncode == errors.EXIT_CANTCREAT
    assert (
        result.stderr.strip()
        == f"roq: log directory {blocker}/log is not writable: Not a directory"
    )


def test_port_taken_exits_75(
    frozen_roq: Path, zookeeper: str, port_blocks: PortBlocks, tmp_path: Path
) -> None:
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
            f"zk.namespace=/roq-test-port-taken-{uuid.uuid4().hex[:8]}",
            *_own_keys(tmp_path),
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
            f"zk.namespace=/roq-test-port-taken-{uuid.uuid4().hex[:8]}",
            "-D",
            f"directory={tmp_path}/log",
            *_own_keys(tmp_path),
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


def test_http_port_taken_exits_75(
    frozen_roq: Path, port_blocks: PortBlocks, tmp_path: Path
) -> None:
    """`roq http` imports its server (uvicorn, starlette: hidden imports of the spec) before it
    binds: a taken port proves they are in the executable and gives the daemons' exit 75."""
    port = port_blocks.take(1)
    security.generate(tmp_path / "security")  # a gateway reads the keys its cluster wrote
    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", port))
        squatter.listen()
        result = run_frozen(
            frozen_roq, "http", "-D", f"http.port={port}", *_own_keys(tmp_path), timeout_s=40
        )
    assert result.returncode == errors.EXIT_TEMPFAIL, result.stderr
    assert str(port) in last_line(result.stderr)
    assert "Traceback" not in result.stderr


def _aws_env(tmp_path: Path) -> dict[str, str]:
    """boto3's chain holding only a made-up key from the environment: no files, no metadata."""
    return frozen_env() | {
        "AWS_ACCESS_KEY_ID": "AKIDFROZEN",
        "AWS_SECRET_ACCESS_KEY": "frozen-secret",
        "AWS_CONFIG_FILE": str(tmp_path / "none"),
        "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"),
        "AWS_EC2_METADATA_DISABLED": "true",
    }


def test_the_ec2_provisioner_is_in_the_executable(
    frozen_roq: Path, zookeeper: str, port_blocks: PortBlocks, tmp_path: Path
) -> None:
    # A GCM with provisioner=ec2 builds its EC2 client at start: boto3, botocore's EC2 model and
    # endpoint data must be in the executable (the spec keeps only some of botocore's models).
    # Credentials come from the environment; the endpoint is a dead loopback port.
    env = _aws_env(tmp_path)
    defines = {
        "provisioner": "ec2",
        "cloud.image": "ami-1",
        "cloud.region": "eu-west-1",
        "cloud.endpoint": "http://127.0.0.1:1",
        "cloud.cluster.parameter": "/roq/frozen/cluster",
        "zk.servers": zookeeper,
        "ports.base": str(port_blocks.take(6)),
        "security.dir": str(tmp_path / "security"),
        "zk.tls": "false",  # the tests' shared ZooKeeper is plain
    }
    args = [arg for name, value in defines.items() for arg in ("-D", f"{name}={value}")]
    wanted = (
        "ec2 provisioner: region eu-west-1, endpoint http://127.0.0.1:1, AWS credentials from env"
    )
    gcm = subprocess.Popen(
        [str(frozen_roq), "gcm", *args],
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    seen: list[str] = []
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and gcm.stderr is not None:
            line = gcm.stderr.readline()  # the GCM logs on; it ends only when stopped
            seen.append(line)
            if not line or wanted in line:
                break
    finally:
        gcm.terminate()
        gcm.wait(20)
    assert any(wanted in line for line in seen), "".join(seen[-20:])


def test_ssm_is_in_the_executable(frozen_roq: Path, tmp_path: Path) -> None:
    # `roq keys ssm-get` runs on every EC2 host at boot (roq-configure): botocore's SSM model must
    # be in the executable. Without it the client is refused (exit 78, "Unknown service"); with
    # it the request reaches the dead loopback endpoint and fails there (exit 69).
    env = _aws_env(tmp_path)
    args = ["--security-dir", str(tmp_path / "security"), "--region", "eu-west-1"]
    result = subprocess.run(
        [str(frozen_roq), "keys", "ssm-get", "/roq/frozen/cluster", *args,
         "--endpoint", "http://127.0.0.1:1"],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == errors.EXIT_UNAVAILABLE, result.stderr
    assert "ssm GetParameter /roq/frozen/cluster failed: Could not connect" in result.stderr
    assert "Traceback" not in result.stderr and not (tmp_path / "security").exists()
