#!/usr/bin/env bash
# graph gap at scale against SciPy (issue 15): random 4-out graphs, P row-stochastic with
# self-loops. Prints one markdown table: nodes, asap-train seconds and peak RSS, SciPy svds(P, k=2)
# seconds and peak RSS (SciPy from PyPI into a venv, capped at $SCIPY_LIMIT s per size), both gaps.
# Then `graph gap` of every generated family at $FAMILY_NODES nodes (seconds and peak RSS of the
# whole process), and `graph mix` measured vs predicted rounds for five families at $MIX_NODES.
# Usage: benches/graph-scale.sh   (env: SIZES, SCIPY_LIMIT, FAMILY_NODES, FAMILIES, MIX_NODES,
#        MIX_SECONDS, VENV)
set -euo pipefail
cd "$(dirname "$0")/.."
SIZES=${SIZES:-"4096 16384 65536 262144 1048576"}
SCIPY_LIMIT=${SCIPY_LIMIT:-300}
FAMILY_NODES=${FAMILY_NODES:-1048576}
FAMILIES=${FAMILIES:-"exponential random:2 random:4 random:8 hypercube torus ring root-expander chain complete"}
MIX_NODES=${MIX_NODES:-"1024 16384 1048576"}
MIX_SECONDS=${MIX_SECONDS:-60}
VENV=${VENV:-target/scipy-venv}
BIN=target/release/asap-train
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
cargo build --release --quiet
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install --quiet scipy >&2
fi
SCIPY_VERSION=$("$VENV/bin/python" -c 'import scipy; print(scipy.__version__)')
cat > "$TMP/gap.py" <<'PY'
import sys, time
import numpy as np, scipy.sparse as sp
from scipy.sparse.linalg import svds
path = sys.argv[1]
n = None; src = []; dst = []
with open(path) as f:
    for line in f:
        line = line.split('#')[0].split()
        if not line: continue
        if line[0] == 'nodes': n = int(line[1]); continue
        src.append(int(line[0])); dst.append(int(line[1]))
src = np.array(src); dst = np.array(dst)
# A_ij = 1 if j sends to i, plus self-loops; P = diag(d_in)^-1 A.
A = sp.csr_matrix((np.ones(len(src) + n), (np.concatenate([dst, np.arange(n)]), np.concatenate([src, np.arange(n)]))), shape=(n, n))
P = sp.diags(1.0 / np.asarray(A.sum(axis=1)).ravel()) @ A
t = time.time()
s = svds(P, k=2, return_singular_vectors=False, random_state=1)
print(f"{time.time() - t:.3f} {1 - sorted(s)[0]:.9f}")
PY
echo "| nodes | edges | asap-train graph gap s (whole process) | peak RSS MB | method | SciPy $SCIPY_VERSION svds s (solver only) | SciPy peak RSS MB | gap asap-train | gap SciPy | difference |"
echo "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|"
for n in $SIZES; do
  # The same graph for both: exported by asap-train (seed 1), read back by each.
  "$BIN" graph export --kind random:4 --nodes "$n" --seed 1 --out "$TMP/g.txt"
  /usr/bin/time -v "$BIN" graph gap --file "$TMP/g.txt" --json > "$TMP/ours.json" 2> "$TMP/ours.time"
  ours_s=$(grep "Elapsed (wall" "$TMP/ours.time" | awk '{print $NF}' | awk -F: '{ if (NF==3) print $1*3600+$2*60+$3; else print $1*60+$2 }')
  ours_rss=$(grep "Maximum resident" "$TMP/ours.time" | awk '{printf "%.0f", $NF/1024}')
  read -r ours_gap method edges < <(python3 -c "import json; r=json.load(open('$TMP/ours.json')); print(f\"{r['spectral_gap']:.9f}\", r['method'] + (f\" {r['iterations']} steps\" if r.get('iterations') else ''), r['edges'])" | awk '{print $1, $2"_"$3"_"$4, $NF}')
  if /usr/bin/time -v timeout "$SCIPY_LIMIT" "$VENV/bin/python" "$TMP/gap.py" "$TMP/g.txt" > "$TMP/scipy.out" 2> "$TMP/scipy.time"; then
    read -r sc_s sc_gap < "$TMP/scipy.out"
    sc_rss=$(grep "Maximum resident" "$TMP/scipy.time" | awk '{printf "%.0f", $NF/1024}')
    diff=$(python3 -c "print(f'{abs($ours_gap - $sc_gap):.1e}')")
  else
    sc_s="> $SCIPY_LIMIT (whole process)"; sc_gap="-"; diff="-"
    sc_rss=$(grep "Maximum resident" "$TMP/scipy.time" | awk '{printf "%.0f (at the limit)", $NF/1024}')
  fi
  echo "| $n | $edges | $ours_s | $ours_rss | ${method//_/ } | $sc_s | $sc_rss | $ours_gap | $sc_gap | $diff |"
done
echo
echo "graph gap --kind K --nodes $FAMILY_NODES (whole process)"
echo
echo "| kind | edges | seconds | peak RSS MB | method | spectral gap |"
echo "|---|---:|---:|---:|---|---:|"
for k in $FAMILIES; do
  /usr/bin/time -v "$BIN" graph gap --kind "$k" --nodes "$FAMILY_NODES" --json > "$TMP/fam.json" 2> "$TMP/fam.time"
  s=$(grep "Elapsed (wall" "$TMP/fam.time" | awk '{print $NF}' | awk -F: '{ if (NF==3) print $1*3600+$2*60+$3; else print $1*60+$2 }')
  rss=$(grep "Maximum resident" "$TMP/fam.time" | awk '{printf "%.0f", $NF/1024}')
  python3 -c "import json; r=json.load(open('$TMP/fam.json')); m=r['method'] + (f\" {r['iterations']} steps\" if r.get('iterations') else ''); print(f\"| $k | {r['edges']} | $s | $rss | {m} | {r['spectral_gap']:.3e} |\")"
done
echo
for n in $MIX_NODES; do
  echo "graph mix --nodes $n (kinds: exponential, one-peer-exponential, random:4, hypercube, root-expander, torus)"
  echo '```'
  "$BIN" graph mix --nodes "$n" --max-seconds "$MIX_SECONDS"
  echo '```'
done
echo
echo "machine: $(nproc) cores, load average $(cut -d' ' -f1-3 /proc/loadavg) at the end; $(date -u +%FT%TZ)"
