#!/usr/bin/env bash
# Compressed exchange (issue 40's compression targets): --sync allreduce (error feedback) and
# --sync asap --graph hypercube (CHOCO's public copies) at a tuned interval, without and with
# --compress int8 and topk:0.01, each plain and under the outer optimizer (--outer-optimizer
# nesterov: DiLoCo under allreduce, NoLoCo under asap), 3 seeds, on the non-IID MLP (by-label:2).
# Reports the median and range of the final held-out accuracy and of the bytes a rank sent, and
# each codec's loss and byte ratio against the same run uncompressed. Accuracy and bytes do not
# depend on timing (allreduce and asap's NOTIFY-ACK are deterministic), so a busy machine changes
# only how long this takes (~10 min a mode on an idle machine).
#   benches/compress.sh [OUT]      (OUT: a fresh directory; default runs/compress-<time>)
#   SYNCS="asap" benches/compress.sh OUT    (only the gossip rows; the default is "allreduce asap")
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/compress-$(date +%Y%m%d-%H%M%S)}
mkdir -p "$out"
cp target/release/asap-train "$out/asap-train"   # a rebuild during the runs cannot change it
BIN="$out/asap-train"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
NP=${NP:-8}
EVERY=${EVERY:-8}
# The inner step the default search picks for this model and data at 8 ranks, fixed so that every
# run takes the same steps (benches/low-comm.md).
LR=${LR:-0.0625}
SYNCS=${SYNCS:-allreduce asap}
common=(train --model mlp --hidden 256 --partition by-label:2 --epochs 10 --lr "$LR" --sync-every "$EVERY")
for sync in $SYNCS; do
    # allreduce's runs keep their names of before the gossip rows (a directory of them still counts).
    case $sync in
        allreduce) mode=(--sync allreduce) prefix= ;;
        asap) mode=(--sync asap --graph hypercube) prefix=asap- ;;
        *) echo "SYNCS takes allreduce and asap, got $sync" >&2; exit 2 ;;
    esac
    for outer in none nesterov; do
        for codec in none int8 topk:0.01; do
            for seed in 1 2 3; do
                name="$prefix$outer-${codec/:/-}-s$seed"
                [ -f "$out/$name.jsonl" ] && continue
                mpirun -n "$NP" "$BIN" "${common[@]}" "${mode[@]}" --seed "$seed" --outer-optimizer "$outer" --compress "$codec" \
                    --metrics "$out/$name.jsonl" > "$out/$name.log" 2>&1 || { echo "run $name failed: see $out/$name.log" >&2; exit 1; }
            done
        done
    done
done
python3 - "$out" "$NP" "$EVERY" "$SYNCS" <<'PY'
import json, statistics, sys
out, np_, every, syncs = sys.argv[1:5]
def summary(name):
    for line in open(f"{out}/{name}.jsonl"):
        e = json.loads(line)
        if e["event"] == "summary":
            return 100 * e["final_metric"], e["counters"]["bytes_sent"]["mean"]
def med_range(xs, fmt):
    return f"{fmt(statistics.median(xs))} ({fmt(min(xs))}-{fmt(max(xs))})"
print(f"{np_} ranks, --sync-every {every}, MLP-256 by-label:2, 10 epochs, seeds 1-3: median (range)\n")
print("| sync | outer | codec | held-out % | MB sent/rank | loss vs uncompressed (pt) | fewer bytes |")
print("|---|---|---|---|---|---|---|")
for sync in syncs.split():
    prefix, label = ("", "allreduce") if sync == "allreduce" else ("asap-", "asap hypercube")
    for outer in ["none", "nesterov"]:
        base = None
        for codec in ["none", "int8", "topk-0.01"]:
            rows = [summary(f"{prefix}{outer}-{codec}-s{s}") for s in (1, 2, 3)]
            acc, mb = [r[0] for r in rows], [r[1] / 1e6 for r in rows]
            if codec == "none":
                base = (statistics.median(acc), statistics.median(mb))
            loss = base[0] - statistics.median(acc)
            print(f"| {label} | {outer} | {codec.replace('-', ':')} | {med_range(acc, lambda x: f'{x:.2f}')} | {med_range(mb, lambda x: f'{x:.3f}')} | {loss:+.2f} | {base[1] / statistics.median(mb):.1f}x |")
PY
