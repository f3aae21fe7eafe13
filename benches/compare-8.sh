#!/usr/bin/env bash
# The ASAP comparison at 8 ranks on Fashion-MNIST MLR: allreduce vs asap on several graphs and
# with the barrier / fully-asynchronous variants, plus a straggler run. Prints one row per run:
# time to the target accuracy (training seconds, evaluation excluded), rounds, bytes sent per rank,
# time in the sync layer per rank, final accuracy. Usage: benches/compare-8.sh [NP] [TARGET] [EPOCHS]
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${1:-8}; TARGET=${2:-0.84}; EPOCHS=${3:-10}
BIN=target/release/asap-train
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p runs/compare
common=(--epochs "$EPOCHS" --target "$TARGET" --eval-every 50)
run() {
    local name=$1; shift
    mpirun -n "$NP" $BIN train "${common[@]}" --metrics "runs/compare/$name.jsonl" "$@" > "runs/compare/$name.log" 2>&1
    python3 - "$name" "runs/compare/$name.jsonl" "$TARGET" <<'PY'
import json, sys
name, path, target = sys.argv[1], sys.argv[2], float(sys.argv[3])
lines = [json.loads(l) for l in open(path)]
s = next(l for l in lines if l["event"] == "summary")
hit = next((e for e in lines if e["event"] == "eval" and (e["test_metric"] or 0) >= target), None)
if hit:
    c = hit["counters"]
    at = (f"t2t={hit['train_seconds']:6.2f}s rounds={hit['round']:5d} sent/rank={c['bytes_sent']['mean']/1e6:7.1f}MB "
          f"sync/rank={c['sync_seconds']['mean']:5.2f}s")
else:
    at = f"t2t=   n/a  rounds=  n/a sent/rank=    n/a   sync/rank=  n/a"
h = (s.get("sync_metrics") or {}).get("consistency_histogram")
print(f"{name:24s} {at} | full run: {s['rounds']} rounds {s['train_seconds']:5.2f}s, final acc {100*s['final_metric']:.2f}%"
      + (f", hist {h}" if h else ""))
PY
}
run allreduce                 --sync allreduce
run asap-root-expander        --sync asap --graph root-expander
run asap-exponential          --sync asap --graph exponential
run asap-ring                 --sync asap --graph ring
run asap-root-barrier         --sync asap --graph root-expander --notify barrier
run asap-root-none            --sync asap --graph root-expander --notify none
# 20 % of the ranks, rounded up, run at half speed.
S="0-$(( (NP + 4) / 5 - 1 )):2"
run allreduce-straggler       --sync allreduce --straggler "$S"
run asap-root-straggler       --sync asap --graph root-expander --straggler "$S"
