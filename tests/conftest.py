"""Shared fixtures: one real ZooKeeper per test worker, a fresh roq cluster per test."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from roq.local.zkserver import ZooKeeperServer
from roq.testing.cluster import LocalCluster, PortBlocks


def _worker_index() -> int:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    return int(worker.removeprefix("gw") or 0)


@pytest.fixture(scope="session")
def port_blocks() -> PortBlocks:
    # Below the kernel's ephemeral range (32768+), so client sockets never take our ports.
    # ROQ_TEST_PORT_BASE lets two suites share a machine without sharing ports.
    base = int(os.environ.get("ROQ_TEST_PORT_BASE", "21000"))
    start = base + 5000 * _worker_index()
    return PortBlocks(start, start + 5000)


@pytest.fixture(scope="session")
def zookeeper(tmp_path_factory: pytest.TempPathFactory, port_blocks: PortBlocks) -> Iterator[str]:
    server = ZooKeeperServer(tmp_path_factory.mktemp("zookeeper"), port_blocks.take(1))
    server.start()
    yield server.connect_string
    server.stop()


@pytest.fixture
def cluster(tmp_path: Path, zookeeper: str, port_blocks: PortBlocks) -> Iterator[LocalCluster]:
    local = LocalCluster(tmp_path, zookeeper, port_blocks)
    yield local
    local.stop()


@pytest.fixture
def tls_files(tmp_path: Path) -> dict[str, Path]:
    """A self-signed certificate for 127.0.0.1 and its key, and another key (not its own), as
    PEM files: made here with the `cryptography` package (a dev dependency), no CA needed."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key, other = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(key, hashes.SHA256())
    )
    files = {"cert": tmp_path / "cert.pem", "key": tmp_path / "key.pem",
             "other_key": tmp_path / "other.pem"}  # fmt: skip
    files["cert"].write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    for which, private in (("key", key), ("other_key", other)):
        files[which].write_bytes(
            private.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
    return files


# --- nothing a test starts may write into the checkout ------------------------------------------
# A daemon started without `security.dir` writes the cluster's keys to roq-data/security in its
# working directory: in the checkout, where a later `roq` command (or test) would find and use
# them. Found twice (the supervisor and frozen-binary tests); now a run that leaves roq-data/
# behind, where there was none, fails.
CHECKOUT_DATA = Path(__file__).resolve().parents[1] / "roq-data"


def pytest_sessionstart(session: pytest.Session) -> None:
    session.config.stash[_DATA_BEFORE] = CHECKOUT_DATA.exists()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if hasattr(session.config, "workerinput"):  # an xdist worker: the controller checks once
        return
    if not session.config.stash.get(_DATA_BEFORE, True) and CHECKOUT_DATA.exists():
        print(f"\nFAILED: a test wrote {CHECKOUT_DATA} (give its daemons a security.dir "
              "and a log directory of their own)")  # fmt: skip
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


_DATA_BEFORE = pytest.StashKey[bool]()


# --- a hung test ends its worker, with every thread's stack, rather than the whole run ----------
# pytest-timeout's signal method runs in the main thread between bytecodes: a test blocked inside
# a C call (zmq's Context.term waiting for a socket a leaked thread still holds) never sees it, and
# a clean-clone CI run hung there for good. faulthandler's watchdog is a C thread: past the test's
# timeout plus a grace it writes every thread's stack to a file and exits the worker; xdist reports
# the test as crashed and starts another worker, and the controller prints the stacks.
WATCHDOG_DIR = Path(__file__).resolve().parents[1] / ".pytest-watchdog"
WATCHDOG_GRACE_S = 60.0  # (session fixtures stop in the last test's teardown: covered too)


def _watchdog_file(config: pytest.Config) -> Path:
    worker = getattr(config, "workerinput", {}).get("workerid", "main")
    WATCHDOG_DIR.mkdir(exist_ok=True)
    return WATCHDOG_DIR / f"{worker}-{os.getpid()}.txt"


def _arm_watchdog(config: pytest.Config, seconds: float, what: str) -> None:
    import faulthandler

    out = _watchdog_file(config).open("a")
    out.write(f"\n=== watchdog: {what} still running after {seconds:.0f} s; worker exits ===\n")
    out.flush()
    faulthandler.dump_traceback_later(seconds, exit=True, file=out)
    config.stash[_WATCHDOG_OUT] = out


def _disarm_watchdog(config: pytest.Config) -> None:
    import faulthandler

    faulthandler.cancel_dump_traceback_later()
    out = config.stash.get(_WATCHDOG_OUT, None)
    if out is not None:
        out.close()
        _watchdog_file(config).unlink(missing_ok=True)  # nothing hung: no report


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    marker = item.get_closest_marker("timeout")
    limit = marker.args[0] if marker and marker.args else item.config.getini("timeout")
    timeout = float(limit or 120)
    _arm_watchdog(item.config, timeout + WATCHDOG_GRACE_S, item.nodeid)
    yield
    _disarm_watchdog(item.config)


def pytest_configure(config: pytest.Config) -> None:
    if not hasattr(config, "workerinput"):  # the controller: no stale reports of another run
        for stale in WATCHDOG_DIR.glob("*.txt") if WATCHDOG_DIR.exists() else ():
            stale.unlink()


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    for report in sorted(WATCHDOG_DIR.glob("*.txt")) if WATCHDOG_DIR.exists() else ():
        text = report.read_text(errors="replace")
        if "Timeout (" in text:  # the watchdog fired (a worker that merely exited has no stacks)
            terminalreporter.section(f"watchdog: {report.name}")
            terminalreporter.write(text[-60_000:])


_WATCHDOG_OUT = pytest.StashKey[object]()
