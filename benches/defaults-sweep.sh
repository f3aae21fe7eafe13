#!/usr/bin/env bash
# Issue 27: does the DEFAULT run (no --lr: the step is chosen at start-up, src/train/step_search.rs)
# show an objective that falls epoch over epoch? Every mode, at 1, 4, 8 and 32 ranks, on every
# data set the project ships or generates. One markdown row per run: the chosen step, the
# objective after each epoch, and whether it fell every epoch. benches/defaults-sweep.md keeps the
# output of a run and says which subset it was.
#   benches/defaults-sweep.sh                      everything (slow on 2 cores: hours)
#   RANKS="1 8" MODES="allreduce asap" SETS="fashion-mlr" EPOCHS=3 benches/defaults-sweep.sh
# Sets: fashion-mlr, fashion-mlp (Fashion-MNIST; the t10k file as training data for speed, so the
# held-out set is --test-fraction 0.2 of it), heart (heart_scale, liblinear-tools, logreg), rcv1-svm
# and rcv1-logreg (asap-train data synth --rows 50000), movielens-mf (when `make datasets` ran).
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/asap-train}
RANKS=${RANKS:-1 4 8 32}
MODES=${MODES:-allreduce asap ssp bosen async gaia none}
SETS=${SETS:-fashion-mlr fashion-mlp heart rcv1-svm rcv1-logreg movielens-mf}
EPOCHS=${EPOCHS:-3}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
FASHION=/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz
HEART=/usr/share/doc/liblinear-tools/examples/heart_scale
ML=datasets/out/movielens-train.ratings
data_args() { # data_args SET: the data and model options of a set (nothing else: defaults)
    case $1 in
    fashion-mlr) echo "--data $FASHION --test-fraction 0.2" ;;
    fashion-mlp) echo "--data $FASHION --test-fraction 0.2 --model mlp" ;;
    heart) echo "--data $HEART --model logreg" ;;
    rcv1-svm | rcv1-logreg)
        [ -f "$out/rcv1.svm" ] || $BIN data synth --rows 50000 "$out/rcv1.svm" >/dev/null
        echo "--data $out/rcv1.svm --test-fraction 0.2 --model ${1#rcv1-}" ;;
    movielens-mf) [ -f "$ML" ] && echo "--data $ML --test-data ${ML/train/test} --model mf" ;;
    esac
}
mode_args() { # the options a mode cannot run without
    case $1 in
    bosen) echo "--bandwidth-mbps 400" ;;
    esac
}
echo "| set | mode | ranks | chosen --lr | objective after each epoch | falls every epoch |"
echo "|---|---|---|---|---|---|"
for set in $SETS; do
    args=$(data_args "$set") || true
    if [ -z "$args" ]; then echo "| $set | - | - | - | no data (make datasets) | - |"; continue; fi
    for mode in $MODES; do
        for np in $RANKS; do
            name="$set-$mode-$np"
            # shellcheck disable=SC2046
            if ! mpirun -n "$np" $BIN train $args --sync "$mode" $(mode_args "$mode") --epochs "$EPOCHS" \
                --metrics "$out/$name.jsonl" > "$out/$name.log" 2>&1; then
                echo "| $set | $mode | $np | - | failed: $(grep -m1 -o 'error.*' "$out/$name.log" | cut -c1-120) | no |"
                continue
            fi
            /usr/bin/python3 - "$out/$name" "$set" "$mode" "$np" <<'PY'
import json, sys
base, s, mode, np_ = sys.argv[1:]
lines = [json.loads(l) for l in open(base + ".jsonl")]
objs = [l["objective"] for l in lines if l.get("event") == "eval"]
lr = next((l.split("step size ")[1].split()[0] for l in open(base + ".log") if "step size" in l), "given")
falls = all(b < a for a, b in zip(objs, objs[1:]))
print(f"| {s} | {mode} | {np_} | {lr} | {' '.join(f'{o:.4f}' for o in objs)} | {'yes' if falls else 'NO'} |")
PY
        done
    done
done
