#!/usr/bin/env bash
# ASAP against the best allreduce in the emulated cluster (docs/emulation.md): every step takes a
# declared time, links a declared rate, and every row says whether the emulation held.
#
#   benches/emulated-cluster.sh compute     8 ranks, MLR batch 256, 20 ms steps, ranks 0-1 at 2x
#   benches/emulated-cluster.sh even        the same without stragglers
#   benches/emulated-cluster.sh links       8 ranks, clusters/1gbe-2slow.toml (ranks 0-1 behind
#                                           100 Mbit/s), MLP 784-1024-10 (3.3 MB), batch 256
#   benches/emulated-cluster.sh links32     32 ranks (NP), clusters/1gbe.toml (every link 1 GbE),
#                                           MLP 784-1024-10, batch 64; with DiLoCo and NoLoCo
#                                           (issue 40's 32 and 64 ranks)
#   benches/emulated-cluster.sh production  NP ranks (32) with --straggler production, MLR
#   benches/emulated-cluster.sh scale       NP ranks (64), clusters/1gbe.toml, MLR batch 64
#                                           (a small model): allreduce, DiLoCo, NoLoCo
#
# Time is training seconds until the worst rank's own model reaches TARGET (every rank's own
# model scored, --own-models 0; TARGET_ON=averaged: the replicas' average, the model a gossip run
# ends with), evaluated every EVAL_EVERY rounds; a run stops there
# (--stop-at-target: the evaluations make the ranks meet, outside the training time); REPS runs
# per row give the median and the range. A row whose runs were not all valid (more than 1 % of steps broken or
# 1 % drift on some rank, docs/emulation.md) is marked INVALID and is not a result.
#
#   benches/emulated-cluster.sh lan         8 ranks, clusters/1gbe.toml, MLP 784-1024-10, batch 256:
#                                           DiLoCo and NoLoCo against tuned allreduce (issue 40)
#   benches/emulated-cluster.sh wan         the same on clusters/wan-2dc.toml (100 Mbit/s, 50 ms)
#
# Tuned baselines (issue 40): INTERVALS="1 4 16 64" runs every row at each --sync-every K (rows
# "NAME, k K"), and the table adds, per variant, its best valid interval by time to target, with
# the ratio to the best tuned allreduce without an outer optimizer and to the best tuned
# allreduce of any kind (DiLoCo included). Both sides get the same grid, and every row is
# evaluated about every EVAL_EVERY steps (EVAL_EVERY / K rounds, at least 1). INTERVALS="1" (the
# default) runs each row once at every step, as before.
#
# Environment (defaults in brackets): ONLY (a regex: only the rows whose name matches), JITTER (an
# --emulate-jitter form for every row), REPS [3], PARTITION [iid], EPOCHS, TARGET, EVAL_EVERY [10], INTERVALS [1],
# MODEL (compute/even/production) [mlr], LINK_GROUPS (wan: --emulate-groups) [off], DILATION (links [8], links32 [24 x NP / 32], scale [100]), NP (links32, production [32], scale [64]),
# OUT (a directory of an earlier run of the same table whose rows are reused in the printed
# table), BIN [target/release/asap-train]; NICE [-20]: the ranks' priority (a benchmark beside other jobs
# needs its ranks woken on time); BENCH_LOCK (a file: every mpirun runs under `flock` on it, so that
# benches started beside this one with the same lock take turns).
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/priority.sh
WHAT=${1:-compute}
REPS=${REPS:-3}
PARTITION=${PARTITION:-iid}
EVAL_EVERY=${EVAL_EVERY:-10}
MODEL=${MODEL:-mlr}
BIN=${BIN:-target/release/asap-train}
NICE=${NICE:--20}
TARGET_ON=${TARGET_ON:-worst-rank}
export TARGET_ON   # benches/emulated-table.py times "averaged" from the eval lines
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
out=runs/emulated/$WHAT-$(date +%H%M%S)
mkdir -p "$out"
rows=()
lock=()   # BENCH_LOCK: every mpirun under `flock $BENCH_LOCK`, so that benches beside this one wait
[ -n "${BENCH_LOCK:-}" ] && lock=(flock "$BENCH_LOCK")

case $WHAT in
compute | even)
    NP=8; EPOCHS=${EPOCHS:-12}; TARGET=${TARGET:-0.83}
    common=(--emulate-compute 20 --model "$MODEL" --batch-size 256 --lr 0.3)
    [ "$MODEL" = mlp ] && common+=(--hidden 128)
    if [ "$WHAT" = compute ]; then slow=(--straggler 0-1:2); bal=(--balance); else slow=(); bal=(); fi
    variants=(
        "allreduce|--sync allreduce"
        "none|--sync none"
        "asap notify-ack|--sync asap"
        "asap deadline|--sync asap --notify deadline"
    )
    if [ "$WHAT" = compute ]; then
        variants+=(
            "allreduce --balance|--sync allreduce --balance"
            "asap --balance|--sync asap --balance"
            "asap deadline --balance|--sync asap --notify deadline --balance"
            "asap staleness 2|--sync asap --staleness 2"
            "asap push-sum|--sync asap --notify push-sum"
            "asap one-peer exponential|--sync asap --graph one-peer-exponential"
            "asap exponential --balance|--sync asap --graph exponential --balance"
            "asap complete --balance|--sync asap --graph complete --balance"
            # DiLoCo with --balance: the best allreduce is the best over the interval,
            # --balance and the outer optimizer (issue 40)
            "allreduce diloco --balance|--sync allreduce --outer-optimizer nesterov --balance"
        )
    fi
    ;;
links)
    NP=8; EPOCHS=${EPOCHS:-10}; TARGET=${TARGET:-0.80}; DILATION=${DILATION:-8}
    common=(--cluster clusters/1gbe-2slow.toml --dilation "$DILATION" --model mlp --hidden 1024 --batch-size 256 --lr 0.3)
    slow=(); bal=()
    variants=(
        "allreduce|--sync allreduce"
        "none|--sync none"
        "asap notify-ack|--sync asap"
        "asap deadline|--sync asap --notify deadline"
        "asap deadline exponential|--sync asap --notify deadline --graph exponential"
        "allreduce diloco|--sync allreduce --outer-optimizer nesterov"
        "asap noloco|--sync asap --graph one-peer-exponential --outer-optimizer nesterov"
    )
    ;;
lan | wan)
    # 8 ranks of one core each, the 3.3 MB MLP; lan: 1 GbE, 50 us (bandwidth-bound: a ring
    # allreduce moves 2 x 7/8 x 3.3 MB in 46 ms against a 24 ms step); wan: every link 100
    # Mbit/s and 50 ms one way, the two data centres' link for every pair (latency- and
    # bandwidth-bound: 460 ms a ring round).
    NP=8; EPOCHS=${EPOCHS:-10}; TARGET=${TARGET:-0.80}; DILATION=${DILATION:-8}
    [ "$WHAT" = lan ] && profile=clusters/1gbe.toml || profile=clusters/wan-2dc.toml
    common=(--cluster "$profile" --dilation "$DILATION" --model mlp --hidden 1024 --batch-size 256 --lr 0.3)
    # wan: LINK_GROUPS [off] is --emulate-groups: off keeps every rank's own WAN link for every pair
    # (the model the wan tables were measured with); 2 takes the profile's data centres, each
    # sharing one WAN link, with 10 GbE within.
    [ "$WHAT" = wan ] && common+=(--emulate-groups "${LINK_GROUPS:-off}")
    slow=(); bal=()
    variants=(
        "allreduce|--sync allreduce"
        "allreduce diloco|--sync allreduce --outer-optimizer nesterov"
        "asap notify-ack|--sync asap"
        "asap deadline|--sync asap --notify deadline"
        "asap noloco|--sync asap --graph one-peer-exponential --outer-optimizer nesterov"
        # outer lr 1.0: the step at which DiLoCo sent 4x fewer bytes than the best tuned allreduce
        # on by-label:2 shards (benches/low-comm.md); PARTITION=by-label:2 is its time table.
        "allreduce diloco outer-lr 1|--sync allreduce --outer-optimizer nesterov --outer-lr 1"
    )
    ;;
links32)
    # 32 ranks, every link 1 GbE, the 3.3 MB MLP: bandwidth-bound for every mode (a ring
    # allreduce moves 2 x 31/32 of the model per rank per round, the root expander 2 models,
    # one-peer exponential 1). Dilation 24: 32 ranks need 32 x 6.4 ms of CPU per round, 103 ms
    # on 2 cores, inside the 154 ms declared step.
    # NP=64 doubles the CPU a round needs, so the dilation doubles with it (48).
    NP=${NP:-32}; EPOCHS=${EPOCHS:-10}; TARGET=${TARGET:-0.80}; DILATION=${DILATION:-$((24 * NP / 32))}
    common=(--cluster clusters/1gbe.toml --dilation "$DILATION" --model mlp --hidden 1024 --batch-size 64 --lr 0.1)
    slow=(); bal=()
    variants=(
        "allreduce|--sync allreduce"
        "none|--sync none"
        "asap notify-ack|--sync asap"
        "asap deadline|--sync asap --notify deadline"
        "asap one-peer exponential|--sync asap --graph one-peer-exponential"
        "allreduce diloco|--sync allreduce --outer-optimizer nesterov"
        "asap noloco|--sync asap --graph one-peer-exponential --outer-optimizer nesterov"
    )
    ;;
production)
    NP=${NP:-32}; EPOCHS=${EPOCHS:-12}; TARGET=${TARGET:-0.82}
    common=(--emulate-compute 40 --model "$MODEL" --batch-size 64 --lr 0.3)
    slow=(--straggler production); bal=(--balance)
    variants=(
        "allreduce|--sync allreduce"
        "allreduce --balance|--sync allreduce --balance"
        "none|--sync none"
        "asap notify-ack|--sync asap"
        "asap --balance|--sync asap --balance"
        "asap deadline --balance|--sync asap --notify deadline --balance"
        "asap complete --balance|--sync asap --graph complete --balance"
        "allreduce diloco --balance|--sync allreduce --outer-optimizer nesterov --balance"
    )
    ;;
scale)
    # NP ranks (64), every link 1 GbE, MLR (31 KB) at batch 64: communication-bound with a small
    # model (the emulated allreduce, 2 (N-1)/N x 31 KB at 1 Gbit/s + 2 log2 64 x 50 us, is 1.1 ms
    # a round against a 0.142 ms step; one peer's message 0.3 ms), where the links32 table's
    # 3.3 MB MLP is bandwidth-bound. The setting in which 64 ranks fit this machine: dilation
    # 100 makes a step 14 ms, inside which 64 ranks' real steps run on 2 cores (measured: a run
    # used 25-28 % of them, valid). Issue 40's "NoLoCo at most 1.0x DiLoCo at 32 and 64 ranks,
    # with fewer bytes on the busiest link".
    NP=${NP:-64}; EPOCHS=${EPOCHS:-30}; TARGET=${TARGET:-0.83}; DILATION=${DILATION:-100}
    common=(--cluster clusters/1gbe.toml --dilation "$DILATION" --model mlr --batch-size 64 --lr 0.3)
    slow=(); bal=()
    variants=(
        "allreduce|--sync allreduce"
        "allreduce diloco|--sync allreduce --outer-optimizer nesterov"
        "asap one-peer exponential|--sync asap --graph one-peer-exponential"
        "asap noloco|--sync asap --graph one-peer-exponential --outer-optimizer nesterov"
    )
    ;;
*) echo "usage: $0 compute|even|links|links32|production|scale|lan|wan" >&2; exit 2 ;;
esac
# JITTER: an --emulate-jitter form for every row (issue 41 item 5; benches/jitter-rounds.sh has
# this machine's and the ASYNC paper's production-cluster form).
[ -n "${JITTER:-}" ] && common+=(--emulate-jitter "$JITTER")

echo "# $WHAT: $NP ranks, partition $PARTITION, target $TARGET (on: $TARGET_ON), $REPS runs per row${JITTER:+, step-time jitter $JITTER}"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg), binary $BIN"
INTERVALS=${INTERVALS:-1}
grid=()   # "NAME|ARGS" per row: each variant at each interval
for v in "${variants[@]}"; do
    for k in $INTERVALS; do
        # Evaluate about every EVAL_EVERY steps at every interval (at least once a round): a
        # fixed count of rounds would score k = 16 every 160 steps and make it look slow.
        ev=$(( EVAL_EVERY / k > 0 ? EVAL_EVERY / k : 1 ))
        if [ "$INTERVALS" = 1 ]; then grid+=("$v|$EVAL_EVERY"); else grid+=("${v%%|*}, k $k|${v#*|} --sync-every $k|$ev"); fi
    done
done
for v in "${grid[@]}"; do
    name=${v%%|*}; rest=${v#*|}; args=${rest%|*}; ev=${rest##*|}
    rows+=("$name")
    if [ -n "${ONLY:-}" ] && [[ ! $name =~ $ONLY ]]; then continue; fi
    for rep in $(seq 1 "$REPS"); do
        f="$out/$(echo "$name" | tr ' /' '__')-$rep"
        # shellcheck disable=SC2086
        if ! "${lock[@]}" nice -n "$NICE" mpirun -n "$NP" "$BIN" train "${common[@]}" "${slow[@]}" $args \
            --partition "$PARTITION" --epochs "$EPOCHS" --eval-every "$ev" --own-models 0 \
            --target "$TARGET" --target-on "$TARGET_ON" --stop-at-target --metrics "$f.jsonl" > "$f.log" 2>&1; then
            echo "run $name #$rep failed: see $f.log" >&2
            touch "$f.failed"
        fi
    done
done
if [ -n "${OUT:-}" ]; then cp -n "$OUT"/*.jsonl "$out"/ 2>/dev/null || true; fi   # earlier rows of the same table
python3 benches/emulated-table.py "$out" "$REPS" "${rows[@]}"
echo "# load at the end $(cut -d' ' -f1-3 /proc/loadavg); runs in $out"
