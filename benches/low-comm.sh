#!/usr/bin/env bash
# Bytes to equal quality on non-IID shards (issue 40, "Targets: Bytes" and item 4 "Tuned
# baselines"): every-step allreduce, tuned local SGD, DiLoCo (allreduce + outer Nesterov) and
# NoLoCo (asap + outer Nesterov) over a grid of --sync-every, 3 seeds per config.
#
#   benches/low-comm.sh [--dir DIR] [--ranks 8] [--intervals "1 2 4 ... 128"] [--methods "..."]
#                       [--seeds "1 2 3"] [--lr "ETA ..."] [--partition by-label:2]
#                       [-- EXTRA TRAIN ARGS]
#
# Methods (each over every interval of --intervals; "ar" at interval 1 is the every-step baseline):
#   ar          --sync allreduce, no outer optimizer (local SGD; tuned = its best interval)
#   diloco      --sync allreduce --outer-optimizer nesterov (outer lr 0.7, momentum 0.9: DiLoCo's)
#   diloco-lr1  the same with --outer-lr 1.0
#   noloco      --sync asap --outer-optimizer nesterov (--graph auto; pseudo-gradient against the
#               neighbourhood's average)
#   noloco-hypercube  the same on --graph hypercube (undirected: on auto's directed root expander
#               the outer Nesterov step makes the replicas drift apart, benches/low-comm.md)
#   noloco-onepeer  the same on --graph one-peer-exponential (one peer a round, NoLoCo's setting)
#   gossip      --sync asap, no outer optimizer (tuned gossip)
# Workload: Fashion-MNIST, --model mlp --hidden 256, --partition by-label:2 (each rank holds 2
# classes), 10 epochs, batch 32, the default step schedule (decay 0.8 per epoch at 8 ranks).
# Why hidden 256 and by-label:2, not MLP-1024 and dirichlet:0.1: benches/low-comm.md.
#
# --lr: the inner step, one or a list ("0.0625 0.125 0.25"); every method runs at every step in
# the list, so the summary can tune the step per method as it tunes the interval (the searched
# step is too small for every-step allreduce on this workload: benches/low-comm.md, "Tuned inner
# step"). Not given, the script runs the default step-size search once per rank count
# (`--max-rounds 1`, no --lr) and takes the step it logs ("--lr not given: step size X chosen").
# --partition: the shards (default by-label:2); keep one partition per --dir, the summary reads
# it from each run's config and judges each partition against its own baseline.
#
# A run is DIR/nN-METHOD-stepETA-kK-sS.jsonl (its .log next to it, a .diverged marker when it
# diverged). Runs are sequential (one mpirun at a time) on a private copy of the binary (BIN, default
# target/release/asap-train, copied first so a rebuild cannot change it mid-grid). A run whose
# .jsonl already holds a summary is kept, not rerun: the script can be called again into the same
# --dir with more intervals, methods or seeds, and the summary covers every run there. The
# summary (benches/low_comm.py) is printed at the end and written to DIR/summary.md.
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
dir="$here/runs/low-comm-$(date -u +%Y%m%d-%H%M%S)"
ranks="8"
intervals="1 2 4 8 16 32 64 128"
methods="ar diloco noloco gossip"
seeds="1 2 3"
lr=""
partition="by-label:2"
while [ $# -gt 0 ]; do
    case "$1" in
        --dir) dir="$2"; shift 2 ;;
        --ranks) ranks="$2"; shift 2 ;;
        --intervals) intervals="$2"; shift 2 ;;
        --methods) methods="$2"; shift 2 ;;
        --seeds) seeds="$2"; shift 2 ;;
        --lr) lr="$2"; shift 2 ;;
        --partition) partition="$2"; shift 2 ;;
        --) shift; break ;;
        *) echo "unknown option $1 (see the head of $0)" >&2; exit 2 ;;
    esac
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p "$dir"
BIN_SRC=${BIN:-$here/target/release/asap-train}
BIN="$dir/asap-train"
[ -x "$BIN" ] || cp "$BIN_SRC" "$BIN"
WORKLOAD=(--model mlp --hidden 256 --partition "$partition" --epochs 10 --eval-every 100000)
echo "load before: $(uptime)"
echo "binary: $BIN_SRC copied to $BIN (worktree at $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?'); the copy is kept from the first call into DIR)"

method_args() { # method_args METHOD: the sync options of one method
    case "$1" in
        ar) echo "--sync allreduce" ;;
        diloco) echo "--sync allreduce --outer-optimizer nesterov" ;;
        diloco-lr1) echo "--sync allreduce --outer-optimizer nesterov --outer-lr 1.0" ;;
        noloco) echo "--sync asap --outer-optimizer nesterov" ;;
        noloco-hypercube) echo "--sync asap --graph hypercube --outer-optimizer nesterov" ;;
        noloco-onepeer) echo "--sync asap --graph one-peer-exponential --outer-optimizer nesterov" ;;
        gossip) echo "--sync asap" ;;
        *) echo "unknown method $1 (see the head of benches/low-comm.sh)" >&2; exit 2 ;;
    esac
}

has_summary() { [ -f "$1" ] && grep -q '"event": *"summary"' "$1"; }

for n in $ranks; do
    steps=$lr
    if [ -z "$steps" ]; then
        probe="$dir/n$n-lr-search"
        mpirun -n "$n" "$BIN" train "${WORKLOAD[@]}" --sync allreduce --max-rounds 1 "$@" > "$probe.log" 2>&1 \
            || { echo "step-size probe failed: see $probe.log" >&2; exit 1; }
        steps=$(sed -n 's/.*--lr not given: step size \([0-9.e-]*\) chosen.*/\1/p' "$probe.log" | head -1)
        [ -n "$steps" ] || { echo "no 'step size X chosen' line in $probe.log" >&2; exit 1; }
    fi
    echo "$n ranks: --lr $steps"
    for step in $steps; do
        for m in $methods; do
            read -r -a sync <<< "$(method_args "$m")"
            for k in $intervals; do
                for s in $seeds; do
                    name="n$n-$m-step$step-k$k-s$s"
                    has_summary "$dir/$name.jsonl" && continue
                    [ -f "$dir/$name.diverged" ] && continue
                    rm -f "$dir/$name.jsonl"
                    start=$(date +%s.%N)
                    if ! mpirun -n "$n" "$BIN" train "${WORKLOAD[@]}" "${sync[@]}" --sync-every "$k" --seed "$s" --lr "$step" \
                            --metrics "$dir/$name.jsonl" "$@" > "$dir/$name.log" 2>&1; then
                        # A diverged run is a result (the summary counts it), anything else a bug.
                        grep -q "training diverged" "$dir/$name.log" && { touch "$dir/$name.diverged"; continue; }
                        echo "run $name failed: see $dir/$name.log" >&2; exit 1
                    fi
                    printf '%s %.1f s\n' "$name" "$(echo "$(date +%s.%N) - $start" | bc)"
                done
            done
        done
    done
done
echo "load after: $(uptime)"
python3 "$here/benches/low_comm.py" "$dir" | tee "$dir/summary.md"
