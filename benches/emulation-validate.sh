#!/usr/bin/env bash
# Validation of the emulated compute (docs/emulation.md): 2 ranks on the 2 cores (no
# oversubscription), a real run against an emulated run that declares the step time `bench`
# measured, for allreduce and asap. MLP 784-1024-10, batch 256 (a step of ~25 ms, long enough
# for the OS's sleep granularity). Time is training seconds to TARGET on the averaged model.
#
# Environment: REPS [3], TARGET [0.83], BIN [target/release/asap-train], NICE [-20].
set -euo pipefail
cd "$(dirname "$0")/.."
source benches/priority.sh
REPS=${REPS:-3}
TARGET=${TARGET:-0.83}
BIN=${BIN:-target/release/asap-train}
NICE=${NICE:--20}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
out=runs/emulation-validate-$(date +%H%M%S)
mkdir -p "$out"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg)"
nice -n "$NICE" "$BIN" bench --models mlp --hidden 1024 --batch-size 256 --seconds 3 --json > "$out/bench.json"
ms=$(python3 -c "import json,sys; d=json.load(open('$out/bench.json')); print(round(1e3*d['batch_size']/d['examples_per_second'], 3))")
echo "# bench: MLP-1024 batch 256 step = $ms ms (one rank alone)"
common=(--model mlp --hidden 1024 --batch-size 256 --lr 0.3 --epochs 3 --eval-every 10 --own-models 0 --target "$TARGET" --stop-at-target)
for sync in allreduce asap; do
    for kind in real emulated; do
        extra=(); [ "$kind" = emulated ] && extra=(--emulate-compute "$ms")
        for rep in $(seq 1 "$REPS"); do
            nice -n "$NICE" mpirun -n 2 "$BIN" train "${common[@]}" --sync "$sync" "${extra[@]}" --metrics "$out/$sync-$kind-$rep.jsonl" > "$out/$sync-$kind-$rep.log" 2>&1
        done
    done
done
python3 - "$out" "$REPS" <<'PY'
import json, statistics, sys
out, reps = sys.argv[1], int(sys.argv[2])
def t(name):
    v = []
    for r in range(1, reps + 1):
        s = next(l for l in map(json.loads, open(f"{out}/{name}-{r}.jsonl")) if l["event"] == "summary")
        v.append((s["time_to_target"] or {}).get("train_seconds", float("inf")))
        if s.get("emulation"):
            valid = s["emulation"]["valid"]
            if not valid:
                print(f"# {name} run {r}: emulation INVALID")
    return v
print("| mode | real s to target, median (range) | emulated s, median (range) | emulated / real |")
print("|---|---|---|---|")
for sync in ["allreduce", "asap"]:
    a, b = t(f"{sync}-real"), t(f"{sync}-emulated")
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"| {sync} | {ma:.2f} ({min(a):.2f}-{max(a):.2f}) | {mb:.2f} ({min(b):.2f}-{max(b):.2f}) | {mb / ma:.3f} |")
PY
echo "# load at the end $(cut -d' ' -f1-3 /proc/loadavg); runs in $out"
