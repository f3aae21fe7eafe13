#!/usr/bin/env bash
# `make report`: runs a fixed set of experiments on this machine and writes report/README.md
# (tables next to the papers' claims, embedded SVG plots) and report/summary.json.
#
#   report/run.sh [SECTION...]     sections (default: all, in this order):
#     asap61      allreduce vs asap over root expander, exponential, ring and a searched graph
#     asap62      NOTIFY-ACK vs barrier vs none (consistency histogram, time to target)
#     mixing      consensus rounds (training off, --consensus-only) vs the spectral gap's prediction
#     stragglers  every mode with 2 of 8 ranks at half speed (+ production pattern at 32 ranks)
#     bandwidth   bosen vs ssp (and gaia, allreduce) under an emulated 100 Mbit/s link
#     peers       scikit-learn and LIBLINEAR on the same data and machine, our 1 and 8 ranks
#     sparse      examples/s and peak RSS per rank on the RCV1-shape synthetic set, 1/4/8 ranks
#
# Every table comes from one run of its section (ratios within a table are meaningful; the load
# average at the end of the section is printed next to it). Re-running one section rewrites its
# table and keeps the others: `report/run.sh mixing`.
#
# Environment: QUICK=1 runs the ~2-minute subset (fewer runs, 1 epoch, small synthetic set; used by
# tests/report.rs); BIN (binary; default target/release/asap-train), RUNS (raw metrics, default
# runs/report[-quick]), OUT (default report[-quick] under runs/ for QUICK), PEERS=torch (PyTorch
# DDP: not implemented, the report says so).
set -euo pipefail
cd "$(dirname "$0")/.."
here=$PWD
QUICK=${QUICK:-0}
BIN=${BIN:-$here/target/release/asap-train}
if [ "$QUICK" = 1 ]; then
    RUNS=${RUNS:-runs/report-quick}; OUT=${OUT:-runs/report-quick/out}
else
    RUNS=${RUNS:-runs/report}; OUT=${OUT:-report}
fi
PEERS=${PEERS:-}
ALL=(asap61 asap62 mixing stragglers bandwidth peers sparse)
SECTIONS=("$@")
[ ${#SECTIONS[@]} -gt 0 ] || SECTIONS=("${ALL[@]}")
mkdir -p "$RUNS" "$OUT"
[ -x "$BIN" ] || { echo "no binary at $BIN: cargo build --release first" >&2; exit 1; }
# Debian's python3 has the packaged scikit-learn; a python3 earlier on PATH may not.
PY=/usr/bin/python3
export OMPI_MCA_mpi_yield_when_idle=1

# `meta KEY=VALUE...` notes facts of the current section for render.py (JSON object per line).
meta() { $PY -c 'import json,sys; print(json.dumps(dict(a.split("=",1) for a in sys.argv[1:])))' "$@" >> "$out/meta.jsonl"; }
begin() { # begin SECTION: a fresh directory for the section's runs
    out=$RUNS/$1; rm -rf "$out"; mkdir -p "$out"; rows=()
    meta section="$1" quick="$QUICK" started="$(date -u +%FT%TZ)"
    echo "== $1 ($(date -u +%T))" >&2
}
end() { meta load="$(cut -d' ' -f1-3 /proc/loadavg)" finished="$(date -u +%FT%TZ)" rows="${rows[*]}"; }
. benches/lib.sh   # run NAME NP ARGS... (metrics into $out/NAME.jsonl; divergence is a row)

if [ "$QUICK" = 1 ]; then EPOCHS=1; else EPOCHS=3; fi
MLR=(--model mlr --batch-size 64 --epochs "$EPOCHS" --seed 1)   # + --eval-every per section

asap61() {
    begin asap61
    local nps parts
    if [ "$QUICK" = 1 ]; then nps="8"; parts="iid"; else nps="8 32"; parts="iid by-label:2"; fi
    for np in $nps; do
        "$BIN" graph search --nodes "$np" --out-degree 2 --seed 1 --out "$out/searched-$np.txt" >/dev/null 2>&1
        for p in $parts; do
            local tag="$np-${p//:/}" ev=10
            [ "$np" = 32 ] && ev=5
            local c=("${MLR[@]}" --partition "$p" --eval-every $ev)
            run "allreduce-$tag" "$np" "${c[@]}" --sync allreduce
            for g in root-expander exponential ring; do
                [ "$QUICK" = 1 ] && [ "$g" = exponential ] && continue
                run "asap-$g-$tag" "$np" "${c[@]}" --sync asap --graph "$g"
            done
            run "asap-searched-$tag" "$np" "${c[@]}" --sync asap --graph "file:$out/searched-$np.txt"
        done
    done
    end
}

asap62() {
    begin asap62
    local c=("${MLR[@]}" --eval-every 10 --straggler 0,1:2 --sync asap --graph root-expander)
    run allreduce 8 "${MLR[@]}" --eval-every 10 --straggler 0,1:2 --sync allreduce
    for m in notify-ack barrier none; do run "asap-$m" 8 "${c[@]}" --notify $m; done
    end
}

mixing() {
    begin mixing
    local nps graphs
    if [ "$QUICK" = 1 ]; then nps="8"; graphs="root-expander ring"; else nps="8 32"; graphs="root-expander exponential ring searched"; fi
    for np in $nps; do
        "$BIN" graph search --nodes "$np" --out-degree 2 --seed 1 --out "$out/searched-$np.txt" >/dev/null 2>&1
        for g in $graphs; do
            local spec=$g
            [ "$g" = searched ] && spec="file:$out/searched-$np.txt"
            local pred
            if [ "$g" = searched ]; then pred=$("$BIN" graph gap --file "$out/searched-$np.txt" --json); else pred=$("$BIN" graph gap --kind "$g" --nodes "$np" --json); fi
            pred=$(echo "$pred" | $PY -c 'import json,sys; print(json.load(sys.stdin)["mixing_rounds"])')
            # Enough rounds for twice the prediction, ~40 evaluations; batch 1 so one epoch has
            # 60000/np rounds (no gradient steps are taken).
            local rounds=$(( 2 * pred + 20 )) every=$(( pred / 20 > 1 ? pred / 20 : 1 ))
            run "mix-$g-$np" "$np" --model logreg --sync asap --graph "$spec" --consensus-only --batch-size 1 \
                --epochs 1 --max-rounds "$rounds" --eval-every "$every" --own-models 1 --seed 1
        done
    done
    end
}

stragglers() {
    begin stragglers
    local S=(--straggler 0,1:2)
    local modes=(
        "allreduce --sync allreduce"
        "asap-root --sync asap --graph root-expander"
        "asap-root-S2 --sync asap --graph root-expander --staleness 2"
        "asap-root-overlap --sync asap --graph root-expander --overlap"
        "asap-root-push-sum --sync asap --graph root-expander --notify push-sum"
        "asap-root-none --sync asap --graph root-expander --notify none"
        "ssp-S3-plain --sync ssp --staleness 3 --apply plain --lr 0.0375"
        "ssp-S3-consgd --sync ssp --staleness 3 --apply consgd"
        "ssp-S3-dynsgd --sync ssp --staleness 3 --apply dynsgd"
        "async-ssp3 --sync async --barrier ssp:3"
        "none --sync none"
    )
    if [ "$QUICK" = 1 ]; then modes=("${modes[0]}" "${modes[1]}" "${modes[7]}" "${modes[9]}"); fi
    for m in "${modes[@]}"; do
        set -- $m; local name=$1; shift
        run "$name-8" 8 "${MLR[@]}" --eval-every 10 "${S[@]}" "$@"
    done
    if [ "$QUICK" != 1 ]; then
        for m in "${modes[0]}" "${modes[1]}" "${modes[2]}" "${modes[7]}" "${modes[9]}" "${modes[10]}"; do
            set -- $m; local name=$1; shift
            run "$name-32-production" 32 "${MLR[@]}" --eval-every 5 --straggler production "$@"
        done
    fi
    end
}

bandwidth() {
    begin bandwidth
    # As benches/bosen.sh mlr: a clock is a quarter pass (59 mini-batches of 32 at 8 ranks).
    local L=(--model mlr --epochs "$EPOCHS" --sync-every 59 --emulate-bandwidth 100 --eval-every 1 --seed 1)
    [ "$QUICK" = 1 ] || run allreduce 8 "${L[@]}" --sync allreduce
    run ssp-S2-consgd 8 "${L[@]}" --sync ssp --staleness 2 --apply consgd
    run bosen-B40-relative 8 "${L[@]}" --sync bosen --staleness 2 --bandwidth-mbps 40 --priority relative
    if [ "$QUICK" != 1 ]; then
        run bosen-B80-relative 8 "${L[@]}" --sync bosen --staleness 2 --bandwidth-mbps 80 --priority relative
        run gaia-2groups-1pct 8 "${L[@]}" --sync gaia --groups 2 --significance 0.01
    fi
    end
}

peers() {
    begin peers
    local n=60000
    [ "$QUICK" = 1 ] && n=6000
    # Ours: one rank (plain SGD) and 8 ranks of allreduce, same model (softmax regression).
    run ours-1rank 1 --model mlr --epochs 5 --sync none --eval-every 0 --seed 1
    [ "$QUICK" = 1 ] || run ours-allreduce-8 8 --model mlr --epochs 5 --sync allreduce --eval-every 0 --seed 1
    $PY report/peers.py --rows "$n" --out "$out/peers.json" >&2
    if [ "$PEERS" = torch ]; then meta torch="requested but not implemented in this report yet"; fi
    end
}

sparse() {
    begin sparse
    local nrows=697641
    [ "$QUICK" = 1 ] && nrows=20000
    local data=$RUNS/synth-$nrows.svm
    [ -f "$data" ] || "$BIN" data synth "$data" --rows "$nrows" --seed 1 >&2
    meta data="$data" data_mb="$(( $(stat -c %s "$data") / 1000000 ))"
    for np in 1 4 8; do
        mpirun -n "$np" /usr/bin/time -f "PEAK_RSS_KB %M" "$BIN" train --data "$data" --model svm --epochs 1 \
            --sync allreduce --eval-every 0 --metrics "$out/sparse-$np.jsonl" > "$out/sparse-$np.log" 2>&1 \
            || { echo "sparse run at $np ranks failed: see $out/sparse-$np.log" >&2; exit 1; }
        rows+=("sparse-$np")
    done
    end
}

for s in "${SECTIONS[@]}"; do
    case " ${ALL[*]} " in *" $s "*) "$s" ;; *) echo "unknown section $s (one of ${ALL[*]})" >&2; exit 2 ;; esac
done
$PY report/render.py --runs "$RUNS" --out "$OUT" --bin "$BIN" --quick "$QUICK"
