#!/usr/bin/env bash
# Start-up, training, evaluation and shutdown of one asap job at many ranks on this machine
# (issue 15, item 4): every run's exit status, the whole command's time, the summary's time by
# phase, rank 0's teardown (freeing the windows, MPI_Finalize) and the range of the sampled own
# models.
#
#   benches/scale-ranks.sh [--ranks "256 128"] [--runs 5] [--epochs 3] [--dir DIR] [-- EXTRA TRAIN ARGS]
#
# --epochs E gives every size E epochs; --epochs per-rank:E8 gives N ranks E8 * N / 8 epochs, the
# examples per rank of an 8-rank run of E8 epochs (issue 15, item 3: --epochs per-rank:10).
# Run it under `nice -n 19` on a shared machine.
#
# Each run is `mpirun -n N $BIN train --epochs E --metrics DIR/N-K.jsonl EXTRA...` (the default
# asap job, graph chosen by --graph auto) timed from outside by the shell. A failed run is a table
# row with its status, not the end of the script. Prints a markdown table and `uptime` before and
# after (the machine is shared: compare runs of one sitting).
set -uo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$here/target/release/asap-train}
ranks="256 128"
runs=5
epochs=3
dir="$here/runs/scale-ranks"
while [ $# -gt 0 ]; do
    case "$1" in
        --ranks) ranks="$2"; shift 2 ;;
        --runs) runs="$2"; shift 2 ;;
        --epochs) epochs="$2"; shift 2 ;;
        --dir) dir="$2"; shift 2 ;;
        --) shift; break ;;
        *) echo "unknown option $1 (see the head of $0)" >&2; exit 2 ;;
    esac
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
mkdir -p "$dir"
echo "load before: $(uptime)"
echo "binary: $BIN ($(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo '?'))"
echo
rows=()
for n in $ranks; do
    for k in $(seq 1 "$runs"); do
        name="$n-$k"
        rm -f "$dir/$name.jsonl"
        start=$(date +%s.%N)
        case "$epochs" in
            per-rank:*) e=$(( ${epochs#per-rank:} * n / 8 )) ;;
            *) e=$epochs ;;
        esac
        timeout 1800 mpirun -n "$n" "$BIN" train --epochs "$e" --metrics "$dir/$name.jsonl" "$@" > "$dir/$name.log" 2>&1
        rc=$?
        end=$(date +%s.%N)
        rows+=("$name $rc $(echo "$end - $start" | bc)")
    done
done
python3 - "$dir" "${rows[@]}" <<'PY'
import json, sys
d = sys.argv[1]
print("| ranks | run | exit | command s | launch | MPI init | load | setup | training | evaluation | final model | teardown (windows + finalize) | averaged model | own models (sampled ranks) |")
print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
for row in sys.argv[2:]:
    name, rc, secs = row.split()
    n, k = name.split("-")
    try:
        lines = [json.loads(l) for l in open(f"{d}/{name}.jsonl")]
    except OSError:
        lines = []
    s = next((l for l in lines if l.get("event") == "summary"), None)
    t = next((l for l in lines if l.get("event") == "teardown"), None)
    if s is None:
        print(f"| {n} | {k} | {rc} | {float(secs):.1f} | no summary: see {name}.log |||||||||")
        continue
    p = s["phases"]
    f = lambda v: "?" if v is None else f"{v:.2f}"
    own = s.get("per_rank_metric") or []
    ranks = s.get("per_rank_metric_ranks") or []
    own_s = f"{100*min(own):.2f}-{100*max(own):.2f} % ({len(ranks)} of {s['ranks']})" if own else "-"
    td = f"{t['teardown_seconds']:.1f} ({t['free_seconds']:.1f} + {t['finalize_seconds']:.1f})" if t else "not reported"
    print(f"| {n} | {k} | {rc} | {float(secs):.1f} | {f(p['launch'])} | {f(p['mpi_init'])} | {f(p['load'])} | {f(p['setup'])} | "
          f"{f(p['train'])} | {f(p['evaluate'])} | {f(p['final_model'])} | {td} | {100*s['final_metric']:.2f} % | {own_s} |")
PY
echo
echo "load after: $(uptime)"
