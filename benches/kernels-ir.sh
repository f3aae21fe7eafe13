#!/usr/bin/env bash
# Instructions per example of each model's SGD step (issue 44 item 2), counted by callgrind, so
# that kernels can be compared without the shared machine's load (this KVM guest gives perf no
# hardware counters: `perf stat -e instructions true` says "not supported").
#
#   benches/kernels-ir.sh BIN [MODELS] [SECONDS] [BATCH]
#
# Defaults: svm,logreg,mlr,mlp, 20 s of `bench` per model under valgrind, batch 32. Only
# instructions inside `sgd_step` are counted (--toggle-collect), over the examples bench stepped
# through (its "examples"; a bench without that field: its rate times the seconds, which reads up
# to 5 % high under valgrind). Memory stalls do not show here:
# a step whose time goes to DRAM (svm, logreg: benches/kernels.md) reads few instructions.
set -euo pipefail
bin=${1:?usage: benches/kernels-ir.sh BIN [MODELS] [SECONDS] [BATCH]}
models=${2:-svm,logreg,mlr,mlp}
seconds=${3:-20}
batch=${4:-32}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "| model | flop/example | instructions/example (sgd_step) | flop/instruction |"
echo "|---|---|---|---|"
for m in ${models//,/ }; do
    valgrind --tool=callgrind --callgrind-out-file="$out/cg.$m" --toggle-collect='*Model>::sgd_step' --toggle-collect='*model::Model::sgd_step' \
        "$bin" bench --models "$m" --batch-size "$batch" --seconds "$seconds" --json > "$out/$m.json" 2> "$out/$m.err" \
        || { cat "$out/$m.err" >&2; exit 1; }
    ir=$(sed -n 's/^summary: //p; s/^totals: //p' "$out/cg.$m" | head -1)
    python3 - "$out/$m.json" "$ir" "$seconds" <<'PY'
import json, sys
j = json.loads(open(sys.argv[1]).readline())
ir, seconds = float(sys.argv[2]), float(sys.argv[3])
per = ir / j.get("examples", j["examples_per_second"] * seconds)
print(f"| {j['model']} | {j['flops_per_example']:,.0f} | {per:,.0f} | {j['flops_per_example'] / per:.2f} |")
PY
done
