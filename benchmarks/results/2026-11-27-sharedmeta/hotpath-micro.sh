#!/bin/sh
# Interleaved hotpath_micro rounds (docs/benchmarks.md §1g): main's tree (v1; v2 with a meta per
# record) against this branch (v1; v2 with the meta shared), 600 x 100 B, both with the compiled
# loops (roq.log._native built from the same source). Run from the branch's worktree:
#   A=/tmp/roq-ab-hdrshare-A sh benchmarks/results/2026-11-27-sharedmeta/hotpath-micro.sh > hotpath-micro.jsonl
set -eu
python=${PYTHON:-/work/main/.venv/bin/python}
a=${A:?the main tree: git archive main appliance, plus the built _native .so files}
for round in 1 2 3; do
    for side in main-v1 main-headers branch-v1 branch-headers; do
        case $side in main-*) tree=$a ;; *) tree=$PWD ;; esac
        case $side in *-headers) extra="--headers 2 --header-bytes 32" ;; *) extra="" ;; esac
        # shellcheck disable=SC2086
        PYTHONPATH=$tree/appliance "$python" benchmarks/hotpath_micro.py --cases 600x100 $extra \
            | "$python" -c "import json,sys; [print(json.dumps({'round': $round, 'side': '$side', **json.loads(l)})) for l in sys.stdin]"
    done
done
