#!/usr/bin/env bash
# Issue 42 item 3: the time a lost rank costs under `asap-train elastic` (the elastic-restart
# fallback), against the target "at most one checkpoint interval plus the restart".
# N ranks (default 8) of asap on Fashion-MNIST (t10k held out), MLR, 2 epochs of batch 50, steps
# of 20 ms (--emulate-compute 20: a fixed step time, so the uninterrupted runs are a stable
# baseline on a shared machine), a checkpoint every EVERY rounds (default 50, 1 s). Each
# interrupted run: once the checkpoint of round KILL_AFTER (default 200, mid-epoch 1 at 8 ranks)
# exists, wait DELAY s (default 0.5: half an interval), then kill -9 rank 3; `asap-train elastic`
# relaunches on N-1 ranks from that checkpoint.
#   benches/elastic-restart.sh            (results: benches/elastic-restart.md)
# Per interrupted run, the time lost (its wall time less the median uninterrupted one) split into
#   detection  = the launcher's end (the restart record's ended_unix) less the kill;
#   redone     = the kill less the continued checkpoint's mtime (steps done again after it);
#   startup    = the relaunch's launch, MPI init, load, step search and set-up (its summary);
#   fewer      = the extra rounds on N-1 ranks (each has more examples per epoch: 100 steps
#                left of epoch 1 at 8 ranks are 115 at 7) at the uninterrupted round time;
#   rest       = what is left (the relaunch's mpirun start before its ranks run, noise);
# and the target: lost <= interval + detection + startup (interval = EVERY rounds of the
# uninterrupted run's round time).
set -euo pipefail
cd "$(dirname "$0")/.."
N=${N:-8}; EVERY=${EVERY:-50}; KILL_AFTER=${KILL_AFTER:-200}; DELAY=${DELAY:-0.5}; REPS=${REPS:-3}
OUT=$(mktemp -d /tmp/elastic-restart.XXXX)
cp target/release/asap-train "$OUT/asap-train"   # a rebuild during the runs cannot change it
BIN="$OUT/asap-train"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
train=(train --sync asap --epochs 2 --batch-size 50 --lr 0.05 --seed 5 --eval-every 1000000
       --emulate-compute 20 --checkpoint-every "$EVERY")
now() { date +%s.%N; }
rank_pid() { # rank_pid MARKER RANK: the pid of that rank of the job marked MARKER (one grep over
    # /proc: a loop of tr and grep per process took ~0.5 s of the 2 cores the ranks run on)
    local f p
    for f in $(grep -lsxz "ASAP_BENCH_JOB=$1" /proc/[0-9]*/environ); do
        if grep -qsxz "OMPI_COMM_WORLD_RANK=$2" "$f"; then p=${f#/proc/}; echo "${p%/environ}"; return; fi
    done
}
newest_round() { # the round of the newest checkpoint in DIR (0 if none)
    ls "$1" 2>/dev/null | sed -n 's/^ckpt-[0-9a-f]*-0*\([0-9][0-9]*\)\.h5$/\1/p' | sort -n | tail -1 | grep . || echo 0
}
for rep in $(seq "$REPS"); do
    t0=$(now)
    ASAP_BENCH_JOB=full$rep $BIN elastic -n "$N" -- "${train[@]}" --checkpoint-dir "$OUT/full$rep-ck" \
        --metrics "$OUT/full$rep.jsonl" > "$OUT/full$rep.log" 2>&1
    echo "$t0 $(now)" > "$OUT/full$rep.wall"
    t0=$(now)
    ASAP_BENCH_JOB=kill$rep $BIN elastic -n "$N" -- "${train[@]}" --checkpoint-dir "$OUT/kill$rep-ck" \
        --metrics "$OUT/kill$rep.jsonl" > "$OUT/kill$rep.log" 2>&1 &
    job=$!
    until [ "$(newest_round "$OUT/kill$rep-ck")" -ge "$KILL_AFTER" ]; do sleep 0.05; done
    pid=$(rank_pid "kill$rep" 3)
    sleep "$DELAY"
    now > "$OUT/kill$rep.killed"
    kill -9 "$pid"
    wait "$job"
    echo "$t0 $(now)" > "$OUT/kill$rep.wall"
    echo "rep $rep done" >&2
done
python3 - "$OUT" "$REPS" "$EVERY" <<'PY'
import json, os, statistics as st, sys
out, reps, every = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
def lines(name): return [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
def summary(name): return next(l for l in lines(name) if l["event"] == "summary")
def wall(name): a, b = map(float, open(f"{out}/{name}.wall").read().split()); return b - a
full = [wall(f"full{r}") for r in range(1, reps + 1)]
fm = [summary(f"full{r}")["final_metric"] for r in range(1, reps + 1)]
rt = st.median(summary(f"full{r}")["train_seconds"] / summary(f"full{r}")["rounds"] for r in range(1, reps + 1))
interval = every * rt
base = st.median(full)
print(f"uninterrupted: wall {st.median(full):.2f} s (range {min(full):.2f}-{max(full):.2f}), held-out {100*st.median(fm):.2f} % "
      f"(range {100*min(fm):.2f}-{100*max(fm):.2f}), round {1000*rt:.1f} ms, checkpoint interval {interval:.2f} s")
ck = [summary(f"full{r}")["phases"]["checkpoint"] / (summary(f"full{r}")["rounds"] // every + 1) for r in range(1, reps + 1)]
print(f"one checkpoint (the cut, gather and write; the checkpoint phase over the checkpoints written): median {1000*st.median(ck):.1f} ms "
      f"(range {1000*min(ck):.1f}-{1000*max(ck):.1f})")
rows = []
print("| run | wall s | lost s | detection s | redone s | startup s | fewer s | rest s | target s (interval + detection + startup) | met | held-out % | restarted at |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for r in range(1, reps + 1):
    name = f"kill{r}"
    s = summary(name)
    rs = s["restarts"][0]
    killed = float(open(f"{out}/{name}.killed").read())
    detection = rs["ended_unix"] - killed
    redone = killed - os.path.getmtime(rs["checkpoint"]) if os.path.exists(rs["checkpoint"]) else float("nan")
    ph = s["phases"]
    startup = sum(ph.get(k, 0.0) for k in ("launch", "mpi_init", "load", "step_search", "setup"))
    lost = wall(name) - base
    fewer = (s["rounds"] - st.median(summary(f"full{q}")["rounds"] for q in range(1, reps + 1))) * rt
    target = interval + detection + startup
    rows.append((lost, detection, redone, startup))
    print(f"| {r} | {wall(name):.2f} | {lost:.2f} | {detection:.2f} | {redone:.2f} | {startup:.2f} | {fewer:.2f} | {lost - detection - redone - startup - fewer:.2f} | "
          f"{target:.2f} | {'yes' if lost <= target else 'no'} | {100*s['final_metric']:.2f} | {s['ranks']} ranks from round {rs['checkpoint_round']} |")
for i, what in enumerate(["lost", "detection", "redone", "startup"]):
    v = [row[i] for row in rows]
    print(f"{what}: median {st.median(v):.2f} s (range {min(v):.2f}-{max(v):.2f})")
PY
echo "runs in $OUT" >&2
