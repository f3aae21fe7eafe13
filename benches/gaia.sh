#!/usr/bin/env bash
# Gaia across two "data centres" on real hosts: network namespaces (netlab/wan.sh), 2 groups x
# 1 host, 4 ranks per host (8 ranks). WAN = the groups joined by netlab's link, 100 Mbit/s and
# 50 ms one way (its user-space relay: this kernel has no sch_netem); LAN = every host on one
# bridge, no shaping. One markdown table per call, every row from this one run, the load
# average (uptime) before and after:
#   benches/gaia.sh mlr        Fashion-MNIST MLR to 84 % held-out accuracy
#   benches/gaia.sh mf         MovieLens MF to a held-out RMSE of 0.91
#   benches/gaia.sh link       the link itself: ICMP round trips and one bulk TCP stream
#   benches/gaia.sh emulate    --emulate-bandwidth against the real link, 2 ranks (one per
#                              host, so the program's per-rank link is the host's link),
#                              bandwidth-bound: gaia at significance 0 on MovieLens MF
#   benches/gaia.sh inner      gaia 1 % with --gaia-inner allreduce against asap (root
#                              expander on each group's 4 ranks), LAN and WAN, MLR to 84 %
# Rows: allreduce over all 8 ranks on the LAN and across the WAN; gaia at 1 % and 5 % (DS 2)
# across the WAN; gaia 1 % on the LAN. WAN MB = bytes the kernel's tap devices carried out of
# the groups (every byte that crossed: MPI's own, TCP/IP and Ethernet headers included);
# insignificant = 1 - significant/updates (per clock and parameter with a non-zero group
# update); worker < 1 % / < 5 % = Gaia §3.3's statistic (per rank, clock and parameter with a
# non-zero update: its change to the global model below 1 % / 5 % of the value). The kernel's
# WAN bytes include evaluation traffic: gaia is not lockstep, so each evaluation averages the
# replicas over all ranks (and scores ranks' own models) across the link; the program's
# wan_bytes_sent counts only the mirror messages of training. RETABLE=1 prints the last run's
# table again without running.
# BIN (default target/release/asap-train, copied to /tmp first so a rebuild cannot touch it).
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-mlr}
SRC_BIN=${BIN:-$PWD/target/release/asap-train}
BIN=/tmp/gaia-bench-bin-$$
cp "$SRC_BIN" "$BIN"
export BIN NETLAB_NAME=bn NETLAB_NET=10.79.0
RATE=${RATE:-100mbit} DELAY=${DELAY:-50ms}
out=runs/gaia-$WHAT
[[ -n ${RETABLE:-} ]] || { rm -rf "$out"; mkdir -p "$out"; }
trap 'netlab/wan.sh down; rm -f "$BIN"' EXIT
[[ -n ${RETABLE:-} ]] || echo "load before: $(uptime)"
rows=()
up() { if [[ $1 == wan ]]; then netlab/wan.sh up 2 1 "$RATE" "$DELAY" 2>/dev/null; else netlab/wan.sh up 2 1 none 0ms 2>/dev/null; fi; }
run() { # run NAME LINK(wan|lan) NP ARGS...
    local name=$1 link=$2 np=$3; shift 3
    up "$link"
    if ! netlab/wan.sh run "$np" train --metrics "$out/$name.jsonl" "$@" > "$out/$name.log" 2>&1; then
        echo "run $name failed: see $out/$name.log" >&2; exit 1
    fi
    netlab/wan.sh stats > "$out/$name.link.json"
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
    return next(e for e in lines if e["event"] == "summary"), hit
_, rhit = load(ref)
print("| run | ranks | clocks (to target / run) | train s to target | vs LAN allreduce | final metric | WAN MB (kernel, all) | WAN MB (program, training) | insignificant (filter) | worker < 1 % / < 5 % | sync s/rank (mean) | mirror wait s (max) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|")
for name in sys.argv[5:]:
    s, hit = load(name)
    c = s["counters"]; sm = s.get("sync_metrics") or {}
    link = json.load(open(f"{out}/{name}.link.json"))
    wan = sum(t["out_bytes"] for t in link["taps"]) / 1e6
    fm = s["final_metric"]
    fms = f"{fm:.4f}" if lower else f"{100*fm:.2f} %"
    to = f"{hit['round']} / {s['rounds']} | {hit['train_seconds']:.2f}" if hit else f"not reached / {s['rounds']} | -"
    ratio = f"{hit['train_seconds']/rhit['train_seconds']:.2f}x" if hit and rhit else "-"
    ins = f"{100*(1-sm['significant_updates']/sm['updates']):.1f} %" if sm.get("updates") else "-"
    wk = (f"{100*sm['worker_updates_below_1pct']/sm['worker_updates']:.1f} % / {100*sm['worker_updates_below_5pct']/sm['worker_updates']:.1f} %"
          if sm.get("worker_updates") else "-")
    mw = f"{sm['mirror_wait_seconds']:.2f}" if "mirror_wait_seconds" in sm else "-"
    pw = f"{sm['wan_bytes_sent']/1e6:.1f}" if "wan_bytes_sent" in sm else "-"
    print(f"| {name} | {s['ranks']} | {to} | {ratio} | {fms} | {wan:.1f} | {pw} | {ins} | {wk} | {c['sync_seconds']['mean']:.2f} | {mw} |")
PY
}
MF=(--data datasets/out/movielens-train.ratings --test-data datasets/out/movielens-test.ratings --model mf
    --lambda 0.1 --lr-decay 0.9 --lr 1)
case "$WHAT" in
mlr) DATA=(--epochs 5 --eval-every 10); TARGET=(0.84 0); AR_MAX=450; G_MAX=1170 ;;
mf) [[ -n ${RETABLE:-} ]] || datasets/prepare.sh >/dev/null; DATA=("${MF[@]}" --epochs 20 --sync-every 22 --eval-every 4); TARGET=(0.91 1); AR_MAX=160; G_MAX=1000 ;;
link)
    up wan
    echo "| probe | result |"
    echo "|---|---|"
    echo "| ICMP, 20 round trips | $(netlab/wan.sh ping 0 1 20) |"
    echo "| TCP, one stream of 200 MiB | $(netlab/wan.sh bulk 0 1 200 | tail -1) |"
    echo "| relay counters | $(netlab/wan.sh stats) |"
    echo "load after: $(uptime)"
    exit 0 ;;
emulate)
    datasets/prepare.sh >/dev/null
    E=("${MF[@]}" --epochs 4 --sync-every 50 --sync gaia --groups 2 --significance 0 --dc-staleness 0)
    run real-link wan 2 "${E[@]}"
    netlab/wan.sh down
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    ms=${DELAY%ms}; mb=${RATE%mbit}
    mpirun -n 2 "$BIN" train --metrics "$out/emulated.jsonl" "${E[@]}" --emulate-bandwidth "$mb" --emulate-latency "$ms" > "$out/emulated.log" 2>&1
    mpirun -n 2 "$BIN" train --metrics "$out/unshaped.jsonl" "${E[@]}" > "$out/unshaped.log" 2>&1
    python3 - "$out" <<'PY'
import json, sys
out = sys.argv[1]
print("| run | clocks | train s | sync s/rank (mean) | mirror wait s (max) | WAN MB sent (program) |")
print("|---|---|---|---|---|---|")
for n in ["real-link", "emulated", "unshaped"]:
    s = next(e for e in map(json.loads, open(f"{out}/{n}.jsonl")) if e["event"] == "summary")
    g = s["sync_metrics"]
    print(f"| {n} | {s['rounds']} | {s['train_seconds']:.2f} | {s['counters']['sync_seconds']['mean']:.2f} | {g['mirror_wait_seconds']:.2f} | {g['wan_bytes_sent']/1e6:.1f} |")
PY
    echo "load after: $(uptime)"
    exit 0 ;;
inner)
    # Every row gaia at 1 % (DS 2); only the averaging inside the groups differs.
    [[ -n ${RETABLE:-} ]] || {
        I=(--epochs 5 --eval-every 10 --sync gaia --groups 2 --significance 0.01 --max-rounds 1170)
        run lan-inner-allreduce lan 8 "${I[@]}" --gaia-inner allreduce
        run lan-inner-asap lan 8 "${I[@]}" --gaia-inner asap
        if [[ -z ${LAN_ONLY:-} ]]; then
            run wan-inner-allreduce wan 8 "${I[@]}" --gaia-inner allreduce
            run wan-inner-asap wan 8 "${I[@]}" --gaia-inner asap
        fi
    }
    python3 - "$out" <<'PY'
import json, os, sys
out = sys.argv[1]
names = [n for n in ["lan-inner-allreduce", "lan-inner-asap", "wan-inner-allreduce", "wan-inner-asap"] if os.path.exists(f"{out}/{n}.jsonl")]
def load(name):
    lines = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    hit = next((e for e in lines if e["event"] == "eval" and e["test_metric"] is not None and e["test_metric"] >= 0.84), None)
    return next(e for e in lines if e["event"] == "summary"), hit
ref = load("lan-inner-allreduce")[1]
print("| run | clocks (to 84 % / run) | train s to 84 % | vs LAN inner allreduce | final metric | WAN MB (kernel, all) | WAN MB (program, training) | LAN MB (program, training) | insignificant (filter) | sync s/rank (mean) | mirror wait s (max) | inner reduces (torn) | inner correction (max) | relay late max ms |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for name in names:
    s, hit = load(name)
    sm = s["sync_metrics"]
    link = json.load(open(f"{out}/{name}.link.json"))
    wan = sum(t["out_bytes"] for t in link["taps"]) / 1e6
    late = (link.get("relay") or {}).get("late_max_ms")
    to = f"{hit['round']} / {s['rounds']} | {hit['train_seconds']:.2f}" if hit else f"not reached / {s['rounds']} | -"
    ratio = f"{hit['train_seconds']/ref['train_seconds']:.2f}x" if hit and ref else "-"
    ins = f"{100*(1-sm['significant_updates']/sm['updates']):.1f} %"
    inner = f"{sm['inner_rounds']:.0f} ({sm['inner_torn']:.0f})" if "inner_rounds" in sm else "-"
    corr = f"{sm['inner_correction_max']:.2e}" if "inner_correction_max" in sm else "-"
    print(f"| {name} | {to} | {ratio} | {100*s['final_metric']:.2f} % | {wan:.1f} | {sm['wan_bytes_sent']/1e6:.1f} | {sm['lan_bytes_sent']/1e6:.1f} | {ins} | "
          f"{s['counters']['sync_seconds']['mean']:.2f} | {sm['mirror_wait_seconds']:.2f} | {inner} | {corr} | {'-' if late is None else f'{late:.1f}'} |")
PY
    [[ -n ${RETABLE:-} ]] || echo "load after: $(uptime)"
    exit 0 ;;
*) echo "usage: benches/gaia.sh mlr|mf|link|emulate|inner" >&2; exit 2 ;;
esac
if [[ -n ${RETABLE:-} ]]; then # the table of the last run again (e.g. after adding a column)
    rows=(lan-allreduce wan-allreduce wan-gaia-1pct wan-gaia-5pct lan-gaia-1pct)
    table "${TARGET[@]}" lan-allreduce
    exit 0
fi
# Allreduce is lockstep and deterministic: the WAN run reaches the target at the LAN run's
# clock, so both stop a little after it (--max-rounds); gaia runs up to the full epochs.
run lan-allreduce lan 8 "${DATA[@]}" --sync allreduce --max-rounds "$AR_MAX"
run wan-allreduce wan 8 "${DATA[@]}" --sync allreduce --max-rounds "$AR_MAX"
run wan-gaia-1pct wan 8 "${DATA[@]}" --sync gaia --groups 2 --significance 0.01 --max-rounds "$G_MAX"
run wan-gaia-5pct wan 8 "${DATA[@]}" --sync gaia --groups 2 --significance 0.05 --max-rounds "$G_MAX"
run lan-gaia-1pct lan 8 "${DATA[@]}" --sync gaia --groups 2 --significance 0.01 --max-rounds "$G_MAX"
table "${TARGET[@]}" lan-allreduce
echo "load after: $(uptime)"
