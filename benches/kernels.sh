#!/usr/bin/env bash
# Single-core kernels (issue 44 item 2): `asap-train bench` of two binaries, alternating runs
# (old, new, old, new, ...), so that a shared machine's load falls on both alike.
#
#   benches/kernels.sh OLD_BIN NEW_BIN [RUNS] [SECONDS] [MODELS] [BATCH]
#
# Defaults: 3 runs each, 3 s per model, svm,logreg,mlr,mlp, batch 32. Prints the load average
# before each run, then one markdown row per model and binary: examples/s (wall) and examples
# per CPU second (the bench thread's CPU clock; "-" for a binary whose bench does not report it),
# each as the median and [min-max] of the runs, and the median's % of one core's f32 peak as bench
# computes it. For an old binary that reports both, build main's src/model with this bench
# (benches/kernels.md has the commands and the results).
set -euo pipefail
old=${1:?usage: benches/kernels.sh OLD_BIN NEW_BIN [RUNS] [SECONDS] [MODELS] [BATCH]}
new=${2:?usage: benches/kernels.sh OLD_BIN NEW_BIN [RUNS] [SECONDS] [MODELS] [BATCH]}
runs=${3:-3}
seconds=${4:-3}
models=${5:-svm,logreg,mlr,mlp}
batch=${6:-32}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for r in $(seq 1 "$runs"); do
    for which in old new; do
        bin=$old
        [ "$which" = new ] && bin=$new
        echo "run $r $which: load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
        "$bin" bench --models "$models" --batch-size "$batch" --seconds "$seconds" --json 2> "$out/err" > "$out/$which.$r.jsonl" \
            || { cat "$out/err" >&2; exit 1; }
    done
done
grep -h "one core's f32 peak" "$out/err" >&2 || true
python3 - "$out" "$runs" <<'PY'
import json, statistics, sys
out, runs = sys.argv[1], int(sys.argv[2])
rows = {}
for which in ("old", "new"):
    for r in range(1, runs + 1):
        for line in open(f"{out}/{which}.{r}.jsonl"):
            j = json.loads(line)
            rows.setdefault((j["model"], which), []).append(j)
def cell(js, key):
    v = [j[key] for j in js if j.get(key) is not None]
    if not v:
        return "-", None
    m = statistics.median(v)
    return f"{m/1e3:,.0f}k [{min(v)/1e3:,.0f}-{max(v)/1e3:,.0f}]", m
def pct(js, rate):
    peak = js[0]["peak_gflops"]
    return "?" if rate is None or not peak else f"{100 * rate * js[0]['flops_per_example'] / 1e9 / peak:.1f}"
print("| model | binary | flop/example | examples/s (wall) | % peak | examples/CPU-s | % peak on CPU |")
print("|---|---|---|---|---|---|---|")
for (model, which), js in sorted(rows.items(), key=lambda kv: (kv[0][0], kv[0][1] != "old")):
    w, wm = cell(js, "examples_per_second")
    c, cm = cell(js, "examples_per_cpu_second")
    print(f"| {model} | {which} | {js[0]['flops_per_example']:,.0f} | {w} | {pct(js, wm)} | {c} | {pct(js, cm)} |")
PY
