#!/usr/bin/env bash
# Issue 43 item 4: what each rank's inner-optimizer state (momentum buffer, Adam's moments and
# step count) should do at a sync of an averaging mode: stay on the rank (--inner-state local,
# DiLoCo's inner AdamW and DDP's local optimizers) or start afresh (reset). Fashion-MNIST (60k
# train, t10k held out), 4 ranks, 3 epochs, cosine schedule after half an epoch of warm-up,
# --sync allreduce averaging every 16 local steps (local SGD), and DiLoCo (the same with
# --outer-optimizer nesterov); both choices at each seed. Prints one markdown table
# (benches/inner-state.md holds its results).
#   [BIN=target/release/asap-train] [SEEDS="1 2 3"] [NP=4] benches/inner-state.sh
# About 4-10 s a run, 24 runs, on 2 busy cores.
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
BIN=${BIN:-target/release/asap-train}
SEEDS=${SEEDS:-1 2 3}
NP=${NP:-4}
COMMON=(--sync allreduce --sync-every 16 --epochs 3 --lr-schedule cosine --warmup-epochs 0.5)
out=$(mktemp -d /tmp/inner-state.XXXXXX)
# name|options (the step sizes: AdamW's usual 2e-3; momentum 0.9's 1e-2 is SGD's 0.1 / (1 - 0.9))
CONFIGS=(
    "mlp adamw local SGD|--model mlp --hidden 64 --inner-optimizer adamw --lr 0.002"
    "mlp adamw DiLoCo|--model mlp --hidden 64 --inner-optimizer adamw --lr 0.002 --outer-optimizer nesterov"
    "mlp momentum local SGD|--model mlp --hidden 64 --inner-optimizer momentum --lr 0.01"
    "mlr adamw local SGD|--model mlr --inner-optimizer adamw --lr 0.002"
)
for c in "${CONFIGS[@]}"; do
    name=${c%%|*}; opts=${c#*|}
    for state in local reset; do
        for seed in $SEEDS; do
            f="$out/${name// /_}-$state-$seed"
            # shellcheck disable=SC2086
            nice -n 10 mpirun -n "$NP" "$BIN" train ${opts} "${COMMON[@]}" --inner-state "$state" --seed "$seed" \
                --metrics "$f.jsonl" > "$f.log" 2>&1 || { echo "run $f failed: see $f.log" >&2; exit 1; }
        done
    done
done
python3 - "$out" "${CONFIGS[@]}" <<'PY'
import json, statistics, sys
out, configs = sys.argv[1], [c.split("|")[0] for c in sys.argv[2:]]
print("| run | --inner-state | held-out accuracy per seed | mean | final objective (mean) |")
print("|---|---|---|---|---|")
import glob
for name in configs:
    for state in ("local", "reset"):
        files = sorted(glob.glob(f"{out}/{name.replace(' ', '_')}-{state}-*.jsonl"))
        sums = [next(json.loads(l) for l in open(f) if '"summary"' in l) for f in files]
        acc = [100 * s["final_metric"] for s in sums]
        obj = [s["objective"] for s in sums]
        print(f"| {name} | {state} | {' / '.join(f'{a:.2f}' for a in acc)} | {statistics.mean(acc):.2f} | {statistics.mean(obj):.4f} |")
PY
echo "runs in $out" >&2
