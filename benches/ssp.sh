#!/usr/bin/env bash
# SSP on rank-hosted shards, measured. One markdown table per call, every row from this one run:
#   benches/ssp.sh stragglers   8 ranks, 2 of 8 at half speed, Fashion-MNIST MLR to 84 %:
#                               allreduce vs ssp S=0 and S=3 with each apply rule
#   benches/ssp.sh accuracy     8 ranks, no stragglers: final accuracy for S = 0, 2, 10 x rule
#   benches/ssp.sh mf           MovieLens MF held-out RMSE at 1, 4, 8 ranks, S = 0 and 3
#   benches/ssp.sh transport    8 ranks, 2 epochs: every-rank-to-every-rank exchange per round over
#                               one-sided NOTIFY-ACK (asap, complete graph) vs two-sided messages
#                               (ssp S=0) vs MPI_Allreduce: sync time and bytes per round
# Every mode is counted the same way: bytes a rank sent to other ranks while training, its time
# in the sync layer (transfer + waiting), and the final model's assembly counted apart.
# The plain rule adds the M workers' updates, so it runs at 1/M of the others' step size.
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-stragglers}
BIN=${BIN:-target/release/asap-train}
out=runs/ssp-$WHAT
rm -rf "$out"; mkdir -p "$out"
rows=()
. benches/lib.sh
MLR=(--epochs 10 --eval-every 25)
case "$WHAT" in
stragglers)
    S=(--straggler 0,1:2)
    run allreduce 8 "${MLR[@]}" "${S[@]}" --sync allreduce
    run ssp-S0-dynsgd 8 "${MLR[@]}" "${S[@]}" --sync ssp --staleness 0 --apply dynsgd
    run ssp-S3-plain 8 "${MLR[@]}" "${S[@]}" --sync ssp --staleness 3 --apply plain --lr 0.0375
    run ssp-S3-consgd 8 "${MLR[@]}" "${S[@]}" --sync ssp --staleness 3 --apply consgd
    run ssp-S3-dynsgd 8 "${MLR[@]}" "${S[@]}" --sync ssp --staleness 3 --apply dynsgd
    table 0.84 0 ;;
accuracy)
    run allreduce 8 "${MLR[@]}" --sync allreduce
    for S in 0 2 10; do
        run "ssp-S$S-plain" 8 "${MLR[@]}" --sync ssp --staleness $S --apply plain --lr 0.0375
        run "ssp-S$S-consgd" 8 "${MLR[@]}" --sync ssp --staleness $S --apply consgd
        run "ssp-S$S-dynsgd" 8 "${MLR[@]}" --sync ssp --staleness $S --apply dynsgd
    done
    table 0.84 0 ;;
mf)
    datasets/prepare.sh >/dev/null
    MF=(--data datasets/out/movielens-train.ratings --test-data datasets/out/movielens-test.ratings --model mf
        --lr 1 --lambda 0.1 --lr-decay 0.9 --epochs 20 --eval-every 50)
    run none-1rank 1 "${MF[@]}" --sync none
    for np in 4 8; do
        run "allreduce-$np" $np "${MF[@]}" --sync allreduce
        for S in 0 3; do run "ssp-S$S-dynsgd-$np" $np "${MF[@]}" --sync ssp --staleness $S --apply dynsgd; done
    done
    table 0.90 1 ;;
transport)
    T=(--epochs 2 --eval-every 0)
    run allreduce 8 "${T[@]}" --sync allreduce
    run asap-complete-notify-ack 8 "${T[@]}" --sync asap --graph complete
    run ssp-S0-consgd 8 "${T[@]}" --sync ssp --staleness 0 --apply consgd
    python3 - "$out" "${rows[@]}" <<'PY'
import json, sys
out = sys.argv[1]
print("| run | rounds | sync ms/round (mean rank) | sent kB/round/rank | final acc |")
print("|---|---|---|---|---|")
for name in sys.argv[2:]:
    s = [json.loads(l) for l in open(f"{out}/{name}.jsonl")][-1]
    c, r = s["counters"], s["rounds"]
    print(f"| {name} | {r} | {1e3*c['sync_seconds']['mean']/r:.3f} | {c['bytes_sent']['mean']/r/1e3:.1f} | {100*s['final_metric']:.2f} % |")
PY
    ;;
*) echo "usage: benches/ssp.sh stragglers|accuracy|mf|transport" >&2; exit 2 ;;
esac
