"""The analytics job: `spark-submit job.py LOG_DIR OUT_DIR [--kpi-dir DIR] [--split-bytes N]`.

Driver: lists segment files (names and sizes only), cuts them into byte ranges, and hands the
ranges to executors (roq.analytics.tasks), which stream through them and return rows already
combined per producer and minute. Spark then builds the tables, writes them as Parquet under
OUT_DIR, and the driver collects only the small aggregated tables for the report
(roq.analytics.report). See docs/analytics.md for the tables and the KPI format.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
from collections.abc import Callable
from typing import Any

from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F

from roq.analytics import files, submit, tasks
from roq.errors import NoInput
from roq.protocol.latency import BUCKETS_PER_OCTAVE

log = logging.getLogger("roq.analytics.job")  # __name__ is __main__ under spark-submit

SCHEMAS: dict[str, str] = {
    "traffic": "queue string, exchange string, producer string, minute long, messages long, "
    "bytes long, batches long, first_ts_us long, last_ts_us long, min_seq long, max_seq long",
    "range": "path string, kind string, queue string, source string, size long, batches long, "
    "records long",
    "corrupt": "kind string, path string, queue string, source string, position long, "
    "log_offset long, bytes_skipped long, reason string",
    "xload": "queue string, exchange string, host string, minute long, ts_us long, "
    "period_s double, msgs_per_s double, bytes_per_s double, producers double, "
    "cpu_pct double, mem_rss_bytes double, loadavg double",
    "lat": "queue string, exchange string, subscriber string, minute long, count long, "
    "sum_us double, min_us double, max_us double, idx array<int>, cnt array<long>, "
    "mean_lat_ms double, p99_lat_ms double",
    "qstat": "queue string, minute long, xchanges double, producers double, "
    "bytes_per_s double, msgs_per_s double",
}
PERCENTILES = (50, 90, 99)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="roq-analytics")
    parser.add_argument("log_dir", help="directory or URI holding <queue>/<exchange>/*.log")
    parser.add_argument("out", help="where the Parquet tables go (directory or URI)")
    parser.add_argument("--kpi-dir", default=None, help="holds _kpi/<source>/ (default: LOG_DIR)")
    parser.add_argument("--split-bytes", type=int, default=64 << 20, help="segment bytes per task")
    parser.add_argument("--report-dir", default=None, help="local directory (default: OUT)")
    return parser.parse_args(argv)


def scan_all(spark: SparkSession, args: argparse.Namespace) -> dict[str, DataFrame]:
    """Run the range tasks; one DataFrame per row tag."""
    segments = files.list_segments(args.log_dir, "log")
    segments += files.list_segments(args.kpi_dir or args.log_dir, "kpi")
    plan = files.plan(segments, args.split_bytes)
    log.info("%d segment files, %d tasks", len(segments), len(plan))
    rdd = spark.sparkContext.parallelize(plan, max(len(plan), 1)).flatMap(tasks.run).persist()
    frames = {}
    for tag, schema in SCHEMAS.items():
        # cached: every table reads these, and converting Python rows is the costly step
        frames[tag] = spark.createDataFrame(rdd.filter(_has_tag(tag)).map(_untag), schema).cache()
    return frames


def _has_tag(tag: str) -> Callable[[tasks.Row], bool]:
    return lambda row: bool(row[0] == tag)


def _untag(row: tasks.Row) -> tasks.Row:
    return row[1:]


def _minute_ts(frame: DataFrame) -> DataFrame:
    return frame.withColumn("minute", F.timestamp_seconds(F.col("minute") * 60))


def traffic_table(raw: DataFrame) -> DataFrame:
    """Per queue, exchange, producer and minute (ranges of one file are summed)."""
    keys = ["queue", "exchange", "producer", "minute"]
    return _minute_ts(
        raw.groupBy(keys)
        .agg(
            F.sum("messages").alias("messages"),
            F.sum("bytes").alias("bytes"),
            F.sum("batches").alias("batches"),
            F.min("min_seq").alias("first_seq"),
            F.max("max_seq").alias("last_seq"),
            F.min("first_ts_us").alias("first_ts_us"),
            F.max("last_ts_us").alias("last_ts_us"),
        )
        .withColumn("msgs_per_s", F.col("messages") / 60.0)
        .withColumn("bytes_per_s", F.col("bytes") / 60.0)
    )


def percentiles(lat: DataFrame, keys: list[str]) -> DataFrame:
    """Merge the subscribers' latency histograms per `keys`; p50/p90/p99 as the upper bound of
    the bucket holding the percentile, clamped to the exact min and max."""
    sampled = F.col("count") > 0
    sums = lat.groupBy(keys).agg(
        F.sum("count").alias("samples"),
        F.try_divide(F.sum("sum_us"), F.sum("count")).alias("mean_us"),
        F.min(F.when(sampled, F.col("min_us"))).alias("min_us"),
        F.max(F.when(sampled, F.col("max_us"))).alias("max_us"),
        # what subscribers without histograms report (client/subscriber.py): ms → µs
        (F.avg("mean_lat_ms") * 1000).alias("reported_mean_us"),
        (F.max("p99_lat_ms") * 1000).alias("reported_p99_us"),
    )
    buckets = (
        lat.select(*keys, F.explode(F.arrays_zip("idx", "cnt")).alias("b"))
        .select(*keys, F.col("b.idx").alias("idx"), F.col("b.cnt").alias("cnt"))
        .groupBy(*keys, "idx")
        .agg(F.sum("cnt").alias("cnt"))
    )
    running = Window.partitionBy(*keys).orderBy("idx").rowsBetween(Window.unboundedPreceding, 0)
    buckets = buckets.withColumn("cum", F.sum("cnt").over(running)).withColumn(
        "total", F.sum("cnt").over(Window.partitionBy(*keys))
    )
    picks = [
        F.min(F.when(F.col("cum") >= F.col("total") * (p / 100.0), F.col("idx"))).alias(f"i{p}")
        for p in PERCENTILES
    ]
    result = sums.join(buckets.groupBy(keys).agg(*picks), keys, "left")
    for p in PERCENTILES:
        upper = F.pow(F.lit(2.0), F.col(f"i{p}") / BUCKETS_PER_OCTAVE)
        clamped = F.greatest(F.least(upper, F.col("max_us")), F.col("min_us"))
        result = result.withColumn(f"p{p}_us", clamped).drop(f"i{p}")
    return result


def exchange_table(traffic: DataFrame, xload: DataFrame) -> DataFrame:
    """Per queue, exchange and minute: the log's counts joined with the exchange's KPI."""
    keys = ["queue", "exchange", "minute"]
    counts = traffic.groupBy(keys).agg(
        F.sum("messages").alias("messages"),
        F.sum("bytes").alias("bytes"),
        F.countDistinct("producer").alias("producers"),
        F.min("first_ts_us").alias("first_ts_us"),
        F.max("last_ts_us").alias("last_ts_us"),
    )
    counts = _active(counts)
    busy = F.col("msgs_per_s") > 0
    load = (
        _minute_ts(xload)
        .groupBy(keys)
        .agg(
            F.avg("cpu_pct").alias("cpu_pct"),
            (F.max("mem_rss_bytes") / (1024 * 1024)).alias("mem_rss_mb"),
            F.avg("loadavg").alias("loadavg"),
            F.avg("msgs_per_s").alias("kpi_msgs_per_s"),
            F.avg("bytes_per_s").alias("kpi_bytes_per_s"),
            F.first("host", ignorenulls=True).alias("host"),
            # the same over the reports of periods that carried traffic: a 20 s load level in
            # a minute is not diluted by the idle reports before and after it
            F.avg(F.when(busy, F.col("msgs_per_s"))).alias("busy_msgs_per_s"),
            F.avg(F.when(busy, F.col("bytes_per_s"))).alias("busy_bytes_per_s"),
            F.avg(F.when(busy, F.col("cpu_pct"))).alias("busy_cpu_pct"),
        )
    )
    joined = counts.join(load, keys, "full_outer")
    return joined.withColumn("msgs_per_s", F.col("messages") / 60.0).withColumn(
        "bytes_per_s", F.col("bytes") / 60.0
    )


def _active(frame: DataFrame) -> DataFrame:
    """Rates over the part of the minute that saw traffic (at least 1 s): a 5 s benchmark is not
    diluted over 60 s. `msgs_per_s`/`bytes_per_s` stay per whole minute, like the thesis."""
    span = F.greatest((F.col("last_ts_us") - F.col("first_ts_us")) / 1e6, F.lit(1.0))
    return (
        frame.withColumn("active_s", span)
        .withColumn("active_msgs_per_s", F.col("messages") / span)
        .withColumn("active_bytes_per_s", F.col("bytes") / span)
        .drop("first_ts_us", "last_ts_us")
    )


def queue_table(traffic: DataFrame) -> DataFrame:
    counts = traffic.groupBy("queue", "minute").agg(
        F.sum("messages").alias("messages"),
        F.sum("bytes").alias("bytes"),
        F.countDistinct("producer").alias("producers"),
        F.countDistinct("exchange").alias("exchanges"),
        F.min("first_ts_us").alias("first_ts_us"),
        F.max("last_ts_us").alias("last_ts_us"),
    )
    return (
        _active(counts)
        .withColumn("msgs_per_s", F.col("messages") / 60.0)
        .withColumn("bytes_per_s", F.col("bytes") / 60.0)
    )


def producer_table(traffic: DataFrame) -> DataFrame:
    """Per queue and producer; `exchanges` > 1 shows a relocation, `missing` > 0 a gap."""
    return (
        traffic.groupBy("queue", "producer")
        .agg(
            F.sum("messages").alias("messages"),
            F.sum("bytes").alias("bytes"),
            F.countDistinct("exchange").alias("exchanges"),
            F.min("first_seq").alias("first_seq"),
            F.max("last_seq").alias("last_seq"),
            F.min("first_ts_us").alias("first_ts_us"),
            F.max("last_ts_us").alias("last_ts_us"),
        )
        .withColumn("missing", F.col("last_seq") - F.col("first_seq") + 1 - F.col("messages"))
    )


def evaluation_table(exchanges: DataFrame, queues: DataFrame, latency_q: DataFrame) -> DataFrame:
    """The thesis's Figures 5.1/5.2: per queue, load level (producers active on the queue in the
    minute) and exchange: mean throughput, CPU, memory and the queue's latency."""
    load = queues.select("queue", "minute", F.col("producers").alias("load_producers"))
    lat = latency_q.select(
        "queue",
        "minute",
        F.coalesce("p50_us", "reported_mean_us").alias("p50_us"),
        F.coalesce("mean_us", "reported_mean_us").alias("mean_us"),
    )
    per_minute = exchanges.join(load, ["queue", "minute"], "left").join(
        lat, ["queue", "minute"], "left"
    )
    return per_minute.groupBy("queue", "load_producers", "exchange").agg(
        F.count("*").alias("minutes"),
        F.avg("bytes").alias("bytes_per_min"),
        F.avg("msgs_per_s").alias("msgs_per_s"),
        F.avg("active_msgs_per_s").alias("active_msgs_per_s"),
        F.avg("cpu_pct").alias("cpu_pct"),
        F.avg("mem_rss_mb").alias("mem_rss_mb"),
        F.avg("p50_us").alias("latency_p50_us"),
        F.avg("mean_us").alias("latency_mean_us"),
        F.avg("busy_msgs_per_s").alias("busy_msgs_per_s"),
        F.avg("busy_bytes_per_s").alias("busy_bytes_per_s"),
        F.avg("busy_cpu_pct").alias("busy_cpu_pct"),
    )


def segment_table(ranges: DataFrame, corrupt: DataFrame) -> DataFrame:
    per_file = ranges.groupBy("path", "kind", "queue", "source", "size").agg(
        F.sum("batches").alias("batches"), F.sum("records").alias("records")
    )
    bad = corrupt.groupBy("path").agg(
        F.count("*").alias("corrupt_regions"), F.sum("bytes_skipped").alias("corrupt_bytes")
    )
    return per_file.join(bad, "path", "left").fillna(0, ["corrupt_regions", "corrupt_bytes"])


def build(frames: dict[str, DataFrame]) -> dict[str, DataFrame]:
    traffic = traffic_table(frames["traffic"]).cache()
    lat = _minute_ts(frames["lat"])
    queues = queue_table(traffic)
    exchanges = exchange_table(traffic, frames["xload"])
    latency_q = percentiles(lat, ["queue", "minute"])
    return {
        "traffic": traffic,
        "queue_minute": queues,
        "exchange_minute": exchanges,
        "producers": producer_table(traffic),
        "latency": percentiles(lat, ["queue", "exchange", "minute"]),
        "latency_minute": latency_q,
        "latency_total": percentiles(lat, ["queue"]),
        "evaluation": evaluation_table(exchanges, queues, latency_q),
        "queue_stats": _minute_ts(frames["qstat"]),
        "corrupt": frames["corrupt"],
        "segments": segment_table(frames["range"], frames["corrupt"]),
    }


def main(argv: list[str]) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    args = parse_args(argv)
    try:  # spark-submit run by hand (packaging/roq-analytics.sh) refuses it too
        submit.check_input(args.log_dir, args.kpi_dir)
    except NoInput as error:
        log.error("%s", error)
        return error.exit_code
    spark = (
        SparkSession.builder.appName("roq-analytics")
        .config("spark.sql.session.timeZone", "UTC")
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    if not spark.sparkContext.getConf().contains("spark.sql.shuffle.partitions"):
        # the tables are small aggregates: Spark's default of 200 partitions only adds task
        # overhead; a few per core keeps big clusters busy and local runs quick
        parallelism = spark.sparkContext.defaultParallelism
        spark.conf.set("spark.sql.shuffle.partitions", str(max(2, 4 * parallelism)))
    try:
        tables = build(scan_all(spark, args))
        for name, frame in tables.items():
            started = time.monotonic()
            frame.write.mode("overwrite").parquet(files.join(args.out, name))
            log.info("table %s written in %.1f s", name, time.monotonic() - started)
        from roq.analytics import report  # driver only; matplotlib is not needed on executors

        collected = {name: _collect(spark, args.out, name) for name in report.TABLES}
        path = report.write(report_directory(args), collected)
        log.info("wrote %d tables under %s and the report %s", len(tables), args.out, path)
    finally:
        spark.stop()
    return 0


def report_directory(args: argparse.Namespace) -> str:
    """The report is written with plain file I/O on the driver: into OUT when it is local, else
    into --report-dir or ./roq-analytics-report."""
    if args.report_dir:
        return str(args.report_dir)
    return "roq-analytics-report" if "://" in args.out else str(args.out)


def _collect(spark: SparkSession, out: str, name: str) -> list[dict[str, Any]]:
    """Read back one written (aggregated) table for the report, at most REPORT_ROWS rows."""
    from roq.analytics.report import REPORT_ROWS

    frame = spark.read.parquet(files.join(out, name))
    return [row.asDict() for row in frame.limit(REPORT_ROWS).collect()]


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
