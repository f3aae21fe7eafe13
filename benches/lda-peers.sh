#!/usr/bin/env bash
# asap-train --model lda (1 rank) against scikit-learn's LatentDirichletAllocation and the `lda`
# package on the Austen corpus (make datasets), K = 20, every 10th document held out; all models
# scored by the same document completion (benches/lda_peers.py). Results: benches/lda-peers.md.
#   PY: a Python with scikit-learn, h5py and scipy (Debian's /usr/bin/python3 has them); for the
#   `lda` package make a venv: /usr/bin/python3 -m venv --system-site-packages V; V/bin/pip install lda
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-/usr/bin/python3}
K=${K:-20}
B=target/release/asap-train
out=$(mktemp -d)
src=datasets/out/docword.austen.txt
[ -s "$src" ] || datasets/prepare.sh
# Every 10th document to the held-out file (ids renumbered from 1 in each file).
awk -v out="$out" 'NR <= 3 { next } { d = $1; if (d % 10 == 0) { if (!(d in te)) te[d] = ++nt; print te[d], $2, $3 > out "/te.body" } else { if (!(d in tr)) tr[d] = ++ntr; print tr[d], $2, $3 > out "/tr.body" } }
     END { print ntr > out "/tr.n"; print nt > out "/te.n" }' "$src"
W=$(sed -n 2p "$src")
for s in tr te; do
    { cat "$out/$s.n"; echo "$W"; wc -l < "$out/$s.body"; cat "$out/$s.body"; } > "$out/docword.$s.txt"
done
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
ours=()
for e in 25 50 100; do
    # --split-merge 0 --anneal-alpha 0: the burn-in defaults of issue 44 came after this table
    # (docs/lda.md: on Austen they cost 1.7x the training time of 100 sweeps at 4 ranks).
    mpirun -n 1 $B train --model lda --topics "$K" --sync allreduce --data "$out/docword.tr.txt" --epochs $e --eval-every 1000 \
        --split-merge 0 --anneal-alpha 0 \
        --metrics "$out/m$e.jsonl" --save-model "$out/m$e.h5" > /dev/null 2>&1
    secs=$($PY -c "import json,sys; print([json.loads(l) for l in open(sys.argv[1])][-1]['train_seconds'])" "$out/m$e.jsonl")
    ours+=("$out/m$e.h5:$secs")
done
$PY benches/lda_peers.py "$out/docword.tr.txt" "$out/docword.te.txt" "$K" "${ours[@]}"
rm -rf "$out"
