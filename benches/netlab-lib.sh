# Sourced by the benches on netlab's real links (allreduce-link.sh, asap-transport.sh):
#   netlab_bench NAME NETLAB_NAME SUBNET
# copies the binary (BIN, default target/release/asap-train) to a private path, so that a rebuild
# while the bench runs cannot change it, names the netlab set-up and its subnet (apart from other
# benches' and the tests'), makes the output directory $out = runs/NAME-HHMMSS, takes the set-up
# down and the copy away on exit, and prepares the data sets.
netlab_bench() {
    local src=${BIN:-$PWD/target/release/asap-train}
    BIN=/tmp/$1-bin-$$
    cp "$src" "$BIN"
    # NETLAB_BENCH_NAME / NETLAB_BENCH_NET run a second copy of a bench beside one with the
    # script's own name (its exit takes its set-up down by name)
    export BIN NETLAB_NAME=${NETLAB_BENCH_NAME:-$2} NETLAB_NET=${NETLAB_BENCH_NET:-$3}
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
    out=runs/$1-$(date +%H%M%S)
    mkdir -p "$out"
    trap 'netlab/wan.sh down >/dev/null 2>&1 || true; rm -f "$BIN"' EXIT
    datasets/prepare.sh >/dev/null
}
