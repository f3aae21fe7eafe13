#!/usr/bin/env bash
# Does the cross-core penalty of a put into lines the receiver has read follow where the host
# runs this VM's two vCPUs? Alternates the core-to-core round trip (benches/c2c.c, before and
# after) with `rma-check --probe` at 1 MiB and 8 MiB, ITERS times, and prints one row each: the
# CPU microseconds of a raw put, of a raw put whose receiver reads between puts, and of
# NOTIFY-ACK's transfer (docs/asap.md, "Transfer speed at 2 ranks").
# Usage: BIN=/tmp/rma-check benches/rma-placement.sh [OUT.md]   (default benches/rma-placement.md)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-benches/rma-placement.md}
ITERS=${ITERS:-8}
src=${BIN:-target/release/rma-check}
[ -x "$src" ] || { echo "missing $src: cargo build --release --locked --bin rma-check" >&2; exit 1; }
BIN=$(mktemp /tmp/rma-placement-bin.XXXXXX)
C2C=$(mktemp /tmp/rma-placement-c2c.XXXXXX)
trap 'rm -f "$BIN" "$C2C"' EXIT
cp "$src" "$BIN"
chmod +x "$BIN"
gcc -O2 -pthread benches/c2c.c -o "$C2C"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
c2c() { "$C2C" | sed -E 's/.*p10 ([0-9]+) ns.*/\1/'; }
cpu() { # cpu LINES VARIANT -> that variant's cpu_us
    grep -E " $2 " <<<"$1" | sed -E 's/.* cpu_us=([0-9.]+).*/\1/'
}
{
    echo "# Cross-core penalty against vCPU placement"
    echo
    echo "\`BIN=... benches/rma-placement.sh\` ($(date -u +%Y-%m-%dT%H:%MZ), ITERS=$ITERS; commit $(git rev-parse --short HEAD))."
    echo "c2c = 10th-percentile core-to-core round trip in ns (benches/c2c.c) before / after the probe;"
    echo "the rest: CPU microseconds per put from \`mpirun -n 2 rma-check --probe --probe-cycles 1\`."
    echo
    echo "| time (UTC) | load | c2c before / after | 1 MiB raw | 1 MiB raw, receiver reads | 1 MiB NOTIFY-ACK | 8 MiB raw | 8 MiB raw, receiver reads | 8 MiB NOTIFY-ACK |"
    echo "|---|---|---|---|---|---|---|---|---|"
    for ((i = 0; i < ITERS; i++)); do
        t=$(date -u +%T) load=$(cut -d' ' -f1 /proc/loadavg) a=$(c2c)
        one=$(timeout 600 mpirun -n 2 "$BIN" --probe --rounds 200 --len 262144 --probe-cycles 1 2>&1)
        eight=$(timeout 600 mpirun -n 2 "$BIN" --probe --rounds 100 --len 2097152 --probe-cycles 1 2>&1)
        b=$(c2c)
        echo "| $t | $load | $a / $b | $(cpu "$one" raw) | $(cpu "$one" raw-together-reads) | $(cpu "$one" notify-ack-in-place) |" \
            "$(cpu "$eight" raw) | $(cpu "$eight" raw-together-reads) | $(cpu "$eight" notify-ack-in-place) |"
    done
} >"$out"
echo "wrote $out"
