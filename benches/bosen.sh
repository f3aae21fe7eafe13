#!/usr/bin/env bash
# Bosen managed communication against plain bounded staleness, under an emulated 100 Mbit/s link
# per rank (--emulate-bandwidth; docs/sync-modes.md says what the emulation models). One markdown
# table per call, every row from this one run, 8 ranks:
#   benches/bosen.sh mlr   Fashion-MNIST MLR to 84 % held-out accuracy
#   benches/bosen.sh mf    MovieLens MF to a held-out RMSE of 0.91
#   benches/bosen.sh adarev-mlr | adarev-mf
#                          AdaRevision against multiplicative decay (--lr-schedule decay) at three
#                          initial step sizes each, bosen B = 80 relative (Bosen Figure 3: how
#                          sensitive each schedule is to the initial step size)
# Rows: ssp (S = 2, consgd, no management); bosen with budget B = 40 and 2B = 80 Mbit/s (both
# under the link's 100), random and relative priority, fp16 off/on; allreduce and asap over the
# same emulated link for reference. A clock is a quarter of a pass over the rank's data (Bosen
# counts a whole pass as one clock), so between clocks there is a large unsent update for the
# budget to spend itself on. "clocks to target" is the first clock whose model reaches the target
# (evaluated every clock).
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-mlr}
BIN=target/release/asap-train
out=runs/bosen-$WHAT
rm -rf "$out"; mkdir -p "$out"
rows=()
. benches/lib.sh
LINK=(--emulate-bandwidth 100 --eval-every 1 --staleness 2)
MF=(--data datasets/out/movielens-train.ratings --test-data datasets/out/movielens-test.ratings --model mf
    --lambda 0.1 --lr-decay 0.9 --epochs 20)
case "$WHAT" in
# 235 and 352 mini-batches per pass at 8 ranks.
mlr|adarev-mlr) DATA=(--epochs 6 --sync-every 59); TARGET=(0.84 0); STEPS=(0.03 0.3 3) ;;
mf|adarev-mf) datasets/prepare.sh >/dev/null; DATA=("${MF[@]}" --sync-every 88); TARGET=(0.91 1); STEPS=(0.1 1 10) ;;
*) echo "usage: benches/bosen.sh mlr|mf|adarev-mlr|adarev-mf" >&2; exit 2 ;;
esac
if [[ $WHAT == adarev-* ]]; then
    for eta in "${STEPS[@]}"; do
        for sched in decay adarevision; do
            run "$sched-lr$eta" 8 "${DATA[@]}" "${LINK[@]}" --sync bosen --bandwidth-mbps 80 --lr-schedule $sched --lr $eta
        done
    done
    table "${TARGET[@]}"
    exit 0
fi
[[ $WHAT == mf ]] && DATA+=(--lr 1)
run allreduce 8 "${DATA[@]}" "${LINK[@]}" --sync allreduce
run asap 8 "${DATA[@]}" "${LINK[@]}" --sync asap
run ssp-S2-consgd 8 "${DATA[@]}" "${LINK[@]}" --sync ssp --apply consgd
for B in 40 80; do
    for P in random relative; do
        run "bosen-B$B-$P" 8 "${DATA[@]}" "${LINK[@]}" --sync bosen --bandwidth-mbps $B --priority $P
    done
    run "bosen-B$B-relative-fp16" 8 "${DATA[@]}" "${LINK[@]}" --sync bosen --bandwidth-mbps $B --priority relative --fp16
done
table "${TARGET[@]}"
