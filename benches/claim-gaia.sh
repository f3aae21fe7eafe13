#!/usr/bin/env bash
# Gaia's headline claims (papers/gaia-approximate-synchronous-parallel.txt §1, §6.2, §3.3) in the
# emulated cluster (docs/emulation.md). Writes OUTDIR/claim.json and OUTDIR/table.md.
#
#   benches/claim-gaia.sh OUTDIR
#
# Claims: over a WAN Gaia is within 0.94-1.40x of the same algorithm on a LAN; 1.8-53.5x faster
# than BSP/SSP parameter servers over the same WAN; §3.3: > 95 % of updates change their
# parameter by less than 1 %.
#
# Setting (why each number: benches/claim-gaia.md): 8 ranks = 2 data centres x 4 (--groups 2),
# Fashion-MNIST MLR, batch 256, a step declared 0.916 ms (clusters/*.toml, measured by
# `asap-train bench --write-profile` on this machine), a clock = 30 steps = one pass over a
# rank's 7,500 examples (the paper's iteration), lr 0.1 decaying 0.95 per epoch, target 83.6 %
# held-out accuracy of the evaluated model, evaluated every clock. Dilation 10.
#   lan allreduce   BSP over all 8 ranks on 1 GbE (clusters/1gbe.toml): the paper's "LAN"
#   lan gaia        gaia 1 %, DS 2, its WAN messages at 1 GbE (the same gaia on a LAN)
#   wan gaia        gaia 1 %, DS 2, clusters/wan-2dc.toml (100 Mbit/s, 50 ms one way: V/C-like)
#   wan allreduce   BSP over the WAN, links set so that a ring allreduce pays per round what a
#                   parameter server split over the 2 DCs pays (below)
#   wan ssp         SSP (staleness 2, ConSGD) over the WAN, same correction of the rate
# A PS over 2 DCs: a worker pushes the half of the model held in the other DC and pulls it back
# (M/B on its WAN link, 2 one-way latencies). Our per-rank link model cannot tell LAN from WAN
# pairs, so the baselines run every message at one rate: ring allreduce moves 2(N-1)/N M = 1.75 M
# per rank in 2 log2 N = 6 latencies, ssp 7/8 M each way per clock in 2 latencies. So their links
# are 1.75 x 100 Mbit/s, and latency 50/3 ms (allreduce) or 50 ms (ssp): exactly a PS's WAN cost.
# The untimed part (no lock): §3.3's study on MovieLens MF and on a sparse RCV1-shape logreg set.
#
# Environment: RESUME=1 (keep OUTDIR's finished runs, run the rest), HOLD_S (below), QUICK=1 (one short run per row, <= 30 s, no grid; verdict "quick run: not judged"), REPS [3],
# GRID ["16": the --sync-every values below the paper's clock of 30 for the rows against the
# tuned baseline, below; "" runs the paper's rows only],
# BIN [target/release/asap-train], BENCH_LOCK (each timed row's runs under one `flock
# $BENCH_LOCK`: one wait for the lock a row, not one a run, when other benches share it),
# NICE [-20] (the ranks' priority).
set -euo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:?usage: benches/claim-gaia.sh OUTDIR}
mkdir -p "$OUTDIR"
OUTDIR=$(cd "$OUTDIR" && pwd)
source benches/priority.sh
BIN=${BIN:-target/release/asap-train}
NICE=${NICE:--20}
QUICK=$([ "${QUICK:-0}" = 1 ] && echo 1 || true)  # "1" or empty: QUICK=0, as report/run.sh passes it, is the full run
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
D=10
if [ -n "$QUICK" ]; then REPS=1; CLOCKS=4; else REPS=${REPS:-3}; CLOCKS=37; fi
TARGET=0.836
source benches/row-lock.sh   # row_lock, row_unlock, have_run (HOLD_S, RESUME)
echo "# claim-gaia: $(date -u '+%Y-%m-%d %H:%M UTC'), $REPS run(s) per row, load: $(uptime)"

common=(--model mlr --batch-size 256 --lr 0.1 --lr-decay 0.95 --target "$TARGET" --dilation "$D")
clock30=(--sync-every 30 --eval-every 1)
gaia=(--sync gaia --groups 2 --significance 0.01 --dc-staleness 2)
# name|args (rows that reach the target in under 10 s run CLOCKS clocks; the WAN baselines stop
# at the target: they take longer than 10 s to get there). The WAN rows keep every rank's own
# WAN link (--emulate-groups off), the model benches/claim-gaia.md was measured with; the
# profile's groups would share one link per data centre (docs/emulation.md).
wan_ar="--sync allreduce --cluster clusters/wan-2dc.toml --emulate-groups off --emulate-bandwidth $(python3 -c "print(175/$D)") --emulate-latency $(python3 -c "print(round(50/3*$D, 3))")"
wan_ssp="--sync ssp --staleness 2 --apply consgd --cluster clusters/wan-2dc.toml --emulate-groups off --emulate-bandwidth $(python3 -c "print(175/$D)") --emulate-latency $((50 * D))"
variants=(
    "lan allreduce|--sync allreduce --cluster clusters/1gbe.toml --epochs $CLOCKS ${clock30[*]}"
    "lan gaia|${gaia[*]} --cluster clusters/1gbe.toml --epochs $CLOCKS ${clock30[*]}"
    "wan gaia|${gaia[*]} --cluster clusters/wan-2dc.toml --emulate-groups off --epochs $CLOCKS ${clock30[*]}"
    "wan allreduce|$wan_ar --epochs 40 --stop-at-target ${clock30[*]}"
    "wan ssp|$wan_ssp --epochs 40 --stop-at-target ${clock30[*]}"
)
# Against the tuned baseline (issue 40, item 4): BSP (with and without DiLoCo's outer optimizer,
# --outer-optimizer nesterov, outer lr 0.7, momentum 0.9) and SSP over the WAN at their best
# --sync-every, and gaia at the same clocks (its --sync-every is its clock), each side's best by
# median time to target. The rows above are k 30 (a pass: the top of the grid). GRID: the clocks
# below 30; default 16 alone (each interval is 4 rows x 3 runs, and four benches shared the lock
# on 2026-11-28). Not run by default: k 1, 2, 4. Over this WAN a BSP or SSP round costs at least
# the 100 ms round trip, 1 s dilated (measured: 11.4 s of sync in BSP's 11 rounds), so to beat
# BSP's 14.4 s at k 30 a k-4 run would have to reach the target within 14 rounds, 56 mini-batches
# (2 passes), k 1 within 14 mini-batches, where every run here needed 9 passes or more. Gaia at
# k 4 has DS 2 x 4 steps = 7 ms of compute (cluster time) to hide a 50 ms latency (not measured).
# GRID="16 4" runs k 4 too, capped at 20 rounds for BSP and SSP (>= 20 s, more than their k 30
# times: a capped run that misses the target bounds its time from below) and at 100 clocks and 20
# passes for gaia. Gaia's k 16 runs 20 passes (its k 30 needs 11-14). Evaluated about once a pass
# (every 8 clocks at k 4, 2 at k 16). DiLoCo runs at k 16 and 30 only (the outer step pays off
# over many local steps, `train --help`). --balance is not gridded: it reweighs work only under
# --straggler, and no row has one.
GRID=${GRID-16}
tuned=()
for k in $GRID; do
    ev=$(( k >= 16 ? 2 : 8 ))
    if [ "$k" -ge 16 ]; then stop="--epochs 40 --stop-at-target"; gstop="--epochs 20"; else stop="--epochs 40 --max-rounds 20 --stop-at-target"; gstop="--epochs 20 --max-rounds 100"; fi
    tuned+=("wan gaia, k $k|${gaia[*]} --cluster clusters/wan-2dc.toml --emulate-groups off $gstop --sync-every $k --eval-every $ev"
               "wan allreduce, k $k|$wan_ar $stop --sync-every $k --eval-every $ev"
               "wan ssp, k $k|$wan_ssp $stop --sync-every $k --eval-every $ev")
    [ "$k" -ge 16 ] && tuned+=("wan allreduce diloco, k $k|$wan_ar --outer-optimizer nesterov $stop --sync-every $k --eval-every $ev")
done
[ -n "$GRID" ] && tuned+=("wan allreduce diloco, k 30|$wan_ar --outer-optimizer nesterov --epochs 40 --stop-at-target ${clock30[*]}")
# QUICK: gaia and BSP over the WAN, 4 clocks each (too short to reach the target: not judged).
# Otherwise the WAN rows first, the tuned comparison's, then the LAN pair (what is measured first is
# what a shortened session keeps).
if [ -n "$QUICK" ]; then
    variants=("${variants[2]}" "${variants[3]/--stop-at-target/--max-rounds $CLOCKS}")
else
    variants=("${variants[@]:2}" "${tuned[@]}" "${variants[@]:0:2}")
fi
rows=()
for v in "${variants[@]}"; do
    name=${v%%|*}; args=${v#*|}
    rows+=("$name")
    row_lock
    for rep in $(seq 1 "$REPS"); do
        f="$OUTDIR/$(echo "$name" | tr ' /' '__')-$rep"
        have_run "$f" && { echo "$name #$rep kept (RESUME=1)"; continue; }
        # shellcheck disable=SC2086
        if ! nice -n "$NICE" mpirun -n 8 "$BIN" train "${common[@]}" $args --metrics "$f.jsonl" > "$f.log" 2>&1 9>&-; then
            echo "run $name #$rep failed: see $f.log" >&2
            touch "$f.failed"
        fi
        echo "$name #$rep done: $(grep -h 'reached after\|not reached' "$f.log" | head -1)"
    done
    row_unlock
done
row_unlock final

# §3.3's study on workloads with small, sparse updates (untimed: only the counters matter).
sig=()
if [ -n "$QUICK" ]; then EP=1; ROWS=20000; else EP=5; ROWS=60000; fi
ml=datasets/out/movielens-train.ratings
[ -s "$ml" ] || datasets/prepare.sh > "$OUTDIR/prepare.log" 2>&1 || true
if [ -s "$ml" ]; then
    nice -n 19 mpirun -n 4 "$BIN" train --data "$ml" --test-data datasets/out/movielens-test.ratings --model mf \
        --lr 1 --lambda 0.1 --lr-decay 0.9 --epochs "$EP" --sync-every 22 "${gaia[@]}" \
        --metrics "$OUTDIR/sig-mf.jsonl" > "$OUTDIR/sig-mf.log" 2>&1 && sig+=(mf) || echo "sig-mf failed: $OUTDIR/sig-mf.log" >&2
fi
if [ -z "$QUICK" ]; then
    syn="$OUTDIR/rcv1-shape-$ROWS.svm"
    [ -s "$syn" ] || "$BIN" data synth --rows "$ROWS" "$syn" > /dev/null
    nice -n 19 mpirun -n 4 "$BIN" train --data "$syn" --model logreg --test-fraction 0.1 --batch-size 64 \
        --epochs "$EP" --sync-every 30 "${gaia[@]}" --metrics "$OUTDIR/sig-logreg.jsonl" > "$OUTDIR/sig-logreg.log" 2>&1 \
        && sig+=(logreg) || echo "sig-logreg failed: $OUTDIR/sig-logreg.log" >&2
    rm -f "$syn"
fi

python3 benches/claim_gaia.py "$OUTDIR" "$REPS" "${QUICK:+quick}" "$D" "${rows[@]}" -- "${sig[@]}"
echo "# load at the end: $(uptime)"
