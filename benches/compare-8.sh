#!/usr/bin/env bash
# The ASAP comparison at 8 ranks on Fashion-MNIST MLR: allreduce vs asap on several graphs and
# with the barrier / fully-asynchronous variants, plus a straggler run. Prints one row per run:
# time to the target accuracy (training seconds, evaluation excluded), rounds, bytes sent per rank,
# wait time per rank, final accuracy. Usage: benches/compare-8.sh [NP] [TARGET] [EPOCHS]
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${1:-8}; TARGET=${2:-0.84}; EPOCHS=${3:-10}
BIN=target/release/asap-train
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p runs/compare
common=(--epochs "$EPOCHS" --target "$TARGET" --eval-every 200)
run() {
    local name=$1; shift
    mpirun -n "$NP" $BIN train "${common[@]}" --metrics "runs/compare/$name.jsonl" "$@" > "runs/compare/$name.log" 2>&1
    python3 - "$name" "runs/compare/$name.jsonl" <<'PY'
import json, sys
name, path = sys.argv[1], sys.argv[2]
s = [json.loads(l) for l in open(path)][-1]
t = s.get("time_to_target") or {}
c = s["counters"]
print(f"{name:28s} t2t={t.get('train_seconds', float('nan')):7.2f}s rounds={t.get('round', '-')!s:>6} "
      f"total_rounds={s['rounds']:6d} sent/rank={c['bytes_sent']['mean']/1e6:8.1f}MB "
      f"wait/rank={c['wait_seconds']['mean']:6.2f}s train={s['train_seconds']:6.1f}s acc={100*s['final_metric']:.2f}%")
PY
}
run allreduce                 --sync allreduce
run asap-root-expander        --sync asap --graph root-expander
run asap-exponential          --sync asap --graph exponential
run asap-ring                 --sync asap --graph ring
run asap-root-barrier         --sync asap --graph root-expander --notify barrier
run asap-root-none            --sync asap --graph root-expander --notify none
S="0-$(( NP / 5 > 0 ? NP / 5 - 1 : 0 )):2"
run allreduce-straggler       --sync allreduce --straggler "$S"
run asap-root-straggler       --sync asap --graph root-expander --straggler "$S"
