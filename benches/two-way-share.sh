#!/usr/bin/env bash
# What each direction of a real netlab link carries when both carry data at once (issue 41 item
# 4; `--emulate-fabric tcp`'s two-way share, src/comm/pace.rs TCP_TWO_WAY_SHARE_*): one training
# run over 2 netlab hosts with the relay's per-frame trace (NETLAB_TRACE), then
# benches/two_way_share.py on the trace. The shares in the code were measured with MODE
# allreduce and asap-p2p at DELAY 1ms and 10ms (2026-11-29, docs/emulation.md "Two-way traffic").
#
# Environment: MODE [asap-p2p; allreduce, ssp, gaia, bosen as benches/emulation-links.sh],
# RATE [100mbit], DELAY [10ms], ROUNDS [10], HIDDEN [1024: 3.3 MB a message], NETLAB_CC [cubic],
# NETLAB_NAME [tw], NETLAB_NET [10.88.0], BIN [target/release/asap-train]. The trace and the
# run's output go to runs/two-way-share-TIME/.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${MODE:-asap-p2p} RATE=${RATE:-100mbit} DELAY=${DELAY:-10ms} ROUNDS=${ROUNDS:-10} HIDDEN=${HIDDEN:-1024}
export NETLAB_NAME=${NETLAB_NAME:-tw} NETLAB_NET=${NETLAB_NET:-10.88.0} BIN=${BIN:-$PWD/target/release/asap-train}
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
[[ $RATE =~ ^[0-9]+mbit$ ]] || { echo "RATE must be Nmbit" >&2; exit 2; }
case $MODE in
allreduce) a=(--sync allreduce) ;;
asap-p2p) a=(--sync asap --transport p2p) ;;
ssp) a=(--sync ssp) ;;
bosen) a=(--sync bosen --bandwidth-mbps "$(awk -v r="${RATE%mbit}" 'BEGIN {print r * 0.9}')") ;;
gaia) a=(--sync gaia --groups 2) ;;
*) echo "MODE must be allreduce, asap-p2p, ssp, bosen or gaia" >&2; exit 2 ;;
esac
out=runs/two-way-share-$(date +%H%M%S)
mkdir -p "$out"
trap 'netlab/wan.sh down >/dev/null 2>&1 || true' EXIT
datasets/prepare.sh >/dev/null
NETLAB_TRACE=$PWD/$out/trace.txt netlab/wan.sh up 2 1 "$RATE" "$DELAY" >/dev/null
netlab/wan.sh run 2 "${a[@]}" --model mlp --hidden "$HIDDEN" --batch-size 64 --lr 0.1 --epochs 100 \
    --max-rounds "$ROUNDS" --eval-every 100000 --emulate-compute 10 > "$out/run.log" 2>&1
netlab/wan.sh down >/dev/null   # writes the trace
echo "# $MODE, $RATE, $DELAY one way, ${NETLAB_CC:-cubic}, $ROUNDS rounds; $out"
benches/two_way_share.py "$out/trace.txt" "${RATE%mbit}"
