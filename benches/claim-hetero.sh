#!/usr/bin/env bash
# Heterogeneity-aware parameter server (Jiang et al., SIGMOD'17, papers/heterogeneity-aware-
# parameter-servers-dynsgd.txt §7) in the emulated cluster (docs/emulation.md):
#   - with stragglers, DynSGD up to 12x and ConSGD up to 6x faster than SSPSGD (plain updates);
#   - SSPSGD up to 7x slower with stragglers than without.
#
#   benches/claim-hetero.sh OUTDIR     writes OUTDIR/claim.json, OUTDIR/table.md, one run per file
#
# The paper's setting, scaled: 8 workers of which 2 (25 %; the paper's 20 % of 30) sleep so that
# they run at half speed (HL = 2, §3 "Protocol" and §7.2; HL = 1: none); logistic regression (here
# its multiclass form, MLR, on Fashion-MNIST); a clock is one pass over the worker's shard in 10
# mini-batches of 10 % of it (§7.1 "Protocol", Algorithm 1's N/(bM) batches per clock), the
# worker applying its own steps locally in between; S = 3 (§7.2 small staleness); a fixed step
# size per rule, grid-searched as the paper does (values and grid in benches/claim-hetero.md).
# Time = training seconds until the worst rank's own model reaches TARGET held-out accuracy, evaluated
# every clock; allreduce (BSP, the same clocks) is context, not part of the claim. Runs do not
# stop at the target: each lasts a fixed number of clocks, >= 10 s of emulated training (HL=2:
# 24 clocks at the stragglers' 0.5 s; HL=1: 44 clocks at 0.25 s).
#
# Environment: QUICK=1 (a subset for `make test`: two rows, one run each, short; verdict "quick
# run: not judged"), REPS [3], BIN [target/release/asap-train], BENCH_LOCK (every mpirun runs
# under `flock $BENCH_LOCK`), NICE [-20], STALENESS [3], STEP_MS [25], TARGET [0.79], GRID [1; QUICK 0:
# the tuned-clock rows of issue 40, below], LR_PLAIN,
# LR_AVG, ONLY (a regex: run only the rows whose name matches, keeping the other rows' runs
# already in OUTDIR: the tables and verdicts cover every row there).
set -euo pipefail
QUICK=$([ "${QUICK:-0}" = 1 ] && echo 1 || true)  # "1" or empty: QUICK=0, as report/run.sh passes it, is the full run
cd "$(dirname "$0")/.."
OUTDIR=${1:?usage: benches/claim-hetero.sh OUTDIR}
mkdir -p "$OUTDIR"
source benches/priority.sh
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
BIN=${BIN:-target/release/asap-train}
NICE=${NICE:--20}
REPS=${REPS:-3}
S=${STALENESS:-3}
# Declared compute per step: `asap-train bench --models mlr --batch-size 750` measured 439,456
# examples/s, 1.7 ms per step of 750, on this machine (benches/claim-hetero.md); x 15 dilation =
# 25 ms: 8 ranks need 8 x 1.7 ms of CPU per 25 ms on 2 cores (27 %), which keeps the emulation
# valid beside other jobs.
STEP_MS=${STEP_MS:-25}
# The paper's target is where accuracy is 90 % of the optimum (§7.1): 0.76 here (MLR's best is
# ~0.845), which ConSGD, DynSGD and allreduce reach in 1 clock, too coarse to time at one
# evaluation per clock. 0.79 is stricter (2-3 clocks for them) and still below the best that
# SSPSGD's untimed grid runs reached (0.794); at 0.82 (an earlier full run) SSPSGD reached it in
# none of 6 runs and ConSGD in 9 clocks: benches/claim-hetero.md.
TARGET=${TARGET:-0.79}
NP=8
# Learning rates from the grid search (benches/claim-hetero.md): SSPSGD adds M workers' updates
# and prefers a step ~M times smaller (§7.4.1: 5e-6 against 3e-4 on CTR).
LR_PLAIN=${LR_PLAIN:-0.001}
LR_AVG=${LR_AVG:-0.1}
CLOCKS_HL2=${CLOCKS_HL2:-24}
CLOCKS_HL1=${CLOCKS_HL1:-44}
if [ -n "${QUICK:-}" ]; then REPS=1; CLOCKS_HL2=4; fi
lock=()
if [ -n "${BENCH_LOCK:-}" ]; then lock=(flock "$BENCH_LOCK"); fi
SLOW=(--straggler 0-1:2)
common=(--model mlr --batch-size 750 --lr-schedule constant --emulate-compute "$STEP_MS"
    --eval-every 1 --own-models 0 --target "$TARGET" --target-on worst-rank)
# name|HL|args
rows=(
    "sspsgd-hl1|1|--sync ssp --staleness $S --apply plain --lr $LR_PLAIN"
    "sspsgd-hl2|2|--sync ssp --staleness $S --apply plain --lr $LR_PLAIN"
    "consgd-hl2|2|--sync ssp --staleness $S --apply consgd --lr $LR_AVG"
    "dynsgd-hl2|2|--sync ssp --staleness $S --apply dynsgd --lr $LR_AVG"
    "allreduce-hl2|2|--sync allreduce --lr $LR_AVG"
)
# Issue 40's tuned baseline: the clock length is the knob an SSP user turns (S stays the paper's 3).
# SSPSGD and both challengers get the same grid, 2 and 5 steps a clock beside the paper's 10 (one
# pass: "up to an epoch"), sized to add 18 runs on the 2 shared cores (not 1: budget); a
# shorter clock gives SSPSGD fresher reads (its summed updates are what oscillate at 10), so the
# grid runs toward 1 and not past the pass. GRID=0 leaves them out (QUICK does).
GRID=${GRID:-$([ -n "${QUICK:-}" ] && echo 0 || echo 1)}
if [ "$GRID" = 1 ]; then
    for k in 5 2; do
        rows+=(
            "sspsgd_k$k-hl2|2|--sync ssp --staleness $S --apply plain --lr $LR_PLAIN --sync-every $k"
            "consgd_k$k-hl2|2|--sync ssp --staleness $S --apply consgd --lr $LR_AVG --sync-every $k"
            "dynsgd_k$k-hl2|2|--sync ssp --staleness $S --apply dynsgd --lr $LR_AVG --sync-every $k"
        )
    done
fi
if [ -n "${QUICK:-}" ]; then rows=("${rows[1]}" "${rows[3]}"); fi
{
    echo "# $(date -u '+%Y-%m-%d %H:%M UTC'); uptime: $(uptime); ONLY=${ONLY:-}"
    echo "# $NP ranks, S=$S, ${STEP_MS} ms steps, target $TARGET, $REPS runs per row, binary $BIN"
} >> "$OUTDIR/commands.txt"
for r in "${rows[@]}"; do
    IFS='|' read -r name hl args <<< "$r"
    if [ -n "${ONLY:-}" ] && [[ ! $name =~ $ONLY ]]; then continue; fi
    [[ $args == *--sync-every* ]] || args="$args --sync-every 10"   # the paper's clock: one pass
    slow=(--epochs "$CLOCKS_HL1"); [ "$hl" = 2 ] && slow=("${SLOW[@]}" --epochs "$CLOCKS_HL2")
    for rep in $(seq 1 "$REPS"); do
        f="$OUTDIR/$name-$rep"
        # shellcheck disable=SC2086
        cmd=(nice -n "$NICE" mpirun -n "$NP" "$BIN" train "${common[@]}" "${slow[@]}" $args --seed "$rep" --metrics "$f.jsonl")
        echo "${lock[*]} ${cmd[*]}" >> "$OUTDIR/commands.txt"
        rm -f "$f.failed"
        if ! "${lock[@]}" "${cmd[@]}" > "$f.log" 2>&1; then
            echo "run $name #$rep failed: see $f.log" >&2
            touch "$f.failed"
        fi
    done
done
echo "# done $(date -u '+%H:%M UTC'); uptime: $(uptime)" >> "$OUTDIR/commands.txt"
python3 benches/claim-hetero.py "$OUTDIR" "$REPS" "${QUICK:+quick}" "S=$S" "$STEP_MS" "$TARGET" "$LR_PLAIN" "$LR_AVG"
cat "$OUTDIR/table.md"
