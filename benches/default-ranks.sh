#!/usr/bin/env bash
# Issue 43 item 3: the DEFAULT run (`asap-train train`: asap, the full Fashion-MNIST training set,
# the t10k file held out, 10 epochs, no --lr: the step is searched) in every mode at several rank
# counts and seeds. One markdown row per mode and rank count: the chosen steps, the held-out
# accuracy of each seed, the median against the mode's median at the first rank count, the range,
# and how many runs' objective fell every epoch. benches/defaults-sweep.md (Part 7, Part 8) keeps
# the output of runs.
#   benches/default-ranks.sh
#   RANKS="4 8" MODES="asap allreduce" SEEDS="1 2" EXTRA="--lr-schedule decay" benches/default-ranks.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/asap-train}
RANKS=${RANKS:-4 8 32}
MODES=${MODES:-allreduce asap ssp bosen async gaia none}
SEEDS=${SEEDS:-1 2 3}
EXTRA=${EXTRA:-}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "| mode | ranks | step (seeds $SEEDS) | held-out % | median (against the first rank count) | range | falls every epoch |"
echo "|---|---|---|---|---|---|---|"
for m in $MODES; do
    first=""
    for n in $RANKS; do
        steps=() accs=() falls=0
        for s in $SEEDS; do
            extra=$EXTRA
            [ "$m" = bosen ] && extra="$extra --bandwidth-mbps 400"
            # shellcheck disable=SC2086
            nice -n 10 mpirun -n "$n" "$BIN" train --sync "$m" --seed "$s" --metrics "$out/m.jsonl" $extra \
                > "$out/run.log" 2>&1 || { cat "$out/run.log" >&2; exit 1; }
            steps+=("$(sed -n 's/.*step size \([0-9.e-]*\).*/\1/p' "$out/run.log" | head -1)")
            read -r acc fell < <(/usr/bin/python3 - "$out/m.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
obj = [r["objective"] for r in rows if r.get("event") == "eval" and r.get("objective") is not None]
summary = [r for r in rows if r.get("event") == "summary"][-1]
print(f'{100 * summary["final_metric"]:.2f}', int(all(b < a for a, b in zip(obj, obj[1:]))))
PY
)
            accs+=("$acc")
            falls=$((falls + fell))
        done
        read -r med lo hi < <(printf '%s\n' "${accs[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)], a[1], a[NR]}')
        if [ -z "$first" ]; then first=$med; against="$med"; else against="$med ($(awk -v a="$med" -v b="$first" 'BEGIN {printf "%+.2f pt", a-b}'))"; fi
        echo "| $m | $n | ${steps[*]} | ${accs[*]} | $against | $lo-$hi | $falls of ${#accs[@]} |"
    done
done
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), binary $BIN, extra options: ${EXTRA:-none}"
