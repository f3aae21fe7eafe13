#!/usr/bin/env bash
# `make report`: runs a fixed set of experiments on this machine and writes report/README.md
# (tables next to the papers' claims, embedded SVG plots) and report/summary.json.
#
#   report/run.sh [SECTION...]     sections (default: claims asap61 asap62 mixing; with QUICK=1 every
#                                  section but torch), in this order:
#     claims      each paper's headline claim as an experiment in the emulated cluster
#                 (benches/claim-{asap,bosen,gaia,hetero,async}.sh), opening the report with one
#                 table: the claim, the paper's number, ours, and a computed verdict
#     asap61      allreduce vs asap over root expander, exponential, ring and a searched graph
#     asap62      NOTIFY-ACK vs barrier vs none (consistency histogram, time to target)
#     mixing      consensus rounds (training off, --consensus-only) vs the spectral gap's prediction
#     stragglers  every mode with 2 of 8 ranks at half speed (+ production pattern at 32 ranks)
#     bandwidth   bosen vs ssp (and gaia, allreduce) under an emulated 100 Mbit/s link
#     libsvm      allreduce vs asap vs ssp, logreg and svm, on the LIBSVM set datasets/ prepares
#     movielens   matrix factorisation on MovieLens: allreduce vs asap vs ssp to a held-out RMSE
#     peers       scikit-learn and LIBLINEAR on the same data and machine, our 1 and 8 ranks
#     torch       PyTorch DDP (gloo, CPU, 8 processes) next to our allreduce and asap; opt-in:
#                 only with PEERS=torch or when named (installs torch into runs/torch-venv, ~5 GB)
#     sparse      examples/s and peak RSS per rank on the RCV1-shape synthetic set, 1/4/8 ranks
#   stragglers, bandwidth, libsvm, movielens, peers and sparse run their ranks on the machine's 2
#   cores themselves (where the CPU decides more than the algorithm): the full report keeps their
#   last tables, labelled so, and re-runs them only when named. QUICK=1 runs them all (part of
#   `make test`: it checks the pipeline and the numbers against their metrics, not the claims).
#
# Every table comes from one run of its section (ratios within a table are meaningful; the load
# average at the end of the section is printed next to it). Re-running one section rewrites its
# table and keeps the others: `report/run.sh mixing`.
#
# Environment: QUICK=1 runs the ~2-minute subset (fewer runs, 1 epoch, small synthetic set; used by
# tests/report.rs); BIN (binary; default target/release/asap-train), RUNS (raw metrics, default
# runs/report[-quick]), OUT (default report[-quick] under runs/ for QUICK), PEERS=torch (adds the
# torch section to the default list), TORCH_VENV (default runs/torch-venv), CLUSTER and DILATION
# (the ASAP sections' emulated cluster, below), TUNE (asap61's and asap62's --sync-every grid, below).
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
ALL=(claims asap61 asap62 mixing stragglers bandwidth libsvm movielens peers torch sparse)
EMULATED=(claims asap61 asap62 mixing)
SECTIONS=("$@")
if [ ${#SECTIONS[@]} -eq 0 ]; then
    if [ "$QUICK" = 1 ]; then
        for s in "${ALL[@]}"; do [ "$s" != torch ] || [ "$PEERS" = torch ] && SECTIONS+=("$s"); done
    else
        SECTIONS=("${EMULATED[@]}")
        [ "$PEERS" = torch ] && SECTIONS+=(torch)
    fi
fi
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
# asap61's and asap62's grid of --sync-every (issue 40's tuned baseline; QUICK runs allreduce and DiLoCo at
# k 4 only, to check the pipeline): TUNE="" leaves the section as the paper's, every step.
if [ "$QUICK" = 1 ]; then TUNE=${TUNE-4}; else TUNE=${TUNE-4 16}; fi
# The ASAP sections (asap61, asap62) run in the emulated cluster (docs/emulation.md): every step
# takes the time CLUSTER's profile declares for the model and batch, every message the time its
# links declare, DILATION times slower than that cluster so that 32 ranks on these 2 cores keep up
# (a step of MLR batch 64 is 0.142 ms on the 10 GbE profile: 14.2 ms at dilation 100; 32 ranks
# need ~6 ms of CPU per round). Every row says whether the emulation held. CLUSTER=none runs them
# as before, ranks sharing the machine's cores (where the CPU decides more than the algorithm).
CLUSTER=${CLUSTER:-clusters/10gbe.toml}
DILATION=${DILATION:-100}
EMU=()
[ "$CLUSTER" = none ] || EMU=(--cluster "$CLUSTER" --dilation "$DILATION")
# Their ranks (and the claims scripts' own) run at nice -20 in a group raised to -20 (root only):
# `make report` itself runs at nice 10, and emulated steps must wake on time beside other jobs.
source benches/priority.sh
RANK_NICE_EMULATED=${NICE:--20}
MLR=(--model mlr --batch-size 64 --seed 1)   # + --epochs and --eval-every per section

asap61() {
    local RANK_NICE=$RANK_NICE_EMULATED
    begin asap61
    meta cluster="$CLUSTER" dilation="$DILATION"
    local nps parts
    if [ "$QUICK" = 1 ]; then nps="8"; parts="iid"; else nps="8 32"; parts="iid by-label:2"; fi
    for np in $nps; do
        "$BIN" graph search --nodes "$np" --out-degree 2 --seed 1 --out "$out/searched-$np.txt" >/dev/null 2>&1
        for p in $parts; do
            # 32 ranks see 4x fewer rounds per epoch than 8: twice the epochs (measured in the
            # emulated cluster: no 32-rank run reached 82 % within 3 epochs, 88 rounds).
            local tag="$np-${p//:/}" ev=10 ep=$EPOCHS
            [ "$np" = 32 ] && ev=5 && ep=$((2 * EPOCHS))
            local c=("${MLR[@]}" --epochs "$ep" "${EMU[@]}" --partition "$p" --eval-every $ev)
            run "allreduce-$tag" "$np" "${c[@]}" --sync allreduce
            for g in root-expander exponential ring; do
                [ "$QUICK" = 1 ] && [ "$g" = exponential ] && continue
                run "asap-$g-$tag" "$np" "${c[@]}" --sync asap --graph "$g"
            done
            run "asap-searched-$tag" "$np" "${c[@]}" --sync asap --graph "file:$out/searched-$np.txt"
            # Issue 40's tuned baseline: every row again at each --sync-every K of TUNE, and
            # allreduce with DiLoCo's outer optimizer; render.py picks each variant's best K by
            # time to target and compares it with the best tuned allreduce (the same grid for
            # both sides). Evaluated about every ev steps at every K.
            for k in $TUNE; do
                local ck=("${MLR[@]}" --epochs "$ep" "${EMU[@]}" --partition "$p" --eval-every $(( ev / k > 0 ? ev / k : 1 )) --sync-every "$k")
                run "allreduce-k$k-$tag" "$np" "${ck[@]}" --sync allreduce
                run "allreduce-diloco-k$k-$tag" "$np" "${ck[@]}" --sync allreduce --outer-optimizer nesterov
                [ "$QUICK" = 1 ] && continue
                for g in root-expander exponential ring; do
                    run "asap-$g-k$k-$tag" "$np" "${ck[@]}" --sync asap --graph "$g"
                done
                run "asap-searched-k$k-$tag" "$np" "${ck[@]}" --sync asap --graph "file:$out/searched-$np.txt"
            done
        done
    done
    end
}

asap62() {
    local RANK_NICE=$RANK_NICE_EMULATED
    begin asap62
    meta cluster="$CLUSTER" dilation="$DILATION"
    local c=("${MLR[@]}" --epochs "$EPOCHS" "${EMU[@]}" --eval-every 10 --straggler 0,1:2 --sync asap --graph root-expander)
    run allreduce 8 "${MLR[@]}" --epochs "$EPOCHS" "${EMU[@]}" --eval-every 10 --straggler 0,1:2 --sync allreduce
    for m in notify-ack barrier none; do run "asap-$m" 8 "${c[@]}" --notify $m; done
    # Issue 40's tuned baseline, as in asap61: every row at each --sync-every of TUNE, and
    # allreduce under DiLoCo's outer optimizer.
    for k in $TUNE; do
        local ck=("${MLR[@]}" --epochs "$EPOCHS" "${EMU[@]}" --eval-every $(( 10 / k > 0 ? 10 / k : 1 )) --straggler 0,1:2 --sync-every "$k")
        run "allreduce-k$k" 8 "${ck[@]}" --sync allreduce
        run "allreduce-diloco-k$k" 8 "${ck[@]}" --sync allreduce --outer-optimizer nesterov
        [ "$QUICK" = 1 ] && continue
        for m in notify-ack barrier none; do run "asap-$m-k$k" 8 "${ck[@]}" --sync asap --graph root-expander --notify $m; done
    done
    end
}

# Each paper's claim, one script per paper (benches/claim-NAME.sh DIR: DIR/claim.json and
# DIR/table.md; QUICK=1 makes each its short subset). The scripts raise their own priority
# (benches/priority.sh) and run their ranks at nice -20, so the emulated steps wake on time.
CLAIM_BENCHES=(asap bosen gaia hetero async)
claims() {
    begin claims
    for c in "${CLAIM_BENCHES[@]}"; do
        local d=$out/$c t0
        t0=$(date +%s)
        mkdir -p "$d"
        echo "   claim $c ($(date -u +%T))" >&2
        QUICK=$QUICK BIN=$BIN benches/claim-$c.sh "$d" > "$d/log" 2>&1 \
            || { echo "benches/claim-$c.sh failed: see $d/log" >&2; tail -n 20 "$d/log" >&2; exit 1; }
        meta "seconds_$c=$(( $(date +%s) - t0 ))"
        rows+=("$c")
    done
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
        run "$name-8" 8 "${MLR[@]}" --epochs "$EPOCHS" --eval-every 10 "${S[@]}" "$@"
    done
    if [ "$QUICK" != 1 ]; then
        for m in "${modes[0]}" "${modes[1]}" "${modes[2]}" "${modes[7]}" "${modes[9]}" "${modes[10]}"; do
            set -- $m; local name=$1; shift
            run "$name-32-production" 32 "${MLR[@]}" --epochs "$EPOCHS" --eval-every 5 --straggler production "$@"
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
    end
}

# The real LIBSVM set datasets/prepare.sh makes (heart_scale, 270 x 13, +1/-1 labels; it is the
# only LIBSVM file there): 30 % held out by the seeded row hash, batches of 8 so each of the 8
# ranks' ~24 rows gives 3 mini-batches per epoch; lr 0.1 decayed 0.95 per epoch over 30 epochs
# (the default 0.3 * 0.8^epoch has all but stopped after 15 of these short epochs).
libsvm() {
    begin libsvm
    datasets/prepare.sh >&2
    local epochs=30
    [ "$QUICK" = 1 ] && epochs=10
    local H=(--data datasets/out/heart_scale.svm --test-fraction 0.3 --batch-size 8 --epochs "$epochs" --lr 0.1
             --lr-decay 0.95 --eval-every 3 --seed 1)
    meta data=datasets/out/heart_scale.svm test_fraction=0.3 what="binary classification, 8 ranks" options="${H[*]}"
    local models="logreg svm"
    [ "$QUICK" = 1 ] && models=logreg
    for model in $models; do
        run "allreduce-$model" 8 "${H[@]}" --model "$model" --sync allreduce
        run "asap-root-expander-$model" 8 "${H[@]}" --model "$model" --sync asap --graph root-expander
        [ "$QUICK" = 1 ] || run "ssp-S0-consgd-$model" 8 "${H[@]}" --model "$model" --sync ssp --staleness 0 --apply consgd
        run "ssp-S3-consgd-$model" 8 "${H[@]}" --model "$model" --sync ssp --staleness 3 --apply consgd
    done
    end
}

# MovieLens (datasets/prepare.sh: 90,004 training ratings, 10,000 held out): the options of
# benches/ssp.sh mf and docs/datasets (lr 1, lambda 0.1, 0.9 per epoch), one round every 22
# mini-batches (16 per epoch: averaging the 107,108-parameter model after every mini-batch made
# allreduce 37 s of training for 20 epochs against 0.7 s for 12 epochs this way), 12 epochs.
movielens() {
    begin movielens
    datasets/prepare.sh >&2
    local epochs=12
    [ "$QUICK" = 1 ] && epochs=3
    local M=(--data datasets/out/movielens-train.ratings --test-data datasets/out/movielens-test.ratings --model mf
             --lr 1 --lambda 0.1 --lr-decay 0.9 --epochs "$epochs" --sync-every 22 --eval-every 4 --seed 1)
    meta data=datasets/out/movielens-train.ratings what="matrix factorisation (10 factors), 8 ranks" options="${M[*]}"
    run allreduce 8 "${M[@]}" --sync allreduce
    run asap-root-expander 8 "${M[@]}" --sync asap --graph root-expander
    [ "$QUICK" = 1 ] || run ssp-S0-consgd 8 "${M[@]}" --sync ssp --staleness 0 --apply consgd
    run ssp-S3-dynsgd 8 "${M[@]}" --sync ssp --staleness 3 --apply dynsgd
    end
}

# PyTorch DDP's venv, owned by the report: the CPU-only wheel index first; where it cannot be
# reached, PyPI's torch with its dependencies (the Linux wheel is the CUDA build: it does not
# import without the NVIDIA libraries, so --no-deps is not enough). Notes what it used.
TORCH_VENV=${TORCH_VENV:-runs/torch-venv}
torch_venv() {
    local py=$TORCH_VENV/bin/python t0 src now=0
    if ! { [ -x "$py" ] && [ -f "$TORCH_VENV/.installed" ] && "$py" -c 'import torch, torch.distributed as d; assert d.is_gloo_available()' 2>/dev/null; }; then
        echo "torch: installing into $TORCH_VENV" >&2
        t0=$(date +%s)
        rm -rf "$TORCH_VENV"
        # System site packages: Debian's numpy (the peer reads IDX files with it).
        $PY -m venv --system-site-packages "$TORCH_VENV"
        if "$TORCH_VENV/bin/pip" install -q --retries 1 torch --index-url https://download.pytorch.org/whl/cpu >&2; then
            src="the PyTorch CPU-only wheel index"
        elif "$TORCH_VENV/bin/pip" install -q torch >&2; then
            src="PyPI (CUDA build with its NVIDIA libraries; the CPU-only index was unreachable)"
        else
            echo "torch: cannot install torch into $TORCH_VENV" >&2; exit 1
        fi
        "$py" -c 'import torch, torch.distributed as d; assert d.is_gloo_available(), "torch without gloo"' \
            || { echo "torch: installed but cannot import it with gloo" >&2; exit 1; }
        # What the set-up did, kept with the venv for later runs' reports.
        printf '%s\n%s\n%s\n' "$src" "$(( $(date +%s) - t0 ))" "$(date -u +%FT%TZ)" > "$TORCH_VENV/.installed"
        now=1
    fi
    meta torch_source="$(sed -n 1p "$TORCH_VENV/.installed")" torch_install_seconds="$(sed -n 2p "$TORCH_VENV/.installed")" \
        torch_installed_at="$(sed -n 3p "$TORCH_VENV/.installed")" torch_installed_now="$now" torch_venv="$TORCH_VENV" \
        torch_venv_mb="$(du -sm "$TORCH_VENV" | cut -f1)" torch_version="$("$py" -c 'import torch; print(torch.__version__)')"
}

torch() {
    begin torch
    torch_venv
    # The asap61 options at 8 ranks, IID: our allreduce, our best asap at 8 ranks in asap61
    # (root expander), and DDP with the same model, shards, batch, schedule and evaluations.
    # MLR's last evaluations swing by +-2 points between seeds (eta is still 0.19 in epoch 3), so
    # allreduce and DDP run with seeds 1-3; then the same for the MLP (seed 1).
    local c=(--batch-size 64 --epochs "$EPOCHS" --eval-every 10)
    meta options="${c[*]}"
    local seeds="1 2 3" models="mlr mlp"
    [ "$QUICK" = 1 ] && { seeds=1; models=mlr; }
    for model in $models; do
        for seed in $seeds; do
            [ "$model" = mlp ] && [ "$seed" != 1 ] && continue
            run "allreduce-$model-s$seed" 8 "${c[@]}" --model "$model" --seed "$seed" --sync allreduce
            [ "$seed" = 1 ] && run "asap-root-expander-$model-s$seed" 8 "${c[@]}" --model "$model" --seed "$seed" --sync asap --graph root-expander
            local name="torch-ddp-$model-s$seed"
            "$TORCH_VENV/bin/python" report/torch_ddp.py --ranks 8 --model "$model" --hidden 128 --batch-size 64 --lr 0.3 --decay 0.8 \
                --lambda 1e-5 --epochs "$EPOCHS" --eval-every 10 --seed "$seed" --metrics "$out/$name.jsonl" > "$out/$name.log" 2>&1 \
                || { echo "torch DDP run failed: see $out/$name.log" >&2; exit 1; }
            rows+=("$name")
        done
    done
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
        # Peak RSS per rank in sparse-NP.rss.RANK (benches/lib.sh's PEAK_RSS).
        mpirun -n "$np" "${PEAK_RSS[@]}" "$out/sparse-$np.rss" "$BIN" train --data "$data" --model svm --epochs 1 \
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
