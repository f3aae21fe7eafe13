#!/usr/bin/env bash
# Where the time of a NOTIFY-ACK transfer goes at 2 ranks (docs/asap.md, NOTIFY-ACK step 3).
# Usage: BIN=/tmp/rma-check benches/rma-transfer.sh [OUT.md]   (default benches/rma-transfer.md)
# BIN defaults to target/release/rma-check, copied to a temporary file first so a rebuild cannot
# change it mid-run. REPS (default 3) back-to-back repetitions of, for 1 MiB and 8 MiB payloads
# (LENS, in f32s), each with glibc's default copy and with non-temporal copies from 1 MiB up
# (GLIBC_TUNABLES=glibc.cpu.x86_non_temporal_threshold=0x100000, passed to the ranks with -x):
# 1. `rma-check --graph complete --rounds ROUNDS --len L` (the issue's command): the raw
#    put + flush, the raw put + flush with the receiver reading its window between puts, and
#    NOTIFY-ACK's transfer (put, flush, NOTIFY) per message, wall clock;
# 2. `rma-check --probe --probe-cycles 1` at the same size: every variant's wall and CPU time
#    per put (CPU time is what holds up when other jobs share the 2 cores).
# The load average (uptime) and the core-to-core round trip (benches/c2c.c, 10th percentile,
# before the run: docs/asap.md ties the cross-core penalty to it) are written next to every run.
# COPIES="default nt" (default) or one of them; PROBE=0 skips part 2.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-benches/rma-transfer.md}
REPS=${REPS:-3} ROUNDS=${ROUNDS:-200} LENS=${LENS:-"262144 2097152"}
NT=glibc.cpu.x86_non_temporal_threshold=0x100000
COPIES=${COPIES:-"default nt"} PROBE=${PROBE:-1}
tunables=()
for c in $COPIES; do
    case $c in default) tunables+=("") ;; nt) tunables+=("$NT") ;; *) echo "COPIES: unknown '$c'" >&2; exit 1 ;; esac
done
src=${BIN:-target/release/rma-check}
[ -x "$src" ] || { echo "missing $src: cargo build --release --locked --bin rma-check" >&2; exit 1; }
BIN=$(mktemp /tmp/rma-transfer-bin.XXXXXX)
raw=$(mktemp /tmp/rma-transfer-log.XXXXXX)
C2C=$(mktemp /tmp/rma-transfer-c2c.XXXXXX)
trap 'rm -f "$BIN" "$raw" "$C2C"' EXIT
cp "$src" "$BIN"
chmod +x "$BIN"
gcc -O2 -pthread benches/c2c.c -o "$C2C"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
one() { # one REP LEN TUNABLES(or "") ARGS... : appends tagged output lines to $raw
    local rep=$1 len=$2 tun=$3 load tag=default; shift 3
    [ -z "$tun" ] || tag=nt
    load=$(uptime | sed -E 's/.*load average: ([0-9.]+),.*/\1/')/$("$C2C" | sed -E 's/.*p10 ([0-9]+) ns.*/\1/')
    GLIBC_TUNABLES=$tun timeout 600 mpirun -x GLIBC_TUNABLES -n 2 "$BIN" --len "$len" --rounds "$ROUNDS" "$@" 2>&1 |
        grep -E '^rma-check: (raw put|ok graph|probe)' | sed "s|^|$rep $tag $load |" >>"$raw" ||
        { echo "run failed: rep $rep len $len tunables '$tun' $*" >&2; exit 1; }
}
for ((r = 1; r <= REPS; r++)); do
    for len in $LENS; do
        for tun in "${tunables[@]}"; do
            one "$r" "$len" "$tun" --graph complete
        done
    done
done
for ((r = 1; r <= REPS * PROBE; r++)); do
    for len in $LENS; do
        for tun in "${tunables[@]}"; do
            one "$r" "$len" "$tun" --probe --probe-cycles 1
        done
    done
done
{
    echo "# NOTIFY-ACK transfer at 2 ranks: where the time goes"
    echo
    echo "\`BIN=... benches/rma-transfer.sh\` ($(date -u +%Y-%m-%dT%H:%MZ), REPS=$REPS, ROUNDS=$ROUNDS; commit $(git rev-parse --short HEAD))."
    echo "Times are per message (put + flush, or NOTIFY-ACK's put, flush and NOTIFY) in microseconds;"
    echo "\"nt\" runs pass \`GLIBC_TUNABLES=$NT\` to the ranks. Load = 1-minute load average before the run / core-to-core round trip in ns (benches/c2c.c, p10)."
    echo
    python3 - "$raw" <<'PY'
import re, sys
rows = [l.split(" ", 3) for l in open(sys.argv[1]).read().splitlines()]
kv = lambda s: dict(re.findall(r"(\w+)=([0-9.]+)", s))
print("## 1. The issue's command: `mpirun -n 2 rma-check --graph complete --rounds 200 --len L`")
print()
print("| rep | len (f32) | copies | load / c2c | raw put+flush | raw, receiver reads | NOTIFY-ACK transfer | transfer_vs_raw_put | transfer_vs_read_put | round |")
print("|---|---|---|---|---|---|---|---|---|---|")
pending = {}
for rep, tun, load, line in rows:
    if line.startswith("rma-check: raw put"):
        m = re.search(r"len=(\d+).*?: ([0-9.]+) us.*?puts: ([0-9.]+) us", line)
        pending[(rep, tun, m.group(1))] = (load, m.group(2), m.group(3))
    elif line.startswith("rma-check: ok graph"):
        d = kv(line)
        load, a, b = pending[(rep, tun, d["len"])]
        print(f"| {rep} | {d['len']} | {tun} | {load} | {a} | {b} | {d['transfer_us']} | {d['transfer_vs_raw_put']} | "
              f"{d['transfer_vs_read_put']} | {d['round_latency_us']} |")
probe = [(rep, tun, load, line) for rep, tun, load, line in rows if line.startswith("rma-check: probe")]
if not probe:
    sys.exit(0)
print()
print("## 2. `rma-check --probe`: wall / CPU microseconds per put, one line per run")
print()
probe = [(rep, tun, load, line) for rep, tun, load, line in rows if line.startswith("rma-check: probe")]
variants = []
for *_, line in probe:
    v = line.split()[4]
    if v not in variants:
        variants.append(v)
print("| rep | len (f32) | copies | load / c2c | " + " | ".join(variants) + " |")
print("|---|---|---|---|" + "---|" * len(variants))
cells = {}
for rep, tun, load, line in probe:
    d = kv(line)
    key = (rep, d["len"], tun, load)
    cells.setdefault(key, {})[line.split()[4]] = f"{float(d['transfer_us']):.0f} / {float(d['cpu_us']):.0f}"
for (rep, ln, tun, load), c in cells.items():
    print(f"| {rep} | {ln} | {tun} | {load} | " + " | ".join(c.get(v, "-") for v in variants) + " |")
print()
print("Reduce (CPU us per round, receiver): " + "; ".join(
    f"rep {rep} len {kv(line)['len']} {tun} {line.split()[4]} {kv(line)['reduce_cpu_us']}"
    for rep, tun, load, line in probe if "notify-ack-accumulator" in line or "notify-ack-in-place" in line))
PY
} >"$out"
echo "wrote $out"
