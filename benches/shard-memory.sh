#!/usr/bin/env bash
# Load time and peak memory per rank when every rank reads its shard of one RCV1-shaped sparse
# LIBSVM file (issue 15, item 5), for one or two binaries ("before" and "after").
#
#   benches/shard-memory.sh [--before BIN] [--after BIN] [--ranks "1 4 8"] [--rows N]
#                           [--format svm|h5] [--dir DIR]
#
# The data set (`asap-train data synth`, seed 1, 697,641 x 47,236 at 0.16 % density by default,
# ~675 MB of text) is generated once into DIR (default runs/shard-memory, never committed).
# Each run is `mpirun -n R BIN --data FILE --model svm --epochs 1 --max-rounds 1`, every rank
# under /usr/bin/time; "load s" is the summary's load time (reading, sharding and set-up, all
# ranks), "RSS" is each rank's peak resident set (VmHWM) in MB, max and mean over ranks.
# Build the "before" binary from another commit, e.g.:
#   git archive <commit> | tar -x -C /tmp/before && (cd /tmp/before && cargo build --release)
set -euo pipefail

here=$(cd "$(dirname "$0")/.." && pwd)
after="$here/target/release/asap-train"
before=""
ranks="1 4 8"
rows=697641
format=svm
dir="$here/runs/shard-memory"
while [ $# -gt 0 ]; do
    case "$1" in
        --before) before="$2"; shift 2 ;;
        --after) after="$2"; shift 2 ;;
        --ranks) ranks="$2"; shift 2 ;;
        --rows) rows="$2"; shift 2 ;;
        --format) format="$2"; shift 2 ;;
        --dir) dir="$2"; shift 2 ;;
        -h|--help) sed -n '2,16p' "$0"; exit 0 ;;
        *) echo "unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
done
[ -x "$after" ] || { echo "no binary at $after: cargo build --release first" >&2; exit 1; }
[ -z "$before" ] || [ -x "$before" ] || { echo "--before $before is not an executable" >&2; exit 1; }

. "$here/benches/lib.sh"   # PEAK_RSS and the mpirun environment (its run() is redefined below)
export OMPI_MCA_mpi_yield_when_idle=1

mkdir -p "$dir"
data="$dir/synth-$rows.$format"
if [ ! -f "$data" ]; then
    echo "generating $data ..." >&2
    "$after" data synth "$data" --rows "$rows" --seed 1 >&2
fi
echo "data: $data ($(du -h "$data" | cut -f1))"

run() { # binary label ranks
    local bin=$1 label=$2 n=$3 log
    log="$dir/$label-$n.log"
    # Each rank's peak RSS in its own file (lib.sh's PEAK_RSS).
    rm -f "$dir/$label-$n.rss."*
    mpirun -n "$n" "${PEAK_RSS[@]}" "$dir/$label-$n.rss" "$bin" --data "$data" --model svm --epochs 1 \
        --max-rounds 1 >"$log" 2>&1 || { echo "$label at $n ranks failed, see $log" >&2; return 0; }
    local load rss
    load=$(sed -n "s/^time by phase:.*, load \([0-9.]*\) s,.*/\1/p" "$log" | head -1)
    rss=$(cat "$dir/$label-$n.rss."* | awk '{s += $1; if ($1 + 0 > m + 0) m = $1; n++} END {printf "%8.0f %8.0f", m / 1024, s / n / 1024}')
    printf "%-7s %5d %8s %s\n" "$label" "$n" "$load" "$rss"
}

printf "%-7s %5s %8s %8s %8s\n" binary ranks "load s" "RSS max" "RSS mean"
for n in $ranks; do
    [ -z "$before" ] || run "$before" before "$n"
    run "$after" after "$n"
done
