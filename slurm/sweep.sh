#!/usr/bin/env bash
# Submits a sweep: one Slurm array task per entry of LIST, then a gather job that writes
# OUTDIR/summary.csv once every task has ended (whether or not it succeeded).
#   slurm/sweep.sh LIST OUTDIR [sbatch options --] [common train options]
# e.g. slurm/sweep.sh slurm/sweeps/modes.txt runs/sweep -n 8 -- --epochs 2 --target 0.84
# Options before `--` go to sbatch (ranks, partition, time ...); without `--` all go to training.
set -euo pipefail
list=${1:?usage: sweep.sh LIST OUTDIR [sbatch options --] [train options]}
out=${2:?usage: sweep.sh LIST OUTDIR [sbatch options --] [train options]}
shift 2
sb=()
if printf '%s\n' "$@" | grep -qx -- '--'; then
    while [ "$1" != -- ]; do sb+=("$1"); shift; done
    shift
fi
here=$(dirname "$(realpath "$0")")
n=$(grep -c -v -E '^[[:space:]]*(#|$)' "$list" || true)
[ "$n" -gt 0 ] || { echo "sweep.sh: $list has no entries" >&2; exit 2; }
dups=$(grep -v -E '^[[:space:]]*(#|$)' "$list" | awk '{print $1}' | sort | uniq -d)
[ -z "$dups" ] || { echo "sweep.sh: duplicate names in $list: $dups" >&2; exit 2; }
mkdir -p "$out"
rc=0
array=$(ASAP_TRAIN_SLURM_DIR=$here sbatch --parsable --array="0-$((n - 1))" -o "$out/slurm-%A_%a.out" "${sb[@]}" \
    "$here/sweep.sbatch" "$list" "$out" "$@") || rc=$?
array=$(head -n 1 <<<"$array")
array=${array%%;*}
[ -n "$array" ] || { echo "sweep.sh: sbatch did not submit the array job" >&2; exit 1; }
# With --wait among the sbatch options the array submission returned when every task ended;
# the gather job then waits too, so the table exists when this script returns.
wait=()
if printf '%s\n' "${sb[@]}" | grep -qx -- '--wait'; then wait=(--wait); fi
gather=$(sbatch --parsable "${wait[@]}" --dependency="afterany:$array" -n 1 -o "$out/gather.out" \
    --wrap "$here/gather.sh $out")
echo "array job $array ($n tasks), gather job ${gather%%;*}; results: $out/summary.csv"
# Under --wait: non-zero if any array task failed (sbatch reports the highest task exit code).
exit "$rc"
