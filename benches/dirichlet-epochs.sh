#!/usr/bin/env bash
# Issue 43 item 9: what an epoch of label-skewed shards is. Before, every rank took the smallest
# shard's ceil(shard / batch) steps an epoch (dirichlet:0.1 at 8 ranks: 2); after, the mean shard's
# (train::plan::steps_per_epoch), smaller shards cycling. Runs the same MLP on Fashion-MNIST with
# both binaries at each seed; the --sync-every 32 run that never synced before; and a run shorter
# than one interval under both rules (1 epoch, --sync-every 300: now refused). Prints one markdown
# table (benches/dirichlet-epochs.md holds its results).
#   BEFORE=/tmp/asap-epoch-before [AFTER=target/release/asap-train] [SEEDS="1 2 3"] [NP=8] \
#     benches/dirichlet-epochs.sh
# About 1 min a run before and 10-20 min after on 2 busy cores (8 ranks oversubscribed).
set -euo pipefail
cd "$(dirname "$0")/.."
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
BEFORE=${BEFORE:?BEFORE=path of the asap-train binary before the change}
AFTER=${AFTER:-target/release/asap-train}
SEEDS=${SEEDS:-1 2 3}
NP=${NP:-8}
ARGS=(--model mlp --hidden 128 --partition dirichlet:0.1 --epochs 10)
out=$(mktemp -d /tmp/dirichlet-epochs.XXXXXX)
one() { # one NAME BINARY ARGS...: a run's metrics and log in $out; a refusal is a result too
    local name=$1 bin=$2; shift 2
    nice -n 19 mpirun -n "$NP" "$bin" train --metrics "$out/$name.jsonl" "$@" > "$out/$name.log" 2>&1 || touch "$out/$name.refused"
}
for seed in $SEEDS; do
    one "before-$seed" "$BEFORE" "${ARGS[@]}" --seed "$seed"
    one "after-$seed" "$AFTER" "${ARGS[@]}" --seed "$seed"
done
for rule in before after; do
    bin=$BEFORE; [ "$rule" = after ] && bin=$AFTER
    one "$rule-every32" "$bin" "${ARGS[@]}" --seed 1 --sync-every 32
    one "$rule-never" "$bin" --model mlp --hidden 128 --partition dirichlet:0.1 --epochs 1 --seed 1 --sync-every 300
done
python3 - "$out" $SEEDS <<'PY'
import json, os, sys
out, seeds = sys.argv[1], sys.argv[2:]
print("| rule | seed | epochs, --sync-every | steps/epoch/rank | rounds | smallest / mean shard | bytes sent/rank | training s | held-out accuracy |")
print("|---|---|---|---|---|---|---|---|---|")
cases = [(f"{r}-{s}", r, s, "10, 1") for s in seeds for r in ("before", "after")]
cases += [(f"{r}-{c}", r, "1", every) for c, every in (("every32", "10, 32"), ("never", "1, 300")) for r in ("before", "after")]
for name, rule, seed, every in cases:
    what = "smallest shard" if rule == "before" else "mean shard"
    if os.path.exists(f"{out}/{name}.refused"):
        why = next((l.strip() for l in open(f"{out}/{name}.log") if "before its first sync" in l), "failed: see the log")
        print(f"| {what} | {seed} | {every} | - | - | - | - | - | refused: {why[:120]}... |")
        continue
    lines = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    start = next(l for l in lines if l["event"] == "start")
    s = next(l for l in lines if l["event"] == "summary")
    sizes = [sum(r) for r in start["class_counts_per_rank"]]
    sent = s["counters"]["bytes_sent"]["mean"]
    print(f"| {what} | {seed} | {every} | {start['steps_per_epoch']} | {s['rounds']} | {min(sizes)} / {start['train_examples'] // len(sizes)} "
          f"| {sent / 1e6:.1f} MB | {s['train_seconds']:.1f} | {100 * s['final_metric']:.2f} % |")
print(f"\n(runs in {out})")
PY
