#!/usr/bin/env bash
# A rank lost in place (issue 42 item 3; docs/training.md, "Losing a rank in place"): N ranks
# (default 8) train the default model (Fashion-MNIST softmax regression) with asap NOTIFY-ACK over
# two-sided messages for EPOCHS epochs (default 3), REPS times (default 3) uninterrupted and REPS
# times with rank 5 killed by SIGKILL at round 350 (KILL=RANK:ROUND; 235 rounds an epoch at 8
# ranks, so mid epoch 1), every run with the same seed, all under the ULFM build (`make ulfm`).
#
# Reported per run, then as median [min, max]:
# - the final held-out accuracy, and the killed runs' difference to the uninterrupted median;
# - seconds lost to the failure, two ways:
#   `lost`: the run's own record (rank_lost's seconds_lost): the slowest survivor's time from the
#     start of its last step before it caught the failure, plus the shrink and set-up until every
#     survivor trains again (the gap in step progress around the failure);
#   `kill->resume`: the wall time from the killed rank's last moment (the unix time it prints
#     before raising SIGKILL) to the survivors' return to training (rank_lost's resumed_unix).
#
#   make ulfm && benches/ulfm-kill.sh            # REPS=3 N=8 KILL=5:350 EPOCHS=3
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-3}
N=${N:-8}
KILL=${KILL:-5:350}
EPOCHS=${EPOCHS:-3}
V=$PWD/.venv-ompi5
B=$PWD/target/ompi5/release/asap-train
[ -x "$B" ] && [ -x "$V/bin/mpirun" ] || { echo "benches/ulfm-kill.sh: the ULFM build is missing: run make ulfm" >&2; exit 1; }
export LD_LIBRARY_PATH=$V/lib OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=runs/bench-ulfm
mkdir -p "$out"
args=(train --sync asap --transport p2p --notify notify-ack --epochs "$EPOCHS" --seed 1 --on-rank-loss continue)
run() { # name, extra args...
    local name=$1
    shift
    local t0=$(date +%s.%N)
    timeout -k 5 120 "$V/bin/mpirun" --with-ft ulfm --oversubscribe -n "$N" "$B" "${args[@]}" --metrics "$out/$name.jsonl" "$@" \
        >"$out/$name.log" 2>&1 || { echo "$name failed (see $out/$name.log)" >&2; exit 1; }
    echo "$name wall $(echo "$(date +%s.%N) - $t0" | bc) s" >>"$out/walls.txt"
}
: >"$out/walls.txt"
for i in $(seq "$REPS"); do
    run "base-$i"
    run "kill-$i" --fault-kill "$KILL"
done
python3 - "$out" "$REPS" <<'EOF'
import json, re, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
def lines(name):
    return [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
def fmt(xs):
    return f"{statistics.median(xs):.3f} [{min(xs):.3f}, {max(xs):.3f}]"
walls = dict(l.split(" wall ") for l in open(f"{out}/walls.txt").read().splitlines())
base, kill, lost, k2r, ranks = [], [], [], [], []
for i in range(1, reps + 1):
    b, k = lines(f"base-{i}"), lines(f"kill-{i}")
    sb = [v for v in b if v.get("event") == "summary"][-1]
    sk = [v for v in k if v.get("event") == "summary"][-1]
    rec = [v for v in k if v.get("event") == "rank_lost"][0]
    killed = float(re.search(r"kills itself .* \(unix time ([0-9.]+)\)", open(f"{out}/kill-{i}.log", errors="replace").read()).group(1))
    base.append(100 * sb["final_metric"])
    kill.append(100 * sk["final_metric"])
    lost.append(rec["seconds_lost"])
    k2r.append(rec["resumed_unix"] - killed)
    ranks.append(sk["ranks"])
    print(f"run {i}: uninterrupted {base[-1]:.2f} % (wall {walls[f'base-{i}']}), killed {kill[-1]:.2f} % with {sk['ranks']} ranks "
          f"(wall {walls[f'kill-{i}']}); lost {lost[-1]:.3f} s (stalled {rec['stalled_seconds']:.3f} + recovery "
          f"{rec['recovery_seconds']:.3f}, of which shrink {rec['shrink_seconds']:.3f}, reading the shards {rec['reread_seconds']:.3f}), kill->resume {k2r[-1]:.3f} s; dealt {rec['examples_dealt']}, dropped {rec['examples_dropped']}")
mb = statistics.median(base)
print(f"held-out accuracy, uninterrupted: {fmt(base)} %")
print(f"held-out accuracy, killed:        {fmt(kill)} %")
print(f"killed - uninterrupted median:    {fmt([k - mb for k in kill])} pt (target: within 0.5)")
print(f"seconds lost (run's record):      {fmt(lost)} s (target: at most 2)")
print(f"kill -> training again (wall):    {fmt(k2r)} s")
print(f"ranks at the end:                 {sorted(set(ranks))}")
EOF
