#!/bin/sh
# Runs the roq analytics job with spark-submit, the same command `roq analytics` builds.
#   roq-analytics.sh [--master URL] LOG_DIR OUT_DIR [--kpi-dir DIR] [--split-mb N] [--report-dir D]
# LOG_DIR and OUT_DIR may be local paths or s3a:// URIs. Needs a Python (ROQ_PYTHON, default
# python3) with roq[analytics] installed; the roq package is zipped and shipped to the executors.
set -eu
PY=${ROQ_PYTHON:-python3}
MASTER=${ROQ_SPARK_MASTER:-local[2]}
if [ "${1:-}" = "--master" ]; then MASTER=$2; shift 2; fi
PKG=$("$PY" -c 'import os, roq; print(os.path.dirname(roq.__file__))')
SUBMIT=${SPARK_HOME:+$SPARK_HOME/bin/spark-submit}
SUBMIT=${SUBMIT:-$(dirname "$("$PY" -c 'import sys; print(sys.executable)')")/spark-submit}
[ -x "$SUBMIT" ] || SUBMIT=spark-submit
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
(cd "$PKG/.." && "$PY" -m zipfile -c "$TMP/roq.zip" roq)
case "$MASTER" in local*) export SPARK_LOCAL_IP=${SPARK_LOCAL_IP:-127.0.0.1} ;; esac
export PYSPARK_PYTHON=${PYSPARK_PYTHON:-$("$PY" -c 'import sys; print(sys.executable)')}
"$SUBMIT" --master "$MASTER" --name roq-analytics \
  --conf spark.sql.session.timeZone=UTC --conf spark.ui.enabled=false \
  --py-files "$TMP/roq.zip" "$PKG/analytics/job.py" "$@"
