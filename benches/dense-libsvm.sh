#!/usr/bin/env bash
# Issue 43, item 1: dense data in LIBSVM form, as a user brings it (scikit-learn's sets written
# by dump_svmlight_file, 0-based, and heart_scale), trained with DEFAULT options at 4 ranks in
# every mode (MODES; bosen with --bandwidth-mbps 400, the budget it cannot run without), against scikit-learn's LogisticRegression on the same split. BEFORE (a binary
# that loads LIBSVM sparse, unscaled) and BIN (one that holds dense-enough rows dense and
# standardises them) run the same files. Prints one markdown table; benches/dense-libsvm.md
# keeps the output of a run.
#   BEFORE=/path/to/old/asap-train benches/dense-libsvm.sh
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${BIN:-target/release/asap-train}
BEFORE=${BEFORE:-}
NP=${NP:-4}
MODES=${MODES:-allreduce asap ssp bosen async gaia none}
PY=/usr/bin/python3
$PY -c 'import sklearn' 2>/dev/null || { echo "needs scikit-learn for /usr/bin/python3: apt-get install python3-sklearn" >&2; exit 1; }
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
# Each set split 75/25 (seeded), written 0-based as dump_svmlight_file does by default; prints
# scikit-learn's held-out accuracy (LogisticRegression, max_iter raised until it converges).
$PY - "$out" <<'PY'
import sys, warnings
from sklearn.datasets import load_breast_cancer, load_digits, load_svmlight_file, dump_svmlight_file
from sklearn.linear_model import LogisticRegression
from sklearn.model_selection import train_test_split
out = sys.argv[1]
sets = {"breast_cancer": load_breast_cancer(return_X_y=True), "digits": load_digits(return_X_y=True)}
x, y = load_svmlight_file("/usr/share/doc/liblinear-tools/examples/heart_scale")
sets["heart_scale"] = (x.toarray(), y)
for name, (x, y) in sets.items():
    xtr, xte, ytr, yte = train_test_split(x, y, test_size=0.25, random_state=0, stratify=y)
    dump_svmlight_file(xtr, ytr, f"{out}/{name}.train.svm")
    dump_svmlight_file(xte, yte, f"{out}/{name}.test.svm")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        acc = LogisticRegression(max_iter=100000).fit(xtr, ytr).score(xte, yte)
    open(f"{out}/{name}.sklearn", "w").write(f"{100 * acc:.2f}")
PY
acc() {  # BIN SET MODE -> held-out % of a default run
    local model=logreg
    [ "$2" = digits ] && model=mlr
    mpirun -n "$NP" "$1" train --model $model --data "$out/$2.train.svm" --test-data "$out/$2.test.svm" \
        --zero-based auto --sync "$3" $([ "$3" = bosen ] && echo --bandwidth-mbps 400) > "$out/run.log" 2>&1 || { cat "$out/run.log" >&2; exit 1; }
    sed -n 's/.*held-out \([0-9.]*\) %.*/\1/p' "$out/run.log" | tail -1
}
echo "| set | scikit-learn LogisticRegression | mode | before: sparse, unscaled | now: held dense, standardised |"
echo "|---|---|---|---|---|"
for set in heart_scale breast_cancer digits; do
    for mode in $MODES; do
        before="-"
        [ -n "$BEFORE" ] && before="$(acc "$BEFORE" $set $mode) %"
        echo "| $set | $(cat "$out/$set.sklearn") % | $mode | $before | $(acc "$BIN" $set $mode) % |"
    done
done
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), $NP ranks, binary $BIN, before $BEFORE"
