"""`roq analytics`: run the Spark job over a message log and its KPI log (docs/analytics.md)."""

from __future__ import annotations

import typer

from roq.cli.app import app
from roq.cli.common import errors_to_exit, fail


@app.command()
def analytics(
    log_dir: str = typer.Option(
        ..., "--log-dir", help="Holds <queue>/<exchange>/*.log (or s3a://)."
    ),
    out: str = typer.Option(..., "--out", help="Where the Parquet tables and the report go."),
    master: str = typer.Option("local[2]", "--master", help="Spark master URL."),
    kpi_dir: str | None = typer.Option(None, "--kpi-dir", help="Holds _kpi/ (default: log dir)."),
    split_mb: int = typer.Option(64, "--split-mb", min=1, help="MiB of segment per Spark task."),
    report_dir: str | None = typer.Option(None, "--report-dir", help="Local report directory."),
    driver_memory: str = typer.Option("1g", "--driver-memory", help="spark-submit's value."),
) -> None:
    """Throughput, latency, CPU and memory per queue, exchange, producer and minute."""
    from roq.analytics import submit

    job_args = ["--split-bytes", str(split_mb << 20)]
    if kpi_dir:
        job_args += ["--kpi-dir", kpi_dir]
    if report_dir:
        job_args += ["--report-dir", report_dir]
    with errors_to_exit():
        code = submit.run(log_dir, out, master, job_args, driver_memory)
    if code != 0:
        raise fail(f"spark-submit exited with {code}", code)
