#!/usr/bin/env bash
# Issue 42: a run checkpointed at N ranks mid-epoch and resumed at M != N, against the
# uninterrupted N-rank run with the same seed and examples (Fashion-MNIST train, t10k held out,
# MLR, 3 epochs, batch 50, lr 0.05). Prints each run's final held-out metric and rounds.
#   benches/elastic-resize.sh [N [M ...]]     (default: 8 -> 4 7 10 16; results: elastic-resize.md)
# SYNCS: the modes, ';'-separated (default: allreduce;asap --graph ring;ssp;bosen --bandwidth-mbps 100).
# SEEDS: the seeds, space-separated (default: 5).
# AT_M=1: also the uninterrupted M-rank runs, to tell the resize from the rank count's own effect.
# ASAP_TRAIN: the binary to run (default: target/release/asap-train).
# PARTITION: --partition (default: iid; e.g. dirichlet:0.5 for label-skewed shards).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-8}; shift || true
MS=${*:-4 7 10 16}
IFS=';' read -ra SYNC_LIST <<< "${SYNCS:-allreduce;asap --graph ring;ssp;bosen --bandwidth-mbps 100}"
OUT=$(mktemp -d /tmp/elastic-resize.XXXX)
cp "${ASAP_TRAIN:-target/release/asap-train}" "$OUT/asap-train"   # a rebuild during the runs cannot change it
BIN="$OUT/asap-train"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
steps=$((60000 / N / 50))   # the smallest shard's (iid) and the mean shard's (label-skewed) alike
stop=$((steps * 3 / 2))   # mid-epoch 1
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'), binary ${ASAP_TRAIN:-target/release/asap-train}, load $(cut -d' ' -f1-3 /proc/loadavg)"
metric() {
  python3 -c "import json,sys; s=[l for l in map(json.loads, open(sys.argv[1])) if l['event']=='summary'][-1]; print(s['final_metric'], s['rounds'])" "$1" 2>/dev/null || echo "no summary"
}
# One run; a failed one is reported with its log's first error line, and the others go on.
run() {
  local n=$1 log=$2; shift 2
  mpirun -n "$n" $BIN "$@" > "$log" 2>&1 || { echo "FAILED (exit $?): $(grep -m 1 'error' "$log")"; return 1; }
}
for seed in ${SEEDS:-5}; do
  common=(train --epochs 3 --batch-size 50 --lr 0.05 --seed "$seed" --eval-every 1000000 --partition "${PARTITION:-iid}")
  for sync in "${SYNC_LIST[@]}"; do
    # The whole option string names the runs: two variants of one mode must not share files.
    tag=$(printf '%s' "$sync" | tr -c 'A-Za-z0-9.' '_')-s$seed
    # A round is --sync-every mini-batches: the cut stays at the same step of mid-epoch 1.
    k=$(sed -n 's/.*--sync-every[ =]\([0-9]*\).*/\1/p' <<< "$sync"); at=$((stop / ${k:-1}))
    run "$N" "$OUT/$tag-full.log" "${common[@]}" --sync $sync --metrics "$OUT/$tag-full.jsonl" || true
    echo "$sync seed $seed: $N ranks uninterrupted: $(metric "$OUT/$tag-full.jsonl")"
    # A mode that cannot checkpoint (--notify deadline) says so, and has nothing to resume.
    run "$N" "$OUT/$tag-ck.log" "${common[@]}" --sync $sync --checkpoint-dir "$OUT/$tag-ck" --max-rounds "$at" || continue
    for m in $MS; do
      cp -r "$OUT/$tag-ck" "$OUT/$tag-ck$m"
      run "$m" "$OUT/$tag-$m.log" "${common[@]}" --sync $sync --checkpoint-dir "$OUT/$tag-ck$m" --resume --metrics "$OUT/$tag-$m.jsonl" || true
      echo "$sync seed $seed: $N -> $m ranks at round $at: $(metric "$OUT/$tag-$m.jsonl")"
      if [ "${AT_M:-0}" = 1 ]; then
        run "$m" "$OUT/$tag-full$m.log" "${common[@]}" --sync $sync --metrics "$OUT/$tag-full$m.jsonl" || true
        echo "$sync seed $seed: $m ranks uninterrupted: $(metric "$OUT/$tag-full$m.jsonl")"
      fi
    done
  done
done
echo "# runs and logs in $OUT"
