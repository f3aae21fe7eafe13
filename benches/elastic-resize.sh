#!/usr/bin/env bash
# Issue 42: a run checkpointed at N ranks mid-epoch and resumed at M != N, against the
# uninterrupted N-rank run with the same seed and examples (Fashion-MNIST train, t10k held out,
# MLR, 3 epochs, batch 50, lr 0.05). Prints each run's final held-out metric and rounds.
#   benches/elastic-resize.sh [N [M ...]]     (default: 8 -> 4 7 10 16; results: elastic-resize.md)
# SYNCS: the modes, ';'-separated (default: allreduce;asap --graph ring;ssp;bosen --bandwidth-mbps 100).
# SEEDS: the seeds, space-separated (default: 5).
# PARTITION: --partition (default: iid; e.g. dirichlet:0.5 for label-skewed shards).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${1:-8}; shift || true
MS=${*:-4 7 10 16}
IFS=';' read -ra SYNC_LIST <<< "${SYNCS:-allreduce;asap --graph ring;ssp;bosen --bandwidth-mbps 100}"
OUT=$(mktemp -d /tmp/elastic-resize.XXXX)
cp target/release/asap-train "$OUT/asap-train"   # a rebuild during the runs cannot change it
BIN="$OUT/asap-train"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
steps=$((60000 / N / 50))   # the smallest shard's (iid) and the mean shard's (label-skewed) alike
stop=$((steps * 3 / 2))   # mid-epoch 1
metric() {
  python3 -c "import json,sys; s=[l for l in map(json.loads, open(sys.argv[1])) if l['event']=='summary'][-1]; print(s['final_metric'], s['rounds'])" "$1"
}
for seed in ${SEEDS:-5}; do
  common=(train --epochs 3 --batch-size 50 --lr 0.05 --seed "$seed" --eval-every 1000000 --partition "${PARTITION:-iid}")
  for sync in "${SYNC_LIST[@]}"; do
    tag=${sync%% *}-s$seed
    mpirun -n "$N" $BIN "${common[@]}" --sync $sync --metrics "$OUT/$tag-full.jsonl" > /dev/null 2>&1
    echo "${sync%% *} seed $seed: $N ranks uninterrupted: $(metric "$OUT/$tag-full.jsonl")"
    mpirun -n "$N" $BIN "${common[@]}" --sync $sync --checkpoint-dir "$OUT/$tag-ck" --max-rounds "$stop" > /dev/null 2>&1
    for m in $MS; do
      cp -r "$OUT/$tag-ck" "$OUT/$tag-ck$m"
      mpirun -n "$m" $BIN "${common[@]}" --sync $sync --checkpoint-dir "$OUT/$tag-ck$m" --resume --metrics "$OUT/$tag-$m.jsonl" > /dev/null 2>&1
      echo "${sync%% *} seed $seed: $N -> $m ranks at round $stop: $(metric "$OUT/$tag-$m.jsonl")"
    done
  done
done
