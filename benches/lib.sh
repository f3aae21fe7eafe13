# Shared by the bench scripts: `run` one training job into $out, and print one markdown `table`
# of every run so far, all counted the same way: bytes a rank sent to other ranks while training,
# its time in the sync layer (transfer + waiting), the final model's assembly apart.
# Needs: BIN, out (a fresh directory), rows=() declared by the caller.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
# Prefix for mpirun's program so that each rank runs under /usr/bin/time and writes its peak RSS
# in KB to PREFIX.RANK: through mpirun's merged stderr the ranks' lines interleave ("PEAK_RSS_KB
# PEAK_RSS_KB 293652293456" in one 4-rank run; CI's quick report at stop 36 found no whole line).
#   mpirun -n N "${PEAK_RSS[@]}" PREFIX PROGRAM ARGS...
PEAK_RSS=(sh -c 'exec /usr/bin/time -o "$0.${OMPI_COMM_WORLD_RANK:-${PMI_RANK:-0}}" -f "%M" "$@"')
# RANK_NICE (optional): the ranks' niceness, for runs in the emulated cluster beside other jobs
# (docs/emulation.md: at nice -20 their steps wake on time).
run() { # run NAME NP ARGS...
    local name=$1 np=$2 pre=(); shift 2
    [ -n "${RANK_NICE:-}" ] && pre=(nice -n "$RANK_NICE")
    if ! "${pre[@]}" mpirun -n "$np" $BIN train --metrics "$out/$name.jsonl" "$@" > "$out/$name.log" 2>&1; then
        # A step size too large for a schedule is a result (a row saying so), anything else a bug.
        if grep -q "training diverged" "$out/$name.log"; then
            touch "$out/$name.diverged"
        else
            echo "run $name failed: see $out/$name.log" >&2; exit 1
        fi
    fi
    rows+=("$name")
}
table() { # table TARGET LOWER_IS_BETTER(0/1)
    python3 - "$out" "$1" "$2" "${rows[@]}" <<'PY'
import json, os, sys
out, target, lower = sys.argv[1], float(sys.argv[2]), sys.argv[3] == "1"
print("| run | ranks | clocks to target | train s to target | final metric | sent/rank MB | sync s/rank (mean/max) | read staleness mean/max | early pushes / row serves | final-model MB/rank |")
print("|---|---|---|---|---|---|---|---|---|---|")
for name in sys.argv[4:]:
    if os.path.exists(f"{out}/{name}.diverged"):
        print(f"| {name} | - | diverged (loss NaN) | - | - | - | - | - | - | - |")
        continue
    lines = [json.loads(l) for l in open(f"{out}/{name}.jsonl")]
    s = next(l for l in lines if l["event"] == "summary")
    ok = lambda v: v is not None and (v <= target if lower else v >= target)
    hit = next((e for e in lines if e["event"] == "eval" and ok(e["test_metric"])), None)
    c = s["counters"]
    sm = s.get("sync_metrics") or {}
    st = f"{sm['mean_staleness']:.2f} / {sm['max_staleness']:.0f}" if "mean_staleness" in sm else "-"
    early = f"{sm['early_pushes']:.0f} / {sm['early_row_serves']:.0f}" if "early_pushes" in sm else "-"
    fm = s["final_metric"]
    fms = f"{fm:.4f}" if lower else f"{100*fm:.2f} %"
    to = f"{hit['round']} | {hit['train_seconds']:.2f}" if hit else "not reached | -"
    print(f"| {name} | {s['ranks']} | {to} | {fms} | {c['bytes_sent']['mean']/1e6:.1f} | "
          f"{c['sync_seconds']['mean']:.2f} / {c['sync_seconds']['max']:.2f} | {st} | {early} | {c['final_bytes']['mean']/1e6:.2f} |")
PY
}
