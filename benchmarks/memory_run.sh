#!/usr/bin/env bash
# Exchange resident memory over a long full-rate run, optionally with a stalled subscriber
# (docs/benchmarks.md §4). Needs a running cluster (GCM at $GCM) whose ZooKeeper namespace
# contains $NS; creates queue $QUEUE (a fresh exchange) through `roq bench`.
#
#   GCM=127.0.0.1:24000 NS=roq-bench-r2 QUEUE=mem1 SECONDS_=300 STALL=0 benchmarks/memory_run.sh
#   GCM=127.0.0.1:24000 NS=roq-bench-r2 QUEUE=mem2 SECONDS_=200 STALL=1 benchmarks/memory_run.sh
#
# Writes $OUT/memory-$QUEUE.jsonl (VmRSS/CPU every 10 s) and $OUT/memory-$QUEUE.bench.json
# (the bench summary); OUT defaults to benchmarks/results.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
py=${PYTHON:-$here/../.venv/bin/python}
roq=${ROQ:-$here/../.venv/bin/roq}
out=${OUT:-$here/results}
mkdir -p "$out"
: "${GCM:?}" "${NS:?}" "${QUEUE:?}" "${SECONDS_:=300}" "${STALL:=0}"

# Create the queue first so its exchange exists before the load (and before the stalled SUB).
timeout 60 "$roq" bench --gcm "$GCM" -q "$QUEUE" --seconds 1 --payload 100 >/dev/null 2>&1
pattern="roq exchange $QUEUE .*$NS"
pid=$(pgrep -f "$pattern" | head -1)
port=$(tr '\0' ' ' </proc/"$pid"/cmdline | sed -n 's/.*--port \([0-9]*\).*/\1/p')
echo "exchange pid $pid front port $port" >&2

stall_pid=""
if [ "$STALL" = 1 ]; then
  timeout $((SECONDS_ + 60)) "$py" "$here/stalled_sub.py" "tcp://127.0.0.1:$((port + 1))" \
    --seconds $((SECONDS_ + 20)) >"$out/memory-$QUEUE.stalled.json" &
  stall_pid=$!
  sleep 1
fi
timeout $((SECONDS_ + 120)) "$py" "$here/proc_watch.py" --match "$pattern" \
  --seconds $((SECONDS_ + 20)) --every 10 >"$out/memory-$QUEUE.jsonl" &
watch_pid=$!
timeout $((SECONDS_ + 120)) "$roq" bench --gcm "$GCM" -q "$QUEUE" --seconds "$SECONDS_" \
  --payload 100 --linger-ms 2 2>"$out/memory-$QUEUE.bench.stderr" | "$py" -c \
  'import json,sys; d=json.loads(sys.stdin.read()); d.pop("series",None); print(json.dumps(d))' \
  >"$out/memory-$QUEUE.bench.json"
wait "$watch_pid"
if [ -n "$stall_pid" ]; then wait "$stall_pid" || true; fi
cat "$out/memory-$QUEUE.bench.json"
tail -n 1 "$out/memory-$QUEUE.jsonl"
