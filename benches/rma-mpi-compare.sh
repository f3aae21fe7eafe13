#!/usr/bin/env bash
# NOTIFY-ACK round latency, Open MPI against MPICH, at 2, 4 and 8 ranks, measured by rma-check
# (the library's own mailboxes: put + flush of the payload, notify, ack). Both builds must exist:
#   cargo build --release --locked --bin rma-check                                  # Open MPI
#   MPICC=mpicc.mpich CARGO_TARGET_DIR=target/mpich cargo build --release --locked --bin rma-check
# Usage: benches/rma-mpi-compare.sh [OUT.md]   (default benches/rma-mpi-compare.md)
# Per cell: REPS runs (default 3, interleaved between the MPIs), the median round latency in
# microseconds and the min-max. Graphs: ring (one in-neighbour) and complete (N-1), payload
# LEN f32s (default 7850: multiclass logistic regression on Fashion-MNIST).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-benches/rma-mpi-compare.md}
REPS=${REPS:-3} LEN=${LEN:-7850} ROUNDS=${ROUNDS:-200}
ompi=target/release/rma-check mpich=target/mpich/release/rma-check
for b in "$ompi" "$mpich"; do [ -x "$b" ] || { echo "missing $b (see the build commands at the top)" >&2; exit 1; }; done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
latency() { # latency LAUNCHER BIN N GRAPH -> round_latency_us of one run
    local line
    line=$(timeout 600 "$1" -n "$3" "$2" --graph "$4" --rounds "$ROUNDS" --len "$LEN" 2>&1 | grep 'rma-check: ok') ||
        { echo "run failed: $1 -n $3 $2 --graph $4" >&2; exit 1; }
    sed -E 's/.*round_latency_us=([0-9.]+).*/\1/' <<<"$line"
}
declare -A got
for g in ring complete; do
    for n in 2 4 8; do
        for ((r = 0; r < REPS; r++)); do
            got[ompi,$g,$n]+="$(latency mpirun "$ompi" "$n" "$g") "
            got[mpich,$g,$n]+="$(latency mpiexec.mpich "$mpich" "$n" "$g") "
        done
    done
done
cell() { python3 -c 'import sys,statistics as s; v=sorted(map(float,sys.argv[1:])); print(f"{s.median(v):,.0f} ({v[0]:,.0f}-{v[-1]:,.0f})")' $1; }
ratio() { python3 -c 'import sys,statistics as s; a,b=sys.argv[1].split(),sys.argv[2].split(); print(f"{s.median(map(float,b))/s.median(map(float,a)):.1f}x")' "$1" "$2"; }
{
    echo "# NOTIFY-ACK round latency: Open MPI vs MPICH"
    echo
    echo "\`benches/rma-mpi-compare.sh\` on $(date -u +%Y-%m-%d), $(nproc) cores ($(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs)),"
    echo "$(mpirun --version | head -1) with osc=ucx (set by the program); MPICH $(mpichversion | awk '/Version/ {print $3}') ($(mpichversion | awk '/Device/ {print $3}'))."
    echo "rma-check, $ROUNDS rounds of $LEN f32s per run, $REPS runs per cell interleaved; median (min-max) microseconds per round."
    echo "Ranks above 2 are oversubscribed on this machine, and it was shared with other jobs: read ratios, not absolutes."
    echo
    echo "| graph | ranks | Open MPI us/round | MPICH us/round | MPICH / Open MPI |"
    echo "|---|---|---|---|---|"
    for g in ring complete; do
        for n in 2 4 8; do
            echo "| $g | $n | $(cell "${got[ompi,$g,$n]}") | $(cell "${got[mpich,$g,$n]}") | $(ratio "${got[ompi,$g,$n]}" "${got[mpich,$g,$n]}") |"
        done
    done
} > "$out"
cat "$out"
