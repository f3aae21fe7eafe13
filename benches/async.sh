#!/usr/bin/env bash
# --sync async measured as in the ASYNC paper (section VI): least squares (--model lsq) with
# SGD (--barrier bsp), ASGD (--barrier async), SAGA (bsp + --optimizer saga) and ASAGA (async +
# saga), objective minus the exact optimum (benches/lsq-optimum.py, normal equations in float64)
# against training time. Scenarios: 8 ranks; 8 ranks with the controlled-delay straggler at
# 100 % (the last rank at half speed); 32 ranks with the production-cluster pattern (seeded).
#   benches/async.sh fashion   Fashion-MNIST, label = class >= 5 (+1/-1), standardised pixels
#   benches/async.sh sparse    a synthetic RCV1-like sparse LIBSVM set (asap-train data synth:
#                              40,000 x 1,000, 2 % non-zeros, unit-norm rows, +1/-1 labels)
# One markdown report per call, every row from this one run (REPEAT=3 repetitions of each
# configuration, interleaved; medians). The same --lr for all four: the
# coordinator adds each result with weight 1/M, so asynchronous updates take 1/M of the
# synchronous step (the paper's heuristic for ASGD/ASAGA).
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-fashion}
BIN=target/release/asap-train
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
PY=/usr/bin/python3
$PY -c 'import numpy' 2>/dev/null || { echo "benches/async.sh needs numpy: apt-get install python3-numpy" >&2; exit 1; }
out=runs/async-$WHAT
case "$WHAT" in
fashion)
    DATA=/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz
    LAMBDA=1e-4
    COMMON=(--data "$DATA" --label-threshold 5 --model lsq --lambda $LAMBDA --lr 0.01 --lr-schedule constant
            --batch-size 500 --epochs 20)
    EVERY8=20 EVERY32=5
    OPT=$($PY benches/lsq-optimum.py "$DATA" $LAMBDA 5) ;;
sparse)
    DATA=runs/data/async-sparse.svm
    [ -f $DATA ] || $BIN data synth $DATA --rows 40000 --features 1000 --density 0.02 --seed 1 >/dev/null
    LAMBDA=1e-3
    COMMON=(--data "$DATA" --model lsq --lambda $LAMBDA --lr 1.5 --lr-schedule constant --batch-size 500 --epochs 20)
    EVERY8=10 EVERY32=3
    OPT=$($PY benches/lsq-optimum.py "$DATA" $LAMBDA none) ;;
*) echo "usage: benches/async.sh fashion|sparse" >&2; exit 2 ;;
esac
echo "reference optimum (normal equations, float64): $OPT" >&2
REPEAT=${REPEAT:-3}
# REPORT_ONLY=1 renders the report again from the runs in runs/async-$WHAT (no new runs).
if [ "${REPORT_ONLY:-0}" = 1 ]; then
    mapfile -t rows < <(ls "$out" | sed -n 's/\.jsonl$//p')
else
rm -rf "$out"; mkdir -p "$out"
rows=()
run() { # run NAME NP EVAL_EVERY ARGS...
    local name=$1 np=$2 every=$3; shift 3
    if ! mpirun -n "$np" $BIN train "${COMMON[@]}" --sync async --eval-every "$every" --metrics "$out/$name.jsonl" "$@" > "$out/$name.log" 2>&1; then
        echo "run $name failed: see $out/$name.log" >&2; exit 1
    fi
    rows+=("$name")
}
# The repetitions interleave (each pass runs every configuration once), so a burst of load from
# other jobs on the machine does not hit all repetitions of one configuration.
for rep in $(seq 1 "$REPEAT"); do
    for scenario in "8:plain:" "8:delay100:--straggler delay:100" "32:production:--straggler production:1"; do
        IFS=: read -r np tag straggle <<< "$scenario"
        every=$([ "$np" = 8 ] && echo $EVERY8 || echo $EVERY32)
        for alg in "SGD:bsp:sgd" "ASGD:async:sgd" "SAGA:bsp:saga" "ASAGA:async:saga"; do
            IFS=: read -r name barrier opt <<< "$alg"
            # shellcheck disable=SC2086
            run "$name-$np-$tag-r$rep" "$np" "$every" --barrier "$barrier" --optimizer "$opt" $straggle
        done
    done
done
fi
$PY - "$out" "$OPT" "$REPEAT" "${rows[@]}" <<'PY'
import json, statistics, sys
out, opt, reps = sys.argv[1], json.loads(sys.argv[2])["optimum"], int(sys.argv[3])
order = ["SGD", "ASGD", "SAGA", "ASAGA"]
scen = ["8-plain", "8-delay100", "32-production"]
names = [f"{a}-{s}-r{r}" for s in scen for a in order for r in range(1, reps + 1)]
runs = {n: [json.loads(l) for l in open(f"{out}/{n}.jsonl")] for n in names if n in set(sys.argv[4:])}
med = statistics.median
def evals(n):
    return [(e["train_seconds"], e["objective"] - opt) for e in runs[n] if e["event"] == "eval"]
configs = list(dict.fromkeys(n.rsplit("-r", 1)[0] for n in runs))
twin = {"ASGD": "SGD", "ASAGA": "SAGA"}
def reps_of(c):
    return [f"{c}-r{r}" for r in range(1, reps + 1)]
def target(c):
    # The gap the synchronous twin reaches halfway through its evaluations (median over reps).
    alg, sc = c.split("-", 1)
    sync = twin.get(alg, alg) + "-" + sc
    return med(evals(n)[len(evals(n)) // 2][1] for n in reps_of(sync))
def t_to(n, g):
    return next((t for t, x in evals(n) if x <= g), None)
print(f"Reference optimum F* = {opt:.6f}; gap = training objective - F*. Medians over {reps} repetitions.")
print("Target gap: what the synchronous twin (SGD for ASGD, SAGA for ASAGA) reaches halfway through its evaluations.\n")
print("| run | ranks | rounds | train s | final gap | target gap | train s to target (min-max) | speed-up vs sync (medians) | wait ms/round (mean rank) | result staleness mean/max | sent MB/rank (mean/max) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
tt = {}
for c in configs:
    g = target(c)
    ts = [t_to(n, g) for n in reps_of(c)]
    tt[c] = med([t for t in ts if t is not None]) if any(t is not None for t in ts) else None
for c in configs:
    ns = reps_of(c)
    last = [next(e for e in runs[n] if e["event"] == "summary") for n in ns]
    alg, sc = c.split("-", 1)
    speed = "-"
    if alg in twin and tt[c] and tt.get(twin[alg] + "-" + sc):
        speed = f"{tt[twin[alg] + '-' + sc] / tt[c]:.2f}x"
    reached = sum(t_to(n, target(c)) is not None for n in ns)
    each = [t for t in (t_to(n, target(c)) for n in ns) if t is not None]
    tto = (f"{tt[c]:.2f} ({min(each):.2f}-{max(each):.2f})" + ("" if reached == reps else f", {reached}/{reps} reached")) if tt[c] else "not reached"
    s0, sm = last[0], last[0]["sync_metrics"]
    print(f"| {c} | {s0['ranks']} | {s0['rounds']} | {med(s['train_seconds'] for s in last):.2f} | {med(evals(n)[-1][1] for n in ns):.5f} | "
          f"{target(c):.5f} | {tto} | {speed} | {med(1e3 * s['counters']['wait_seconds']['mean'] / s['rounds'] for s in last):.2f} | "
          f"{med(s['sync_metrics']['mean_result_staleness'] for s in last):.2f} / {max(s['sync_metrics']['max_result_staleness'] for s in last):.0f} | "
          f"{med(s['counters']['bytes_sent']['mean'] for s in last) / 1e6:.1f} / {med(s['counters']['bytes_sent']['max'] for s in last) / 1e6:.1f} |")
print("\nObjective minus F* against training seconds, first repetition (every evaluation, `s: gap`):\n")
print("| run | gap over time |")
print("|---|---|")
for c in configs:
    print(f"| {c} | " + ", ".join(f"{t:.2f}: {g:.4f}" for t, g in evals(c + "-r1")) + " |")
PY
