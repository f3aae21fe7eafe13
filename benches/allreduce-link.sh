#!/usr/bin/env bash
# allreduce at link rate over TCP (issue 41 item 2): how much of a real link one sync of
# `--sync allreduce` uses, for `--allreduce-algorithm mpi` (Open MPI's own, polled as
# MPI_Iallreduce under the job's deadline) against `ring` (the program's ring of point-to-point
# messages), in the same run, alternating.
#
# HOSTS netlab hosts of one rank each (netlab/wan.sh hosts: every host behind a link of its own
# at RATE with DELAY one way, so a message between two hosts crosses two links: 2 x DELAY), the
# ranks over Open MPI's TCP transport. Every run is ROUNDS syncs of the MLP 784-HIDDEN-10 (4 x
# 814,090 bytes = 3.26 MB at HIDDEN 1024) with 10 ms steps declared, and the quantity is the
# sync seconds per round (mean over ranks). "% of link" = a bandwidth-optimal allreduce's bytes
# per rank, 2 (N-1)/N of the model each way, over RATE, divided by that: 100 % is the ring at
# the link's rate with no latency. A bulk TCP stream through the same relay (netlab/wan.sh
# bulk) is measured first: the relay's own ceiling on this machine now.
#
# Environment: HOSTS [2], RATE [100mbit], DELAY [1ms], HIDDEN [1024], ROUNDS [20], REPS [3],
# ALGOS ["mpi ring"], BIN [target/release/asap-train].
set -euo pipefail
cd "$(dirname "$0")/.."
HOSTS=${HOSTS:-2} RATE=${RATE:-100mbit} DELAY=${DELAY:-1ms} HIDDEN=${HIDDEN:-1024} ROUNDS=${ROUNDS:-20}
REPS=${REPS:-3} ALGOS=${ALGOS:-mpi ring}
[[ $RATE =~ ^[0-9]+mbit$ ]] || { echo "RATE must be Nmbit" >&2; exit 2; }
source benches/netlab-lib.sh
netlab_bench allreduce-link arl 10.84.0
links=()
for _ in $(seq "$HOSTS"); do links+=("$RATE/$DELAY"); done
# The relay at high priority: it carries every frame, and the 2 cores are shared.
nice -n -20 netlab/wan.sh hosts "${links[@]}" >/dev/null 2>&1
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg); $HOSTS hosts, each $RATE, $DELAY one way; MLP hidden $HIDDEN, $ROUNDS rounds, $REPS reps"
echo "# bulk TCP through the relay, host 0 -> 1: $(netlab/wan.sh bulk 0 1 8)"
for rep in $(seq "$REPS"); do
    for algo in $ALGOS; do
        netlab/wan.sh run "$HOSTS" train --model mlp --hidden "$HIDDEN" --batch-size 64 --lr 0.1 --epochs 100 \
            --max-rounds "$ROUNDS" --eval-every 100000 --emulate-compute 10 --sync allreduce \
            --allreduce-algorithm "$algo" --metrics "$out/$algo-$rep.jsonl" > "$out/$algo-$rep.log" 2>&1
    done
done
python3 - "$out" "$REPS" "$ALGOS" "$HOSTS" "${RATE%mbit}" <<'PY'
import json, statistics, sys
out, reps, algos, n, mbit = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), int(sys.argv[4]), float(sys.argv[5])
def per_round(algo, rep):
    events = [json.loads(l) for l in open(f"{out}/{algo}-{rep}.jsonl")]
    start = next(e for e in events if e["event"] == "start")
    s = next(e for e in events if e["event"] == "summary")
    return s["counters"]["sync_seconds"]["mean"] / s["rounds"], start["params"], start["sync_info"]["chosen"]
print("| algorithm | ms per allreduce | % of link | what the start line said |")
print("|---|---|---|---|")
for a in algos:
    rows = [per_round(a, r) for r in range(1, reps + 1)]
    ms = [1e3 * t for t, _, _ in rows]
    ideal = 2 * (n - 1) / n * 4 * rows[0][1] * 8 / (mbit * 1e6) * 1e3
    pct = [100 * ideal / m for m in ms]
    print(f"| {a} | {statistics.median(ms):.0f} ({min(ms):.0f}-{max(ms):.0f}) | {statistics.median(pct):.0f} ({min(pct):.0f}-{max(pct):.0f}) | {rows[0][2]} |")
print(f"(ideal ring at the link's rate: {ideal:.0f} ms)")
PY
echo "# load at the end $(cut -d' ' -f1-3 /proc/loadavg); runs in $out"
