#!/bin/bash
# Re-measure one-file vs one-dir (docs/operations.md). Usage, from the repository root:
#   packaging/measure.sh dist/roq/roq onedir
#   packaging/measure.sh dist/roq-onefile onefile
# Prints `--version` time and RSS medians of 11 runs, then starts `BIN up` on ports 28000-29000
# and prints readiness time, process count, RSS, $TMPDIR use and the stop time after SIGTERM.
set -u
bin=$(realpath "$1"); tag=$2; d=/tmp/roq-measure-$tag
med() { sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
rm -rf "$d"; mkdir -p "$d/tmp"
for _ in $(seq 1 11); do /usr/bin/time -f "%e %M" "$bin" --version 2>&1 >/dev/null | tail -1; done > "$d/version"
echo "$tag: --version median $(cut -d' ' -f1 "$d/version" | med) s, max RSS median $(cut -d' ' -f2 "$d/version" | med) KB"
export TMPDIR=$d/tmp
start=$(date +%s.%N)
"$bin" up --data-dir "$d/data" -D zk.servers=127.0.0.1:28181 -D ports.base=28000 \
  -D gcm.ports.base=28000 -D hcm.port=28100 -D monitor.base.port=28500 \
  -D statmonitor.base.port=28800 -D exchange.base.port=28900 -D ports.max.perkind=10 > "$d/up.log" 2>&1 &
pid=$!
for _ in $(seq 1 1200); do grep -q "roq is up" "$d/up.log" && break; sleep 0.05; done
echo "$tag: ready after $(echo "$(date +%s.%N) - $start" | bc) s"
pids=$(ps -e -o pid=,args= | awk -v b="$bin" '$2 == b {print $1}')
total=0; for p in $pids; do total=$((total + $(awk '/VmRSS/ {print $2}' "/proc/$p/status"))); done
echo "$tag: $(echo "$pids" | wc -w) roq processes, RSS $((total / 1024)) MB, TMPDIR $(du -sh "$TMPDIR" | cut -f1)"
kill -TERM "$pid"; t0=$(date +%s.%N); wait "$pid"; rc=$?
echo "$tag: exit $rc $(echo "$(date +%s.%N) - $t0" | bc) s after SIGTERM"
sleep 1; echo "$tag: left behind: $(ps -e -o args= | awk -v b="$bin" '$1 == b' | wc -l)"
