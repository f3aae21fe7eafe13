#!/usr/bin/env bash
# Every table of issue 12's "done when", one benches/asap-win.sh run each, in one markdown file:
#   benches/asap-win-all.sh [OUT.md]     (default runs/asap-win-all.md; ~30-60 min on 2 cores)
# REPS (runs per variant, see asap-win.sh) and BIN pass through; ONLY=iid runs the IID tables only.
# Set BIN to a copy of the binary if you will rebuild meanwhile.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/asap-win-all.md}
mkdir -p "$(dirname "$OUT")"
: > "$OUT"
table() { # table TITLE ENV... -- ARGS...
    local title=$1; shift
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    { echo; echo "### $title"; echo; echo "\`${envs[*]} benches/asap-win.sh $*\`"; echo; } >> "$OUT"
    env "${envs[@]}" benches/asap-win.sh "$@" >> "$OUT"
}
table "MLR, IID, 8 ranks, ranks 0 and 1 2x slow (sleeping)" MODEL=mlr -- stragglers sleep
table "MLR, IID, 8 ranks, no stragglers" MODEL=mlr -- even
table "MLR, IID, 8 ranks, ranks 0 and 1 2x slow (spinning)" MODEL=mlr -- stragglers busy
if [ "${ONLY:-}" = iid ]; then
    table "MLR, IID, 32 ranks, ranks 0 and 1 2x slow (sleeping), batch 64" MODEL=mlr NP=32 BATCH=64 -- stragglers sleep
    exit 0
fi
for part in dirichlet:0.5 by-label:2; do
    for model in mlr mlp; do
        table "${model^^}, $part, 8 ranks, ranks 0 and 1 2x slow (sleeping)" MODEL=$model PARTITION=$part -- stragglers sleep
        table "${model^^}, $part, 8 ranks, no stragglers" MODEL=$model PARTITION=$part -- even
    done
done
# 32 ranks at batch 64: the same number of rounds per epoch as 8 ranks at batch 256.
table "MLR, IID, 32 ranks, ranks 0 and 1 2x slow (sleeping), batch 64" MODEL=mlr NP=32 BATCH=64 -- stragglers sleep
