#!/usr/bin/env bash
# Planted-topic recovery from the defaults (issue 44 item 1). Two corpora:
#   - the family: 10 planted topics over disjoint 40-word blocks (W = 400), every document two
#     distinct planted topics in equal shares (--topics-per-doc 2), word j of a block drawn with
#     weight (j+1)^-2 (a discrete Pareto tail of shape 1: --word-exponent 2), 2,000 documents of
#     ~100 tokens; corpus seed = run seed = S for S in $SEEDS;
#   - the K = 100 corpus of docs/lda.md and tests/lda.rs (3,000 documents, 1,000 words, Dirichlet
#     0.01 mixes, corpus seed 1), run seeds $SEEDS.
# 4 ranks of ssp at staleness $STALENESS (default 1), $SWEEPS sweeps, everything else at its default plus $EXTRA
# (e.g. EXTRA="--split-merge 20"). A planted topic is recovered when one learned topic holds at
# least 80 % of its tokens and its words are at least 80 % of that topic's tokens
# (benches/lda_planted.py). With SKLEARN=1 (the default) scikit-learn's batch VB LDA (alpha =
# beta = 0.1, $SWEEPS iterations, random_state S) runs on the same family corpora; SKLEARN100=1
# adds it on the K = 100 corpus (~25 s a seed here).
#   benches/lda-planted.sh                           writes runs/lda-planted/, prints the table
#   EXTRA="--split-merge 0 --anneal-alpha 0" SKLEARN=0 benches/lda-planted.sh   the former defaults
#   AUSTEN=1 FAMILY=0 K100=0 SEEDS="1 2 3 4 5 6" benches/lda-planted.sh   the cost on the Austen corpus
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/asap-train}
SEEDS=${SEEDS:-"1 2 3 4 5"}
SWEEPS=${SWEEPS:-50}
EXTRA=${EXTRA:-}
SKLEARN=${SKLEARN:-1}
SKLEARN100=${SKLEARN100:-0}
STALENESS=${STALENESS:-1}
FAMILY=${FAMILY:-1}
K100=${K100:-1}
out=${OUT:-runs/lda-planted}
mkdir -p "$out"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
PY=/usr/bin/python3
train() { # NAME DATA K SEED -> prints "recovered R of K"
    local name=$1 data=$2 k=$3 seed=$4
    # shellcheck disable=SC2086
    mpirun -n 4 "$BIN" train --model lda --topics "$k" --data "$data" --sync ssp --staleness "$STALENESS" \
        --epochs "$SWEEPS" --eval-every "$SWEEPS" --seed "$seed" --metrics "$out/$name.jsonl" \
        --save-model "$out/$name.h5" $EXTRA > "$out/$name.log" 2>&1
    local words; words=$(sed -n 2p "$data")
    $PY benches/lda_planted.py score "$out/$name.h5" "$words" "$k"
}
all() { local n=0; for r in "$@"; do [ "$r" = 1 ] && n=$((n + 1)); done; echo "$n"; }
fam=() skl=() k100=() skl100=()
for s in $SEEDS; do
    if [ "$FAMILY" = 1 ]; then
        data=$out/docword.family$s.txt
        [ -f "$data" ] || $BIN data synth-lda "$data" --docs 2000 --words 400 --topics 10 --doc-length 100 \
            --topics-per-doc 2 --word-exponent 2 --seed "$s" 2> /dev/null
        r=$(train "family-s$s" "$data" 10 "$s"); echo "family seed $s asap-train: $r"
        fam+=("$([ "$r" = "recovered 10 of 10" ] && echo 1 || echo 0)")
        if [ "$SKLEARN" = 1 ]; then
            r=$($PY benches/lda_planted.py sklearn "$data" 10 "$s" "$SWEEPS"); echo "family seed $s sklearn: $r"
            skl+=("$([ "$r" = "recovered 10 of 10" ] && echo 1 || echo 0)")
        fi
    fi
    if [ "$K100" = 1 ]; then
        data=$out/docword.k100.txt
        [ -f "$data" ] || $BIN data synth-lda "$data" --docs 3000 --words 1000 --topics 100 --doc-length 100 \
            --alpha 0.01 2> /dev/null
        r=$(train "k100-s$s" "$data" 100 "$s"); echo "K=100 seed $s asap-train: $r"
        k100+=("$([ "$r" = "recovered 100 of 100" ] && echo 1 || echo 0)")
        if [ "$SKLEARN100" = 1 ]; then
            r=$($PY benches/lda_planted.py sklearn "$data" 100 "$s" "$SWEEPS"); echo "K=100 seed $s sklearn: $r"
            skl100+=("$([ "$r" = "recovered 100 of 100" ] && echo 1 || echo 0)")
        fi
    fi
done
# AUSTEN_RUNS: "NAME:ARGS ..." (space-separated NAME:ARGS with ARGS joined by commas).
read -r -a AUSTEN_RUNS <<< "${AUSTEN_RUNS:-defaults: former:--split-merge,0,--anneal-alpha,0}"
if [ "${AUSTEN:-0}" = 1 ]; then
    # The cost and the effect on a real corpus: Austen (K = 20, 10 % held out, 100 sweeps, 4 ranks
    # of ssp at staleness $STALENESS), the defaults against the former ones, seeds $SEEDS.
    for s in $SEEDS; do
        for run in "${AUSTEN_RUNS[@]}"; do
            name=${run%%:*} args=${run#*:} args=${args//,/ }
            # shellcheck disable=SC2086
            mpirun -n 4 "$BIN" train --model lda --topics 20 --data datasets/out/docword.austen.txt --sync ssp \
                --staleness "$STALENESS" --epochs 100 --eval-every 100 --test-fraction 0.1 --seed "$s" \
                --metrics "$out/austen-$name-s$s.jsonl" $args > "$out/austen-$name-s$s.log" 2>&1
        done
    done
    $PY - "$out" "${AUSTEN_RUNS[*]}" $SEEDS <<'PY'
import json, statistics, sys
out, runs, seeds = sys.argv[1], sys.argv[2].split(), sys.argv[3:]
for name in [r.split(":")[0] for r in runs]:
    rows = [json.loads(open(f"{out}/austen-{name}-s{s}.jsonl").read().splitlines()[-1]) for s in seeds]
    for key in ["train_seconds", "log_likelihood_per_token", "perplexity"]:
        v = [r[key] for r in rows]
        print(f"austen {name:8} {key:25} median {statistics.median(v):.4f} range {min(v):.4f}-{max(v):.4f}")
PY
fi
n=$(echo "$SEEDS" | wc -w)
echo "== seeds recovering every planted topic, of $n (EXTRA='$EXTRA', $SWEEPS sweeps)"
[ "$FAMILY" = 1 ] && echo "family  asap-train: $(all "${fam[@]}")"
[ "$SKLEARN" = 1 ] && [ "$FAMILY" = 1 ] && echo "family  sklearn:    $(all "${skl[@]}")"
[ "$K100" = 1 ] && echo "K=100   asap-train: $(all "${k100[@]}")"
[ "$SKLEARN100" = 1 ] && [ "$K100" = 1 ] && echo "K=100   sklearn:    $(all "${skl100[@]}")"
exit 0
