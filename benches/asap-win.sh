#!/usr/bin/env bash
# Does ASAP beat allreduce where communication matters? 8 ranks, Fashion-MNIST MLR, IID shards,
# judged on the worst rank's own model (decentralised training is judged by the models the ranks
# hold): time until every rank's own model reaches the target, evaluated every 25 rounds.
#   benches/asap-win.sh stragglers [busy|sleep]   ranks 0 and 1 computing 2x slower
#   benches/asap-win.sh even                      no stragglers
# The straggler waits `busy` by default (it keeps its core, as a slow machine does; `sleep` frees
# it for the oversubscribed others, which then run faster than their nominal speed). One markdown
# table per call, every row from this one run; every mode counted the same way (bytes a rank sent
# while training, its time in the sync layer, the final averaging apart).
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-stragglers}
WAIT=${2:-busy}
NP=${NP:-8}
TARGET=${TARGET:-0.83}
BIN=${BIN:-target/release/asap-train}
out=runs/asap-win-$WHAT-$WAIT
rm -rf "$out"; mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
common=(--epochs 10 --eval-every 25 --target "$TARGET" --target-on worst-rank)
case "$WHAT" in
stragglers) common+=(--straggler 0,1:2 --straggler-wait "$WAIT") ;;
even) ;;
*) echo "usage: benches/asap-win.sh stragglers [busy|sleep] | even" >&2; exit 2 ;;
esac
rows=()
run() { # run NAME ARGS...
    local name=$1; shift
    if ! mpirun -n "$NP" $BIN train "${common[@]}" --metrics "$out/$name.jsonl" "$@" > "$out/$name.log" 2>&1; then
        echo "run $name failed: see $out/$name.log" >&2; exit 1
    fi
    rows+=("$name")
}
run allreduce --sync allreduce
run none --sync none
run asap-root-expander --sync asap --graph root-expander
run asap-exponential --sync asap --graph exponential
run asap-one-peer --sync asap --graph one-peer-exponential
for S in 1 2 4; do
    run "asap-root-staleness$S" --sync asap --graph root-expander --staleness $S
done
run asap-exponential-staleness2 --sync asap --graph exponential --staleness 2
run asap-root-overlap --sync asap --graph root-expander --overlap
run asap-exponential-overlap --sync asap --graph exponential --overlap
run asap-root-push-sum --sync asap --graph root-expander --notify push-sum
run asap-root-notify-none --sync asap --graph root-expander --notify none
python3 - "$out" "$TARGET" "${rows[@]}" <<'PY'
import json, sys
out, target = sys.argv[1], float(sys.argv[2])
base = None
print("| run | s to target (worst rank) | vs allreduce | round | sent/rank MB to target | sync s/rank to target (mean/max) | own models at the end (worst / mean) | averaged model |")
print("|---|---|---|---|---|---|---|---|")
for name in sys.argv[3:]:
    lines = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    s = lines[-1]
    hit = next((e for e in lines if e["event"] == "eval" and (e.get("rank_metric") or {}).get("worst", 0) >= target), None)
    # Lockstep modes hold one model on every rank: their own models are the averaged one.
    pr = s.get("per_rank_metric") or [s["final_metric"]]
    end = f"{100*min(pr):.2f} % / {100*sum(pr)/len(pr):.2f} %"
    if hit:
        c = hit["counters"]
        t = hit["train_seconds"]
        if name == "allreduce":
            base = t
        ratio = f"{t/base:.2f}" if base else "-"
        print(f"| {name} | {t:.2f} | {ratio} | {hit['round']} | {c['bytes_sent']['mean']/1e6:.1f} | "
              f"{c['sync_seconds']['mean']:.2f} / {c['sync_seconds']['max']:.2f} | {end} | {100*s['final_metric']:.2f} % |")
    else:
        print(f"| {name} | not reached | - | - | - | - | {end} | {100*s['final_metric']:.2f} % |")
PY
