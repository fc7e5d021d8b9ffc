#!/bin/sh
# Interleaved A/B of the 100 B batched row (docs/benchmarks.md §1b, §1d): the tree of a commit
# (A) against this working tree (B), each on its own `roq up` cluster running its own code.
#
#   benchmarks/ab_commit.sh BASE_COMMIT OUT.jsonl [more ab_trees.py options, e.g. --zk-port N
#       --base P --b-offset 1500: cluster A uses P..P+1004, B P+1500..P+2504]
#
# The lead re-runs it after a merge with the pre-merge main as BASE_COMMIT.
set -eu
base=$1
out=$2
shift 2
python=${PYTHON:-.venv/bin/python}
tree=$(mktemp -d /tmp/roq-ab-XXXXXX)
trap 'rm -rf "$tree"' EXIT
git archive "$base" appliance packaging | tar -x -C "$tree"
# A's compiled batch loops, built from A's own source as `make native` builds B's: the archive
# holds no extension, and without one A would run pure Python against a compiled B
if [ -f "$tree/packaging/build_native.py" ]; then
    "$python" "$tree/packaging/build_native.py"
fi
"$python" benchmarks/ab_trees.py --a "$tree" --b . --pairs 5 --seconds 5 \
    -D useLog=true -D log.flush=interval -D replicationFactor=1 \
    -D log.retention.bytes=2000000000 -D scaling.policy=null --out "$out" "$@"
"$python" benchmarks/ab_trees.py --summarize "$out"
