#!/usr/bin/env bash
# The Python MF loop on asap_train.Table (examples/table_mf.py) against the binary's `--model mf
# --sync ssp` with the same data, settings and seed: held-out RMSE and ratings per second over
# all ranks (issue 30, item 5). Needs `make python` and datasets/prepare.sh (MovieLens).
#   NP=8 EPOCHS=3 benches/python-table-mf.sh
set -euo pipefail
cd "$(dirname "$0")/.."
NP=${NP:-8} EPOCHS=${EPOCHS:-3} S=${S:-3}
D=${DATA:-datasets/out}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
same=(--staleness "$S" --apply consgd --lr 1 --lambda 0.1 --lr-decay 0.9 --epochs "$EPOCHS" --sync-every 22 --seed 1)
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "load before: $(cut -d' ' -f1-3 /proc/loadavg)"
mpirun -n "$NP" .venv-python/bin/python examples/table_mf.py --train "$D/movielens-train.ratings" \
    --test "$D/movielens-test.ratings" "${same[@]}" 2>&1 | grep -v '^\[warn' | sed 's/^/python: /'
mpirun -n "$NP" target/release/asap-train train --data "$D/movielens-train.ratings" --test-data "$D/movielens-test.ratings" \
    --model mf --sync ssp "${same[@]}" --metrics "$out/mf.jsonl" >/dev/null 2>&1
.venv-python/bin/python - "$out/mf.jsonl" "$NP" <<'PY'
import sys, asap_train as at
s = [l for l in at.read_metrics(sys.argv[1]) if l.get("event") == "summary"][0]
n = int(sys.argv[2])
print("binary: held-out RMSE %.4f, train seconds %.2f, %.0f ratings/s over all ranks"
      % (s["final_metric"], s["train_seconds"], s["examples_per_second_per_rank"] * n))
PY
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
