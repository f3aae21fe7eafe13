#!/usr/bin/env bash
# The MPI_Init race of the ULFM build (benches/ulfm-kill.md, "The failure once open here"): Open
# MPI 5 sets up MPI_COMM_WORLD for receiving only after MPI_Init's modex fence, and a message on
# it arriving while a rank still waits in that fence segfaults the rank (`segfault at e0` in
# mca_pml_ob1_recv_frag_callback_match). Open MPI's closing fence (async_mpi_init=0, its default)
# keeps the others inside MPI_Init until then; asap-train turned it off before 27c7489.
#
# One rank (SLOW, default 6) gets its fence completions DELAY_MS (default 1000) late through an
# LD_PRELOAD shim over PMIx_Fence_nb (ulfm-init-race/slowfence.c), as a rank descheduled under
# load would. REPS times (default 2) each, with async_mpi_init=1 and =0: a C program whose first
# call is an MPI_Allreduce, and asap-train (8 ranks, 1 epoch, --on-rank-loss continue) with
# async_mpi_init=1 (as it set it before 27c7489; a value set outside wins) and as the build under
# test sets it (unset: the program decides). Prints each job's exit status and whether a rank
# segfaulted.
#
#   make ulfm && benches/ulfm-init-race.sh
set -euo pipefail
cd "$(dirname "$0")/.."
REPS=${REPS:-2}
SLOW=${SLOW:-6}
DELAY_MS=${DELAY_MS:-1000}
V=$PWD/.venv-ompi5
B=$PWD/target/ompi5/release/asap-train
[ -x "$B" ] && [ -x "$V/bin/mpicc" ] || { echo "benches/ulfm-init-race.sh: the ULFM build is missing: run make ulfm" >&2; exit 1; }
export LD_LIBRARY_PATH=$V/lib OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
out=runs/bench-ulfm-init-race
mkdir -p "$out"
cc -O1 -shared -fPIC -o "$out/slowfence.so" benches/ulfm-init-race/slowfence.c -ldl
"$V/bin/mpicc" -O1 -o "$out/first" benches/ulfm-init-race/first.c
job() { # name, async (1, 0 or "program"), command...
    local name=$1 async=$2
    shift 2
    local -a env=()
    [ "$async" = program ] || env=(OMPI_MCA_async_mpi_init=$async)
    local rc=0 before
    before=$(segfaults)
    env "${env[@]}" timeout -k 5 60 "$V/bin/mpirun" --with-ft ulfm --oversubscribe -n 8 -x LD_PRELOAD="$PWD/$out/slowfence.so" \
        -x SLOW_FENCE_RANK="$SLOW" -x SLOW_FENCE_MS="$DELAY_MS" "$@" >"$out/$name.log" 2>&1 || rc=$?
    local segv=no
    { [ "$(segfaults)" != "$before" ] || grep -aq 'Failing at address: 0xe0' "$out/$name.log"; } && segv=yes
    echo "$name: exit $rc, a rank segfaulted: $segv"
}
# asap-train's ranks die of it without a word in the job's output (Open MPI's segfault report
# is not printed there), so the kernel's log is counted too where it can be read.
segfaults() { dmesg 2>/dev/null | grep -c 'segfault at e0 .*libmpi' || true; }
for i in $(seq "$REPS"); do
    job "c-async1-$i" 1 "$out/first"
    job "c-async0-$i" 0 "$out/first"
    job "asap-train-async1-$i" 1 "$B" train --epochs 1 --sync asap --transport p2p --on-rank-loss continue
    job "asap-train-$i" program "$B" train --epochs 1 --sync asap --transport p2p --on-rank-loss continue
done
