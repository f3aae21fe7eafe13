#!/usr/bin/env bash
# Issue 41 item 5: NOTIFY-ACK against the barrier variant of the same stochastic reduce, per
# round, in a compute-bound round with step-time variance, at 8 and 32 ranks.
#   benches/jitter-rounds.sh OUTDIR      (results: benches/jitter-rounds.md)
#
# The setting (why each number):
# - compute-bound: MLR on Fashion-MNIST, batch 256 a rank (0.916 ms a step on the 10gbe
#   profile's nodes, clusters/10gbe.toml), whose 31 KB message takes 0.025 ms at 10 Gbit/s plus
#   0.015 ms of latency: the links are about 5 % of a round, so a round's time is its steps';
# - dilation 100 (91.6 ms declared steps): 32 ranks' real steps (32 x ~0.9 ms of CPU on 2 cores)
#   fill a sixth of a step, with room for the fastest jittered step (0.68 x). Measured
#   2026-11-29 17:12-17:17 UTC at load 16-27 (other engineers' builds and stress loops): at
#   dilation 50 (45.8 ms) 11 of 12 rows were INVALID (drift +2 to +8 %, no broken step); at 100 a
#   32-rank row held (drift +0.01 %) at load 22;
# - the root expander (out-degree 2, the ASAP paper's graph for its NOTIFY-ACK claim, §6.2);
#   `--notify barrier` is the same reduce with a barrier after the puts (the paper's BSP);
# - three step-time forms (--emulate-jitter):
#   none:       every step takes its declared time;
#   here:       this machine's MLR steps, measured by `asap-train bench --models mlr
#               --batch-size 64 --seconds 1.5` (docs/emulation.md, 2026-11-29 09:20 UTC);
#   production: the ASYNC paper's production-cluster stragglers (papers/async-engine-...txt,
#               §VI-C, from Garraghan et al. 2016 and Mantri, OSDI 2010: 25 % of machines
#               straggle, 80 % of those 1.5-2.5x the average task, the rest 2.5-10x), taken per
#               step: 3 steps in 4 at 1, 1 in 5 uniform in 1.5-2.5, 1 in 20 uniform in 2.5-10,
#               divided by its mean 1.4625 so that the mean step is the declared one;
# - a fixed ROUNDS [40] rounds a run (seconds a round = training seconds / rounds), and the
#   time and rounds to the averaged model's 80 % on t10k (evaluated every 5 rounds).
# Environment: REPS [3], ROUNDS [40], DILATION [100], SIZES ["8 32"], FORMS ["none here production"], ONLY
# (regex on row names), BIN [target/release/asap-train], NICE [-20].
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/priority.sh
OUTDIR=${1:?usage: benches/jitter-rounds.sh OUTDIR}
mkdir -p "$OUTDIR"
REPS=${REPS:-3}
ROUNDS=${ROUNDS:-40}
BIN=${BIN:-target/release/asap-train}
NICE=${NICE:--20}
[ -x "$BIN" ] || { echo "jitter-rounds.sh: no binary at $BIN: cargo build --release first" >&2; exit 1; }
cp "$BIN" "$OUTDIR/asap-train"   # a rebuild during the runs cannot change it
BIN="$OUTDIR/asap-train"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
trap 'priority_restore' EXIT
declare -A FORM=(
    [none]=""
    [here]="0:0.814,0.01:0.846,0.1:0.867,0.5:0.9,0.9:1.342,0.99:1.542,0.999:1.814,1:4.359"
    [production]="0:0.684,0.75:0.684,0.7501:1.026,0.95:1.709,1:6.838"
)
common=(train --cluster clusters/10gbe.toml --dilation "${DILATION:-100}" --model mlr --batch-size 256 --seed 1
    --sync asap --graph root-expander --own-models 1 --target 0.80 --target-on averaged
    --eval-every 5 --max-rounds "$ROUNDS")
for n in ${SIZES:-8 32}; do
    for form in ${FORMS:-none here production}; do
        for notify in notify-ack barrier; do
            name="n$n $form $notify"
            [[ -n ${ONLY:-} && ! $name =~ $ONLY ]] && continue
            for rep in $(seq 1 "$REPS"); do
                f="$OUTDIR/n$n-$form-$notify-$rep"
                jit=()
                [[ -n ${FORM[$form]} ]] && jit=(--emulate-jitter "${FORM[$form]}")
                nice -n "$NICE" mpirun -n "$n" "$BIN" "${common[@]}" --notify "$notify" "${jit[@]}" \
                    --metrics "$f.jsonl" > "$f.log" 2>&1 || echo "$name run $rep failed: $f.log" >&2
            done
            echo "$name: done" >&2
        done
    done
done
python3 - "$OUTDIR" "$REPS" <<'EOF'
import json, os, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
def runs(stem):
    for r in range(1, reps + 1):
        p = f"{out}/{stem}-{r}.jsonl"
        if not os.path.exists(p):
            continue
        lines = [json.loads(l) for l in open(p)]
        s = [l for l in lines if l["event"] == "summary"]
        if s:
            yield lines, s[-1]
def med(v):
    return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})" if v else "-"
print("| ranks | steps | variant | ms a round | s to 80 % | rounds to 80 % | wait s a rank | valid |")
print("|---|---|---|---|---|---|---|---|")
ratios = {}
for n in (8, 32):
    for form in ("none", "here", "production"):
        per = {}
        for notify in ("notify-ack", "barrier"):
            ms, tt, rr, wait, valid, got = [], [], [], [], True, 0
            for lines, s in runs(f"n{n}-{form}-{notify}"):
                got += 1
                em = s.get("emulation") or {}
                valid &= bool(em.get("valid"))
                ms.append(1e3 * s["train_seconds"] / s["rounds"])
                t = s.get("time_to_target") or {}
                if t:
                    tt.append(t["train_seconds"]); rr.append(t["round"])
                w = s["counters"].get("wait_seconds") or {}
                if "mean" in w:
                    wait.append(w["mean"])
            if not got:
                continue
            per[notify] = statistics.median(ms)
            v = "valid" if valid and got == reps else f"INVALID ({got} runs)"
            print(f"| {n} | {form} | {notify} | {med(ms)} | {med(tt)} | {med(rr)} | {med(wait)} | {v} |")
        if len(per) == 2:
            ratios[(n, form)] = per["barrier"] / per["notify-ack"]
print()
for (n, form), r in ratios.items():
    print(f"{n} ranks, {form}: barrier / notify-ack per round = {r:.2f}x")
EOF
