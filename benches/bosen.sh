#!/usr/bin/env bash
# Bosen managed communication against plain bounded staleness, under an emulated 100 Mbit/s link
# per rank (--emulate-bandwidth; docs/sync-modes.md says what the emulation models). One markdown
# table per call, every row from this one run, 8 ranks:
#   benches/bosen.sh mlr   Fashion-MNIST MLR to 84 % held-out accuracy
#   benches/bosen.sh mf    MovieLens MF to a held-out RMSE of 0.91
#   benches/bosen.sh asap-mlr  asap with a budget on its edges where the budget binds: an
#                          exchange every mini-batch (a full MLR message per edge takes ~2.5 ms of
#                          the 100 Mbit/s link, a step ~0.1 ms), B = 10, 20, 40 Mbit/s, against
#                          plain asap and allreduce on the same link (evaluated every 25 rounds)
#   benches/bosen.sh adarev-mlr | adarev-mf
#                          AdaRevision against multiplicative decay (--lr-schedule decay) at three
#                          initial step sizes each, bosen B = 80 relative (Bosen Figure 3: how
#                          sensitive each schedule is to the initial step size)
# Rows: ssp (S = 2, consgd, no management); bosen with budget B = 40 and 2B = 80 Mbit/s (both
# under the link's 100), random and relative priority, fp16 off/on; allreduce and asap over the
# same emulated link for reference; asap with the same budgets on its graph edges
# (--bandwidth-mbps on --sync asap: each round's message carries the rows that fit), followed by
# its per-row accounting (rows sent / held back, torn messages, receiver caches that differ from
# their sender's record at the end). A clock is a quarter of a pass over the rank's data (Bosen
# counts a whole pass as one clock), so between clocks there is a large unsent update for the
# budget to spend itself on. "clocks to target" is the first clock whose model reaches the target
# (evaluated every clock).
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-mlr}
BIN=${BIN:-target/release/asap-train}
out=runs/bosen-$WHAT
rm -rf "$out"; mkdir -p "$out"
rows=()
. benches/lib.sh
asap_rows() { # the per-row accounting of every budgeted asap run so far
python3 - "$out" "${rows[@]}" <<'PY'
import json, sys
out = sys.argv[1]
print("| budgeted asap run | rows sent | rows held back | torn messages | mismatched rows at the end | cached rows used: fresh / 1-4 rounds old / older |")
print("|---|---|---|---|---|---|")
for name in sys.argv[2:]:
    if not name.startswith("asap-B"):
        continue
    sm = next(e for e in map(json.loads, open(f"{out}/{name}.jsonl")) if e["event"] == "summary")["sync_metrics"]
    age = sm["row_age_histogram"]
    tot = sum(age)
    print(f"| {name} | {sm['rows_sent']:.0f} | {sm['rows_held']:.0f} | {sm['torn']:.0f} | {sm['edge_mismatched_rows']:.0f} | "
          f"{100*age[0]/tot:.0f} % / {100*sum(age[1:5])/tot:.0f} % / {100*sum(age[5:])/tot:.0f} % |")
PY
}
LINK=(--emulate-bandwidth 100 --eval-every 1)
# Only ssp and bosen take a staleness; S = 2 as in the tables of docs/sync-modes.md.
S2=(--staleness 2)
MF=(--data datasets/out/movielens-train.ratings --test-data datasets/out/movielens-test.ratings --model mf
    --lambda 0.1 --lr-decay 0.9 --epochs 20)
case "$WHAT" in
# 235 and 352 mini-batches per pass at 8 ranks.
mlr|adarev-mlr) DATA=(--epochs 6 --sync-every 59); TARGET=(0.84 0); STEPS=(0.03 0.3 3) ;;
mf|adarev-mf) datasets/prepare.sh >/dev/null; DATA=("${MF[@]}" --sync-every 88); TARGET=(0.91 1); STEPS=(0.1 1 10) ;;
asap-mlr) ;;
*) echo "usage: benches/bosen.sh mlr|mf|asap-mlr|adarev-mlr|adarev-mf" >&2; exit 2 ;;
esac
if [[ $WHAT == asap-mlr ]]; then
    EVERY=(--emulate-bandwidth 100 --eval-every 25 --epochs 6 --sync-every 1)
    run allreduce 8 "${EVERY[@]}" --sync allreduce
    run asap 8 "${EVERY[@]}" --sync asap
    for B in 10 20 40; do
        run "asap-B$B-relative" 8 "${EVERY[@]}" --sync asap --bandwidth-mbps $B --priority relative
    done
    run "asap-B20-random" 8 "${EVERY[@]}" --sync asap --bandwidth-mbps 20 --priority random
    table 0.84 0
    echo
    asap_rows
    exit 0
fi
if [[ $WHAT == adarev-* ]]; then
    for eta in "${STEPS[@]}"; do
        for sched in decay adarevision; do
            run "$sched-lr$eta" 8 "${DATA[@]}" "${LINK[@]}" --sync bosen "${S2[@]}" --bandwidth-mbps 80 --lr-schedule $sched --lr $eta
        done
    done
    table "${TARGET[@]}"
    exit 0
fi
[[ $WHAT == mf ]] && DATA+=(--lr 1)
run allreduce 8 "${DATA[@]}" "${LINK[@]}" --sync allreduce
run asap 8 "${DATA[@]}" "${LINK[@]}" --sync asap
run ssp-S2-consgd 8 "${DATA[@]}" "${LINK[@]}" --sync ssp "${S2[@]}" --apply consgd
for B in 40 80; do
    for P in random relative; do
        run "bosen-B$B-$P" 8 "${DATA[@]}" "${LINK[@]}" --sync bosen "${S2[@]}" --bandwidth-mbps $B --priority $P
    done
    run "bosen-B$B-relative-fp16" 8 "${DATA[@]}" "${LINK[@]}" --sync bosen "${S2[@]}" --bandwidth-mbps $B --priority relative --compress fp16
done
for B in 40 80; do
    for P in random relative; do
        run "asap-B$B-$P" 8 "${DATA[@]}" "${LINK[@]}" --sync asap --bandwidth-mbps $B --priority $P
    done
done
table "${TARGET[@]}"
echo
asap_rows
