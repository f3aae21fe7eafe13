#!/usr/bin/env bash
# Gaia across two "data centres" on real hosts: network namespaces (netlab/wan.sh), 2 groups x
# 1 host, 4 ranks per host (8 ranks), the link between the groups rate-shaped by tc htb to
# 100 Mbit/s; "LAN" = the same hosts unshaped. One markdown table per call, every row from
# this one run:
#   benches/gaia.sh mlr        Fashion-MNIST MLR to 84 % held-out accuracy
#   benches/gaia.sh mf         MovieLens MF to a held-out RMSE of 0.91
#   benches/gaia.sh emulate    --emulate-bandwidth against the shaped link, 2 ranks (one per
#                              host, so the program's per-rank link is the host's link),
#                              bandwidth-bound: gaia at significance 0 on MovieLens MF
# Rows: allreduce over all 8 ranks across the WAN; gaia at 1 % and 5 % (DS 2); allreduce on the
# unshaped LAN; gaia 1 % on the LAN. WAN MB = bytes the kernel's shaped class carried out of
# both hosts (tc -s class: every byte that crossed, MPI's own and TCP/IP headers included);
# insignificant = 1 - significant/updates (per clock and parameter with a non-zero update).
# This kernel has no sch_netem, so the 50 ms delay of the issue cannot be shaped (see
# docs/gaia.md); the link is rate-limited only.
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-mlr}
BIN=$PWD/target/release/asap-train
export BIN NETLAB_NAME=awbn NETLAB_NET=10.79.0
out=runs/gaia-$WHAT
rm -rf "$out"; mkdir -p "$out"
trap 'netlab/wan.sh down' EXIT
rows=()
shaped() { # total bytes the shaped classes of the hosts have sent
    local t=0 h b
    for h in 0 1; do
        b=$(ip netns exec "$NETLAB_NAME-h$h" tc -s class show dev eth0 2>/dev/null | awk '/Sent/ {print $2; exit}')
        t=$((t + ${b:-0}))
    done
    echo $t
}
run() { # run NAME LINK(wan|lan) NP ARGS...
    local name=$1 link=$2 np=$3; shift 3
    if [[ $link == wan ]]; then netlab/wan.sh up 2 1 100mbit 0ms 2>/dev/null; else netlab/wan.sh up 2 1 none 0ms 2>/dev/null; fi
    if ! netlab/wan.sh run "$np" train --metrics "$out/$name.jsonl" "$@" > "$out/$name.log" 2>&1; then
        echo "run $name failed: see $out/$name.log" >&2; exit 1
    fi
    echo "$(shaped)" > "$out/$name.wan"
    rows+=("$name")
}
table() { # table TARGET LOWER_IS_BETTER(0/1) REFERENCE_ROW
    python3 - "$out" "$1" "$2" "$3" "${rows[@]}" <<'PY'
import json, sys
out, target, lower, ref = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1", sys.argv[4]
def load(name):
    lines = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    ok = lambda v: v is not None and (v <= target if lower else v >= target)
    hit = next((e for e in lines if e["event"] == "eval" and ok(e["test_metric"])), None)
    return lines[-1], hit
_, rhit = load(ref)
print("| run | ranks | clocks to target | train s to target | vs LAN | final metric | WAN MB (kernel) | LAN+WAN MB sent/rank | insignificant | sync s/rank (mean/max) | mirror wait s (max) |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for name in sys.argv[5:]:
    s, hit = load(name)
    c = s["counters"]; sm = s.get("sync_metrics") or {}
    wan = int(open(f"{out}/{name}.wan").read()) / 1e6
    fm = s["final_metric"]
    fms = f"{fm:.4f}" if lower else f"{100*fm:.2f} %"
    to = f"{hit['round']} | {hit['train_seconds']:.2f}" if hit else "not reached | -"
    ratio = f"{hit['train_seconds']/rhit['train_seconds']:.2f}x" if hit and rhit else "-"
    ins = f"{100*(1-sm['significant_updates']/sm['updates']):.1f} %" if sm.get("updates") else "-"
    mw = f"{sm['mirror_wait_seconds']:.2f}" if "mirror_wait_seconds" in sm else "-"
    print(f"| {name} | {s['ranks']} | {to} | {ratio} | {fms} | {wan:.1f} | {c['bytes_sent']['mean']/1e6:.1f} | {ins} | "
          f"{c['sync_seconds']['mean']:.2f} / {c['sync_seconds']['max']:.2f} | {mw} |")
PY
}
MF=(--data datasets/out/movielens-train.ratings --test-data datasets/out/movielens-test.ratings --model mf
    --lambda 0.1 --lr-decay 0.9 --lr 1)
case "$WHAT" in
mlr) DATA=(--epochs 5 --eval-every 10); TARGET=(0.84 0) ;;
mf) datasets/prepare.sh >/dev/null; DATA=("${MF[@]}" --epochs 20 --sync-every 22 --eval-every 4); TARGET=(0.91 1) ;;
emulate)
    datasets/prepare.sh >/dev/null
    E=("${MF[@]}" --epochs 4 --sync-every 50 --sync gaia --groups 2 --significance 0 --dc-staleness 0)
    run real-shaped-100 wan 2 "${E[@]}"
    netlab/wan.sh down
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    mpirun -n 2 "$BIN" train --metrics "$out/emulated-100.jsonl" "${E[@]}" --emulate-bandwidth 100 > "$out/emulated-100.log" 2>&1
    mpirun -n 2 "$BIN" train --metrics "$out/unshaped.jsonl" "${E[@]}" > "$out/unshaped.log" 2>&1
    python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print("| run | train s | sync s/rank (mean) | WAN MB sent (program) |")
print("|---|---|---|---|")
for n in ["real-shaped-100", "emulated-100", "unshaped"]:
    s = [json.loads(l) for l in open(f"{out}/{n}.jsonl")][-1]
    print(f"| {n} | {s['train_seconds']:.2f} | {s['counters']['sync_seconds']['mean']:.2f} | {s['sync_metrics']['wan_bytes_sent']/1e6:.1f} |")
PY
    exit 0 ;;
*) echo "usage: benches/gaia.sh mlr|mf|emulate" >&2; exit 2 ;;
esac
run lan-allreduce lan 8 "${DATA[@]}" --sync allreduce
run wan-allreduce wan 8 "${DATA[@]}" --sync allreduce
run wan-gaia-1pct wan 8 "${DATA[@]}" --sync gaia --groups 2 --significance 0.01
run wan-gaia-5pct wan 8 "${DATA[@]}" --sync gaia --groups 2 --significance 0.05
run lan-gaia-1pct lan 8 "${DATA[@]}" --sync gaia --groups 2 --significance 0.01
table "${TARGET[@]}" lan-allreduce
