"""Builds and runs the spark-submit command for the job (no pyspark import: the CLI uses it).

The job file is roq/analytics/job.py; the roq package goes to the executors as a zip with
--py-files, so a cluster's workers need only Python with pyspark, pyarrow and pymongo installed.
packaging/roq-analytics.sh does the same in shell for machines without the roq CLI.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import roq
from roq.errors import ConfigError, NoInput

PACKAGE = Path(roq.__file__).resolve().parent
JOB = PACKAGE / "analytics" / "job.py"
JOB_TIMEOUT_S = 6 * 3600.0  # a job that runs longer is stuck: spark-submit is killed


def find_spark_submit() -> str:
    """spark-submit from SPARK_HOME, next to this Python (a venv with pyspark), or on PATH."""
    candidates = []
    if os.environ.get("SPARK_HOME"):
        candidates.append(Path(os.environ["SPARK_HOME"]) / "bin" / "spark-submit")
    candidates.append(Path(sys.executable).parent / "spark-submit")
    for candidate in candidates:
        if candidate.is_file():
            return str(candidate)
    found = shutil.which("spark-submit")
    if found is None:
        raise ConfigError("spark-submit not found: pip install 'roq[analytics]' or set SPARK_HOME")
    return found


def zip_package(directory: str) -> str:
    """The roq package as a zip for --py-files (source files only)."""
    path = os.path.join(directory, "roq.zip")
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for source in sorted(PACKAGE.rglob("*.py")):
            archive.write(source, source.relative_to(PACKAGE.parent).as_posix())
    return path


def command(
    log_dir: str, out: str, master: str, py_files: str, job_args: list[str], driver_memory: str
) -> list[str]:
    return [
        find_spark_submit(),
        "--master", master,
        "--name", "roq-analytics",
        "--driver-memory", driver_memory,
        "--conf", "spark.sql.session.timeZone=UTC",
        "--conf", "spark.ui.enabled=false",
        "--py-files", py_files,
        str(JOB), log_dir, out, *job_args,
    ]  # fmt: skip


def environment(master: str) -> dict[str, str]:
    """Executors run this Python; a local master binds to loopback only (ecosystem notes §2)."""
    env = dict(os.environ)
    env["PYSPARK_PYTHON"] = sys.executable
    env["PYSPARK_DRIVER_PYTHON"] = sys.executable
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    if master.startswith("local"):
        env.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    return env


def check_input(log_dir: str, kpi_dir: str | None = None) -> int:
    """How many segment files the job would read; NoInput (exit 66) at once when the directory
    does not exist or holds none: a job over nothing took ~40 s of Spark to report "every batch
    passed its CRC" and exit 0 (issue 32)."""
    try:
        from roq.analytics import files  # pyarrow: the analytics extra
    except ImportError as error:
        raise ConfigError(f"{error}: pip install 'roq[analytics]'") from None
    for option, where in (("--log-dir", log_dir), ("--kpi-dir", kpi_dir)):
        if where and "://" not in where and not os.path.isdir(where):
            raise NoInput(f"{option} {where} does not exist or is not a directory")
    found = len(files.list_segments(log_dir, "log"))
    found += len(files.list_segments(kpi_dir or log_dir, "kpi"))
    if not found:
        kpi = f" nor {kpi_dir}/_kpi/<source>/" if kpi_dir else " nor _kpi/<source>/"
        raise NoInput(
            f"--log-dir {log_dir} holds no log segment (<queue>/<exchange>/<offset>.log){kpi}"
            ": nothing to analyse (a host's log directory, `directory` in HCM.properties?)"
        )
    return found


def run(
    log_dir: str,
    out: str,
    master: str = "local[2]",
    job_args: list[str] | None = None,
    driver_memory: str = "1g",
    timeout_s: float = JOB_TIMEOUT_S,
) -> int:
    """Run the job to completion; return spark-submit's exit code."""
    with tempfile.TemporaryDirectory(prefix="roq-analytics-") as tmp:
        argv = command(log_dir, out, master, zip_package(tmp), job_args or [], driver_memory)
        return subprocess.run(
            argv, env=environment(master), timeout=timeout_s, check=False
        ).returncode
