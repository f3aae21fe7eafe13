#!/usr/bin/env bash
# What an asap round costs over a real link (issue 41 item 1): `--transport rma` (one-sided puts
# through Open MPI's osc/ucx on UCX's TCP transport) against `--transport p2p` (two-sided
# non-blocking messages), in the same run, alternating, on netlab's real shaped link.
#
# 2 netlab hosts of one rank each (netlab/wan.sh up 2 1 RATE DELAY: one link between them at RATE
# with DELAY one way), Open MPI over TCP. Every run is ROUNDS rounds of --sync asap (NOTIFY-ACK unless NOTIFY says)
# (the 2-rank graph: each rank's one in- and out-neighbour is the other) with 10 ms steps
# declared; the quantity is the sync seconds per round (mean over ranks), against the model of
# the link: one message of the model's bytes at RATE plus one latency each way (the message with
# its NOTIFY, then the ACK). The issue's target: at most 3 one-way latencies plus bytes over rate.
#
# Environment: RATE [100mbit], DELAY [10ms], MODEL [mlr] (31 KB a message; mlp: the MLP
# 784-HIDDEN-10), HIDDEN [1024], ROUNDS [40], REPS [3], TRANSPORTS ["rma p2p"], NOTIFY
# [notify-ack] (any --notify variant: barrier, none, deadline and push-sum run on both transports),
# BIN [target/release/asap-train].
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${RATE:-100mbit} DELAY=${DELAY:-10ms} MODEL=${MODEL:-mlr} HIDDEN=${HIDDEN:-1024} ROUNDS=${ROUNDS:-40}
REPS=${REPS:-3} TRANSPORTS=${TRANSPORTS:-rma p2p} NOTIFY=${NOTIFY:-notify-ack}
[[ $RATE =~ ^[0-9]+mbit$ && $DELAY =~ ^[0-9]+ms$ ]] || { echo "RATE must be Nmbit and DELAY Nms" >&2; exit 2; }
source benches/netlab-lib.sh
netlab_bench asap-transport atr 10.86.0
if [[ $MODEL == mlp ]]; then M=(--model mlp --hidden "$HIDDEN"); else M=(--model "$MODEL"); fi
# The relay at high priority: it carries every frame, and the 2 cores are shared.
nice -n -20 netlab/wan.sh up 2 1 "$RATE" "$DELAY" >/dev/null 2>&1
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg); 2 hosts, $RATE, $DELAY one way; $MODEL, --notify $NOTIFY, $ROUNDS rounds, $REPS reps"
for rep in $(seq "$REPS"); do
    for t in $TRANSPORTS; do
        netlab/wan.sh run 2 train "${M[@]}" --batch-size 64 --lr 0.1 --epochs 100 --max-rounds "$ROUNDS" \
            --eval-every 100000 --emulate-compute 10 --sync asap --notify "$NOTIFY" --transport "$t" \
            --metrics "$out/$t-$rep.jsonl" > "$out/$t-$rep.log" 2>&1
    done
done
python3 - "$out" "$REPS" "$TRANSPORTS" "${RATE%mbit}" "${DELAY%ms}" <<'PY'
import json, statistics, sys
out, reps, transports, mbit, ms = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), float(sys.argv[4]), float(sys.argv[5])
def row(t, rep):
    ev = [json.loads(l) for l in open(f"{out}/{t}-{rep}.jsonl")]
    start = next(e for e in ev if e["event"] == "start")
    s = next(e for e in ev if e["event"] == "summary")
    return s["counters"]["sync_seconds"]["mean"] / s["rounds"] * 1e3, start["params"], s["sync_metrics"]["torn"], start["sync_info"]["chosen"]
print("| transport | ms a round | one-way latencies a round, less the bytes | torn reads | the start line |")
print("|---|---|---|---|---|")
for t in transports:
    rows = [row(t, r) for r in range(1, reps + 1)]
    ms_round = [r[0] for r in rows]
    bytes_ms = 4 * rows[0][1] * 8 / (mbit * 1e6) * 1e3
    lat = [(m - bytes_ms) / ms for m in ms_round]
    print(f"| {t} | {statistics.median(ms_round):.1f} ({min(ms_round):.1f}-{max(ms_round):.1f}) | "
          f"{statistics.median(lat):.1f} ({min(lat):.1f}-{max(lat):.1f}) | {sum(r[2] for r in rows):.0f} | {rows[0][3]} |")
print(f"(a message's bytes over the rate: {bytes_ms:.1f} ms; the target: at most 3 latencies, {3 * ms:.0f} ms, plus that)")
PY
echo "# load at the end $(cut -d' ' -f1-3 /proc/loadavg); runs in $out"
