#!/usr/bin/env bash
# Validation of the emulated links (docs/emulation.md, issue 25 point 4): the program's link
# model (--emulate-bandwidth / --emulate-latency) against netlab's real shaped link, a real TCP
# stream through netlab/wanlink.py (network namespaces, Open MPI's TCP transport, every frame
# serialised at RATE and held DELAY one way by the relay).
#
# 2 ranks, one per host (netlab/wan.sh up 2 1 RATE DELAY): each rank's link is its host's link,
# which is what the program's per-rank link models. The same training runs three ways per mode:
#   real-link  across netlab's link (pml ob1, btl tcp);
#   emulated   on this machine's shared memory, with the link declared to the program;
#   unshaped   on shared memory, no link (what the link costs = real-link - unshaped).
# Compute is declared in every run (--emulate-compute COMPUTE ms), so the rows differ only in
# the link. A fixed number of rounds (no target): the quantity compared is training seconds
# (and sync seconds per rank) for the same rounds.
#
# Modes (MODES, every one by default; issue 41 item 4):
#   allreduce       --sync allreduce (auto: the program's ring on 2 netlab hosts)
#   allreduce-mpi   --sync allreduce --allreduce-algorithm mpi (Open MPI's own)
#   asap-rma        --sync asap --transport rma (one-sided puts over UCX's TCP transport)
#   asap-p2p        --sync asap --transport p2p (two-sided non-blocking messages)
#   ssp             --sync ssp
#   bosen           --sync bosen --bandwidth-mbps RATE (the budget at the link's rate)
#   gaia            --sync gaia --groups 2 (one rank per group: every exchange crosses the link)
#   (asap is asap-rma, the name of the first tables)
# The emulated runs declare the link with --emulate-bandwidth/--emulate-latency and
# --emulate-fabric F, once for every F in FABRICS (ideal: the ideal pipe; tcp: plus the real
# transport's costs), alternating with the real-link run, so every model sees the same load.
#
# Environment: REPS [3], ROUNDS [40], RATE [100mbit], DELAY [10ms], MODEL [mlp] (or mlr: a
# 31 KB message, latency-bound), HIDDEN [256] (MLP
# 784-HIDDEN-10: 203,530 parameters, a 0.81 MB message at 256), COMPUTE [10], MODES
# [every mode above], FABRICS ["ideal tcp"], UNSHAPED [1; 0 skips the unshaped runs], NICE [-20], NETLAB_NAME [el], NETLAB_NET [10.81.0] (another bench on netlab at the same
# time needs its own), BIN [target/release/asap-train].
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/priority.sh
REPS=${REPS:-3} ROUNDS=${ROUNDS:-40} RATE=${RATE:-100mbit} DELAY=${DELAY:-10ms}
MODEL=${MODEL:-mlp} HIDDEN=${HIDDEN:-256} COMPUTE=${COMPUTE:-10} MODES=${MODES:-allreduce asap-rma asap-p2p ssp bosen gaia} NICE=${NICE:--20}
SRC_BIN=${BIN:-$PWD/target/release/asap-train}
BIN=/tmp/emulation-links-bin-$$
cp "$SRC_BIN" "$BIN"
export BIN NETLAB_NAME=${NETLAB_NAME:-el} NETLAB_NET=${NETLAB_NET:-10.81.0}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
[[ $RATE =~ ^[0-9]+mbit$ && $DELAY =~ ^[0-9]+ms$ ]] || { echo "RATE must be Nmbit and DELAY Nms" >&2; exit 2; }
mb=${RATE%mbit} ms=${DELAY%ms}
UNSHAPED=${UNSHAPED:-1} FABRICS=${FABRICS:-ideal tcp}
mode_args() {
    case $1 in
    allreduce) echo --sync allreduce ;;
    allreduce-mpi) echo --sync allreduce --allreduce-algorithm mpi ;;
    asap | asap-rma) echo --sync asap --transport rma ;;
    asap-p2p) echo --sync asap --transport p2p ;;
    ssp) echo --sync ssp ;;
    bosen) echo --sync bosen --bandwidth-mbps "$mb" ;;
    gaia) echo --sync gaia --groups 2 ;;
    *) echo "unknown mode $1" >&2; exit 2 ;;
    esac
}
out=runs/emulation-links-$(date +%H%M%S)
mkdir -p "$out"
trap 'netlab/wan.sh down >/dev/null 2>&1 || true; rm -f "$BIN"; priority_restore' EXIT
datasets/prepare.sh >/dev/null
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg); $RATE, $DELAY one way, $MODEL (hidden $HIDDEN), $ROUNDS rounds, tcp_slow_start_after_idle ${NETLAB_IDLE_RESTART:-1}, relay queue ${NETLAB_QUEUE_MS:-default} ms, $COMPUTE ms declared steps, fabrics $FABRICS"
if [[ $MODEL == mlp ]]; then M=(--model mlp --hidden "$HIDDEN"); else M=(--model "$MODEL"); fi
common=("${M[@]}" --batch-size 64 --lr 0.1 --epochs 100 --max-rounds "$ROUNDS" --eval-every 100000 --emulate-compute "$COMPUTE")
nice -n "$NICE" netlab/wan.sh up 2 1 "$RATE" "$DELAY" 2>/dev/null
for mode in $MODES; do
    read -ra a <<< "$(mode_args "$mode")"
    for rep in $(seq 1 "$REPS"); do
        nice -n "$NICE" netlab/wan.sh run 2 train "${common[@]}" "${a[@]}" --metrics "$out/$mode-real-link-$rep.jsonl" > "$out/$mode-real-link-$rep.log" 2>&1
        for f in $FABRICS; do
            nice -n "$NICE" mpirun -n 2 "$BIN" train "${common[@]}" "${a[@]}" --emulate-bandwidth "$mb" --emulate-latency "$ms" --emulate-fabric "$f" --metrics "$out/$mode-emulated-$f-$rep.jsonl" > "$out/$mode-emulated-$f-$rep.log" 2>&1
        done
        [[ $UNSHAPED == 0 ]] || nice -n "$NICE" mpirun -n 2 "$BIN" train "${common[@]}" "${a[@]}" --metrics "$out/$mode-unshaped-$rep.jsonl" > "$out/$mode-unshaped-$rep.log" 2>&1
    done
done
netlab/wan.sh stats > "$out/link.json"
python3 - "$out" "$REPS" "$MODES" "$UNSHAPED" "$FABRICS" <<'PY'
import json, statistics, sys
out, reps, modes, unshaped, fabrics = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(), sys.argv[4] != "0", sys.argv[5].split()
def summary(name, rep):
    return next(e for e in map(json.loads, open(f"{out}/{name}-{rep}.jsonl")) if e["event"] == "summary")
def col(name):
    ss = [summary(name, r) for r in range(1, reps + 1)]
    valid = all((s.get("emulation") or {}).get("valid", True) for s in ss)
    return [s["train_seconds"] for s in ss], [s["counters"]["sync_seconds"]["mean"] for s in ss], valid
def fmt(v):
    return f"{statistics.median(v):.2f} ({min(v):.2f}-{max(v):.2f})"
head = "| mode | real link: train s | " + " | ".join(f"emulated {f}: train s | {f} / real" for f in fabrics)
head += " | unshaped: train s | link's cost, " + " / ".join(fabrics) + " / real | valid: real, " + ", ".join(fabrics) + " |"
print(head)
print("|---" * (head.count("|") - 1) + "|")
for m in modes:
    rt, rs, rv = col(f"{m}-real-link")
    r = statistics.median(rt)
    ut, us, uv = col(f"{m}-unshaped") if unshaped else ([float("nan")], [], True)
    u = statistics.median(ut)
    cells, costs, valid = [], [], ["yes" if rv else "NO"]
    for f in fabrics:
        et, es, ev = col(f"{m}-emulated-{f}")
        e = statistics.median(et)
        cells.append(f"{fmt(et)} | **{e / r:.2f}**")
        costs.append(f"{(e - u) / (r - u):.2f}" if unshaped and r > u else "-")
        valid.append("yes" if ev else "NO")
    print(f"| {m} | {fmt(rt)} | " + " | ".join(cells) + f" | {fmt(ut) if unshaped else '-'} | {' / '.join(costs)} | {', '.join(valid)} |")
PY
echo "# load at the end $(cut -d' ' -f1-3 /proc/loadavg); runs in $out"
