#!/usr/bin/env bash
# The ASYNC paper's headline claims (papers/async-engine-asynchrony-history-saga.txt §VI-C) in the
# emulated cluster (docs/emulation.md):
#   1. controlled-delay straggler: 8 workers, one at half speed (delay 100 %): ASGD up to 2x
#      faster than SGD;
#   2. production-cluster stragglers on 32 workers: ASGD 3-4x faster than SGD;
#   3. the same: ASAGA 3.5-4x faster than SAGA.
# SGD/SAGA are `--sync async --barrier bsp`, ASGD/ASAGA `--barrier async` (the coordinator applies
# each result with weight 1/M, the paper's step-size heuristic), `--optimizer sgd|saga`, least
# squares (`--model lsq`, the paper's problem). Every pair is counted the same way: training
# seconds until the coordinator's model (evaluated every EVAL rounds, each evaluation stamped with
# the training time of its round) reaches the same objective, the objective the synchronous twin
# reaches halfway through its run (median over its runs). Runs are a fixed number of epochs and
# are not stopped at the target (under an asynchronous predicate --stop-at-target would make the
# ranks meet at every evaluation).
#
#   benches/claim-async.sh OUTDIR     writes OUTDIR/claim.json, OUTDIR/table.md, OUTDIR/runs/
# Environment: QUICK=1 (a subset: 1 repetition, short runs, verdict "quick run: not judged"),
# REPS [3], BIN [target/release/asap-train], BENCH_LOCK (every mpirun under flock on it),
# NICE [-20], GRID [1; QUICK 0: the tuned-interval rows of issue 40, below], ONLY (a regex: run only
# the runs whose name matches, keeping the others already in OUTDIR/runs; the tables cover all).
set -euo pipefail
cd "$(dirname "$0")/.."
OUTDIR=${1:?usage: benches/claim-async.sh OUTDIR}
source benches/priority.sh
QUICK=${QUICK:-0}
REPS=${REPS:-3}
BIN=${BIN:-target/release/asap-train}
NICE=${NICE:--20}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
[ -x "$BIN" ] || { echo "benches/claim-async.sh: no binary at $BIN: build it (cargo build --release) or set BIN" >&2; exit 1; }
[ "$QUICK" = 1 ] && REPS=1
GRID=${GRID:-$([ "$QUICK" = 1 ] && echo 0 || echo 1)}
mkdir -p "$OUTDIR/runs"

# The RCV1-shape sparse set (the paper's rcv1_full.binary: 47,236 features, 0.16 % non-zeros),
# scaled to 100,000 rows so that 8 ranks load it in about a second. Seeded: the same file
# everywhere; kept in runs/data (ignored by git).
SPARSE=runs/data/claim-async-rcv1-shape.h5
if [ ! -f "$SPARSE" ]; then
    mkdir -p runs/data
    "$BIN" data synth "$SPARSE" --rows 100000 --seed 1 >/dev/null
fi
# The dense set of the production-cluster runs (the paper's mnist8m/epsilon): Fashion-MNIST,
# label +1 for classes >= 5 and -1 below, as benches/async.sh.
DENSE=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz

# --- The settings (each declared step time and where it comes from) -------------------------
# Links: clusters/10gbe.toml (10 Gbit/s, 15 us; the paper's cluster was XSEDE Comet nodes, Spark
# over TCP). Declared steps: `asap-train bench --models lsq` on this machine's core
# (2026-11-27, under the bench lock), times the dilation:
# - delay 100 %: the sparse set at the paper's per-worker work for rcv1 (b = 5 % of 697,641
#   rows over 8 workers: 4,360 examples a task): 2.26 M examples/s = 1.93 ms. Keeping the
#   paper's task size keeps its compute against the 47,237-parameter model's messages: a result
#   of 4,360 rows touches nearly every feature (about 0.4 MB), so the coordinator's link carries
#   about 3 MB a round against 8 x 1.93 ms of compute.
# - production: Fashion-MNIST, batch 64 per worker (the paper's b = 1 % of mnist8m is 2,531
#   examples a task, more than a 32nd of Fashion-MNIST's 60,000 holds): 0.76 M examples/s =
#   0.084 ms; the 785-parameter model's messages cost next to nothing, as mnist8m's in the paper.
# Dilation: the smallest tried at which every row stayed valid beside the other sessions' jobs
# (8 ranks: 20; 32 ranks: 100, the runs of 26-11-27 in benches/claim-async.md).
D8=${D8:-20}; SPARSE_STEP_MS=1.93
D32=${D32:-100}; DENSE_STEP_MS=0.084
ms() { python3 -c "print(round($1 * $2, 3))"; }
# Epochs: >= 10 s of emulated training per run in the full mode. Delay 100 %: 3 rounds an
# epoch; the straggler's task takes 88.5 ms under ASGD (97 ms a round under SGD): 36 epochs gave
# ASGD 9.6 s (run of 2026-11-27), so 38. Production:1: the slowest rank is 9.78x, 82-90 ms a
# round, 30 rounds an epoch: 4 epochs gave 10.6-10.9 s.
if [ "$QUICK" = 1 ]; then E8=${E8:-4}; E32=${E32:-1}; else E8=${E8:-38}; E32=${E32:-4}; fi
# Evaluations: the synchronous runs every 2 rounds, the asynchronous ones every round (their
# target falls 2-5x earlier, so the same relative resolution needs the finer grid). The same
# evaluation either way: the coordinator's model, the training objective, outside training time.
# --stop-check-every: the preemption vote makes every rank meet every that many rounds (at least
# 34 under async), where fast workers wait for the stragglers. The paper's engine has no such
# vote, so these runs vote once (measured with the default: benches/claim-async.md).
VOTE=${VOTE:-1000000}
C8=(--data "$SPARSE" --model lsq --lambda 1e-4 --lr-schedule constant --batch-size 4360 --sync async
    --cluster clusters/10gbe.toml --dilation "$D8" --emulate-compute "$(ms $SPARSE_STEP_MS "$D8")"
    --epochs "$E8" --own-models 1 --stop-check-every "$VOTE" --straggler delay:100)
C32=(--data "$DENSE" --label-threshold 5 --model lsq --lambda 1e-4 --lr-schedule constant --batch-size 64
    --sync async --cluster clusters/10gbe.toml --dilation "$D32" --emulate-compute "$(ms $DENSE_STEP_MS "$D32")"
    --epochs "$E32" --own-models 1 --stop-check-every "$VOTE" --straggler production:${SEED:-1})
LR8=${LR8:-1.0}; LR32=${LR32:-0.01}
SYNC_EVAL=(--eval-every 2); ASYNC_EVAL=(--eval-every 1)

echo "# claim-async: $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg), $REPS repetition(s)$([ "$QUICK" = 1 ] && echo ', QUICK')" | tee "$OUTDIR/commands.txt"
one() { # one NAME NP ARGS...: one run into $OUTDIR/runs/NAME.jsonl
    local name=$1 np=$2; shift 2
    if [ -n "${ONLY:-}" ] && [[ ! $name =~ $ONLY ]]; then return; fi
    local cmd=(nice -n "$NICE" mpirun -n "$np" "$BIN" train "$@" --metrics "$OUTDIR/runs/$name.jsonl")
    [ -n "${BENCH_LOCK:-}" ] && cmd=(flock "$BENCH_LOCK" timeout 300 "${cmd[@]}")
    echo "${cmd[*]}" >> "$OUTDIR/commands.txt"
    if ! "${cmd[@]}" > "$OUTDIR/runs/$name.log" 2>&1; then
        echo "run $name failed: see $OUTDIR/runs/$name.log" >&2
        touch "$OUTDIR/runs/$name.failed"
    fi
}
# Repetitions interleave, so a burst of load from other jobs does not hit one configuration.
for rep in $(seq 1 "$REPS"); do
    one "delay100-SGD-$rep" 8 "${C8[@]}" "${SYNC_EVAL[@]}" --barrier bsp --optimizer sgd --lr "$LR8"
    one "delay100-ASGD-$rep" 8 "${C8[@]}" "${ASYNC_EVAL[@]}" --barrier async --optimizer sgd --lr "$LR8"
    # Issue 40's tuned baseline: the knob of synchronous SGD here is the task length
    # (--sync-every: local steps a task, results averaged under bsp); the batch stays the paper's
    # task size. An epoch is 2.9 tasks of 4,360 rows, so the grid "up to an epoch" is 1 and 2;
    # both sides get it, and both evaluate every round (2 steps, the k = 1 SGD row's resolution).
    if [ "$GRID" = 1 ]; then
        one "delay100-SGD_k2-$rep" 8 "${C8[@]}" "${ASYNC_EVAL[@]}" --barrier bsp --optimizer sgd --lr "$LR8" --sync-every 2
        one "delay100-ASGD_k2-$rep" 8 "${C8[@]}" "${ASYNC_EVAL[@]}" --barrier async --optimizer sgd --lr "$LR8" --sync-every 2
    fi
    one "production-SGD-$rep" 32 "${C32[@]}" "${SYNC_EVAL[@]}" --barrier bsp --optimizer sgd --lr "$LR32"
    one "production-ASGD-$rep" 32 "${C32[@]}" "${ASYNC_EVAL[@]}" --barrier async --optimizer sgd --lr "$LR32"
    # QUICK leaves the SAGA pair out (the whole QUICK run must fit 30 s on 2 cores).
    if [ "$QUICK" != 1 ]; then
        one "production-SAGA-$rep" 32 "${C32[@]}" "${SYNC_EVAL[@]}" --barrier bsp --optimizer saga --lr "$LR32"
        one "production-ASAGA-$rep" 32 "${C32[@]}" "${ASYNC_EVAL[@]}" --barrier async --optimizer saga --lr "$LR32"
    fi
done
echo "# load at the end $(cut -d' ' -f1-3 /proc/loadavg)" | tee -a "$OUTDIR/commands.txt"

SETTING8="8 ranks (rank 0 hosts the coordinator and a worker; rank 7 at half speed: --straggler delay:100), lsq on the RCV1-shape sparse set (asap-train data synth, 100,000 x 47,236, 0.16 % non-zeros), batch 4,360 per worker (the paper's rcv1 task), --lr $LR8 constant, lambda 1e-4, $E8 epochs; clusters/10gbe.toml at dilation $D8; declared step $(ms $SPARSE_STEP_MS "$D8") ms = asap-train bench's 1.93 ms x $D8"
SETTING32="32 ranks with --straggler production:${SEED:-1} (8 stragglers: 1.7-2.4x six, 7.5x and 9.8x two; rank 0 never), lsq on Fashion-MNIST (60,000 x 784, label = class >= 5), batch 64 per worker, --lr $LR32 constant (SGD and SAGA), lambda 1e-4, $E32 epochs; clusters/10gbe.toml at dilation $D32; declared step $(ms $DENSE_STEP_MS "$D32") ms = asap-train bench's 0.084 ms x $D32"
python3 benches/claim-async.py "$OUTDIR" "$REPS" "$QUICK" "$SETTING8" "$SETTING32"
