#!/usr/bin/env bash
# Behaviour unchanged (issue 39): the same seeded jobs, run by two binaries, must give
# byte-identical saved models, the same checkpoint file names and the same metrics keys.
#
#   benches/same-models.sh REF_BIN NEW_BIN [JOB...]
#
# REF_BIN is the binary of the commit to compare with (e.g. main's, copied aside before a
# refactor); NEW_BIN the one under test. Without JOB names every job below runs. Each job is a
# deterministic setting of its mode (the ones tests/preempt.rs holds to bit-identical resumes):
# - ssp at staleness 0 with each apply rule (DynSGD is its default), and bosen (a budget no clock
#   exhausts, with and without AdaRevision).
#   Not bosen --compress fp16 (--fp16 before issue 40): a value's rounding error waits in the buffer for a later push, early ones
#   included, whose timing varies; main's binary against itself differed in 2,465-2,539 of 7,850
#   values (7,647-7,691 with AdaRevision) in 6 of 6 runs on a loaded machine (it matched once,
#   idle). The fp16 bits themselves are checked by src/sync/codec/fp16.rs's tests;
# - asap's edge budget at 1 Mbit/s: every step lasts 60 ms (--emulate-compute), longer than the
#   40 ms the token bucket takes to refill, so every round's allowance is the full bucket and the
#   rows each message carries do not depend on timing;
# - gaia with two groups meeting every clock (DS = 0). (With --gaia-inner asap two runs of one binary differed in every value: not a deterministic setting.)
# Prints one line per job and exits 1 if any differs.
set -euo pipefail
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
ref=${1:?usage: benches/same-models.sh REF_BIN NEW_BIN [JOB...]}
new=${2:?usage: benches/same-models.sh REF_BIN NEW_BIN [JOB...]}
shift 2
data=/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz
[ -r "$data" ] || { echo "same-models: $data is missing: make deps installs dataset-fashion-mnist" >&2; exit 1; }

declare -A jobs=(
    [ssp]="2 --sync ssp --staleness 0"
    [ssp-consgd]="2 --sync ssp --staleness 0 --apply consgd"
    [ssp-plain]="3 --sync ssp --staleness 0 --apply plain"
    [bosen]="2 --sync bosen --staleness 0 --bandwidth-mbps 1e7"
    [bosen-adarevision]="2 --sync bosen --staleness 0 --bandwidth-mbps 1e7 --lr-schedule adarevision --lr 0.05"
    [asap-edge-budget]="2 --sync asap --graph ring --bandwidth-mbps 1 --emulate-compute 60 --epochs 1"
    [asap-edge-budget-absolute]="3 --sync asap --graph ring --bandwidth-mbps 1 --priority absolute --emulate-compute 60 --epochs 1"
    [gaia]="4 --sync gaia --groups 2 --significance 0.02 --dc-staleness 0"
)
names=("$@")
[ ${#names[@]} -gt 0 ] || names=(ssp ssp-consgd ssp-plain bosen bosen-adarevision asap-edge-budget asap-edge-budget-absolute gaia)

out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
failed=0
for name in "${names[@]}"; do
    spec=${jobs[$name]:?unknown job $name (known: ${!jobs[*]})}
    read -r np args <<< "$spec"
    # Two epochs unless the job names its own.
    [[ " $args " == *" --epochs "* ]] || args="--epochs 2 $args"
    for side in ref new; do
        bin=$ref; [ $side = new ] && bin=$new
        d=$out/$name-$side; mkdir -p "$d"
        # A checkpoint every 50 rounds.
        # shellcheck disable=SC2086
        if ! mpirun -n "$np" "$bin" train --data "$data" --seed 7 --eval-every 1000000 \
                $args --save-model "$d/model.h5" --metrics "$d/m.jsonl" \
                --checkpoint-dir "$d/ck" --checkpoint-every 50 > "$d/log" 2>&1; then
            echo "$name: the $side binary failed: $(tail -3 "$d/log")"; failed=1; continue 2
        fi
    done
    if verdict=$(/usr/bin/python3 - "$out/$name-ref" "$out/$name-new" <<'PY'
import h5py, json, os, sys
a, b = sys.argv[1], sys.argv[2]
why = []
pa = h5py.File(f"{a}/model.h5", "r")["params"][()]
pb = h5py.File(f"{b}/model.h5", "r")["params"][()]
if pa.tobytes() != pb.tobytes():
    why.append(f"models differ ({(pa != pb).sum()} of {pa.size} values)")
def keys(d):
    out = set()
    for l in open(f"{d}/m.jsonl"):
        e = json.loads(l)
        def walk(p, v):
            out.add(p)
            if isinstance(v, dict):
                for k, w in v.items():
                    walk(f"{p}.{k}", w)
        walk(e["event"], e)
    return out
ka, kb = keys(a), keys(b)
if ka != kb:
    why.append(f"metrics keys differ: only ref {sorted(ka - kb)[:8]}, only new {sorted(kb - ka)[:8]}")
ca = sorted(os.listdir(f"{a}/ck")) if os.path.isdir(f"{a}/ck") else []
cb = sorted(os.listdir(f"{b}/ck")) if os.path.isdir(f"{b}/ck") else []
if ca != cb:
    why.append(f"checkpoint names differ: {ca} vs {cb}")
print("; ".join(why) if why else f"same ({pa.size} values, {len(ka)} metrics keys, checkpoints {ca})")
sys.exit(1 if why else 0)
PY
    ); then echo "$name: $verdict"; else echo "$name: DIFFERS: $verdict"; failed=1; fi
done
exit $failed
