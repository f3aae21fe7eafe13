#!/usr/bin/env bash
# The uneven-links table and the WAN rows on real netlab links, beside their emulated twins, with
# the tuned baselines (issue 41 item 6; docs/emulation.md, "Real links against their twins").
#
#   benches/uneven-real.sh links   8 netlab hosts of one rank (netlab/wan.sh hosts), ranks 0-1
#                                  behind 1/10 of the others' rate: clusters/1gbe-2slow.toml
#   benches/uneven-real.sh wan     2 groups of 4 hosts (netlab/wan.sh up 2 4), the groups joined
#                                  by one WAN link: clusters/wan-2dc.toml
#
# Both sides run the same training with the same declared step (--emulate-compute), so only the
# link differs: "real" over netlab's hosts (Open MPI over TCP through the relay), "emulated" on
# shared memory with the same links declared (--emulate-bandwidth, --emulate-latency). Every rate
# is the profile's divided by SCALE, every step and latency multiplied by it: the emulated
# tables' own dilation (8), which also keeps the relay inside what it carries (measured first:
# `netlab/wan.sh bulk`, printed). netlab adds the sender's and the receiver's DELAY, the model
# takes the longer end's latency, so each host's DELAY is half the declared one (links); the WAN
# link's delay is the declared one (wan: the two groups' link, one way).
#
# links: the slow ranks are 6 and 7, not the profile's 0 and 1: mpirun and rank 0 sit on host
# 0, and behind a slow link the launch alone took 195-295 s (Open MPI's start-up traffic through
# a 12.5 Mbit/s link with a 20 ms queue: 14,395 frames dropped), against 1.8 s on a fast host.
# The graphs and the ring are symmetric under the shift. Every rank's own model is not scored
# (--own-models 1): gathering 8 replicas of 3.3 MB over the slow links took 39-63 s an
# evaluation. The emulated profile gives every rank its own link; netlab's hosts too, and senders to
# one host share its link, as the model's receiver link does. wan: netlab's hosts in a group
# share one bridge and only traffic between the groups crosses the WAN, shared by the group's
# hosts; the twin declares the same groups (--emulate-groups 2: a LAN within a group, one WAN
# link per direction shared by the sending group's ranks; LINK_GROUPS=off gives every rank its own
# WAN link for every pair, the twin before 2026-11-29; docs/emulation.md). FABRIC=tcp adds
# TCP's slow start per path to the twin.
#
# Rows at every --sync-every in INTERVALS (the tuned baselines of issue 40: the same grid for
# every row), REPS runs alternating real and emulated. Time = training seconds until the
# averaged model (the replicas' average) reaches TARGET (TARGET_ON), evaluated about every
# EVAL_EVERY steps, the run stopped there. Tables: each side's by benches/emulated-table.py (the
# emulated runs' validity; the real runs declare their steps too and report theirs), and the two
# side by side (benches/uneven_real.py).
#
# Environment: REPS [3], INTERVALS [links "4 16", wan "16 64"], ONLY (regex on row names), SCALE
# [8], TARGET [links 0.80, wan 0.85], PARTITION [iid; e.g. by-label:2, shards of two classes
# each, where the target needs communication: `--sync none` stays at 33 %], EPOCHS [links 10,
# wan 6], EVAL_EVERY [10], SIDES ["real emulated"], FABRIC [ideal: the emulated side's
# --emulate-fabric; tcp adds TCP's costs, slow start among them], LINK_GROUPS [wan: 2, the
# twin's --emulate-groups: each group's ranks share one WAN link, as netlab's do; off: every
# rank its own WAN link for every pair, the twin before 2026-11-29], BIN
# [target/release/asap-train]. The emulated ranks run at nice -20 and this
# session's autogroup raised (benches/priority.sh); the real runs under setsid (a session at
# nice 0, as the other hosts' daemons: netlab/wan.sh run says why), the relay at nice -20.
set -euo pipefail
cd "$(dirname "$0")/.."
WHAT=${1:-links}
REPS=${REPS:-3} SCALE=${SCALE:-8} EVAL_EVERY=${EVAL_EVERY:-10} SIDES=${SIDES:-real emulated} FABRIC=${FABRIC:-ideal} LINK_GROUPS=${LINK_GROUPS:-2}
source benches/netlab-lib.sh
netlab_bench "uneven-$WHAT" hu 10.86.0
source benches/priority.sh
# The set-up is taken down only by a run that made it (an emulated-only run beside a real one
# of the same name took the real one's hosts away mid-run).
trap 'priority_restore; if [[ $SIDES == *real* ]]; then netlab/wan.sh down >/dev/null 2>&1 || true; fi; rm -f "$BIN"' EXIT
f() { awk "BEGIN {printf \"%g\", $1}"; }   # an expression's value, as netlab and the flags take it

case $WHAT in
links)
    INTERVALS=${INTERVALS:-4 16} TARGET=${TARGET:-0.80} EPOCHS=${EPOCHS:-10}
    fast=$(f "1000 / $SCALE") slow=$(f "100 / $SCALE") lat=$(f "0.05 * $SCALE")
    step=$(f "24.223 * $SCALE")   # clusters/1gbe-2slow.toml's mlp-1024:256 step
    specs=()
    for h in 0 1 2 3 4 5 6 7; do
        ((h >= 6)) && r=$slow || r=$fast
        specs+=("${r}mbit/$(f "$lat / 2")ms")
    done
    setup=(hosts "${specs[@]}")
    # The relay's drop-tail queue in time, scaled as the rates are: 20 ms (netlab's default for
    # a short link) x SCALE, the same bytes on a slow link as a 100 Mbit/s port's 20 ms holds.
    # (wan: netlab's default, 2 x DELAY + 20 ms, already grows with the scaled delay.)
    export NETLAB_QUEUE_MS=${NETLAB_QUEUE_MS:-$(f "20 * $SCALE")}
    emu=(--emulate-bandwidth "$fast,6-7:$slow" --emulate-latency "$lat" --emulate-fabric "$FABRIC")
    variants=(
        "allreduce|--sync allreduce --allreduce-algorithm auto"
        "allreduce diloco|--sync allreduce --allreduce-algorithm auto --outer-optimizer nesterov"
        "asap deadline p2p|--sync asap --notify deadline --transport p2p"
        # no communication: the averaged model (the evaluation averages the replicas, outside
        # the training time) at the first interval that reaches the target without any sync
        "none|--sync none"
        "asap deadline rma|--sync asap --notify deadline --transport rma"
        "asap noloco p2p|--sync asap --graph one-peer-exponential --outer-optimizer nesterov --transport p2p"
        # 8 bits a value with error feedback (issue 40's codec): the slow links carry a quarter
        "allreduce int8|--sync allreduce --allreduce-algorithm auto --compress int8"
        "asap int8 p2p|--sync asap --compress int8 --transport p2p"
    )
    ;;
wan)
    INTERVALS=${INTERVALS:-16 64} TARGET=${TARGET:-0.85} EPOCHS=${EPOCHS:-6}
    rate=$(f "100 / $SCALE") lat=$(f "50 * $SCALE") step=$(f "24.223 * $SCALE")
    setup=(up 2 4 "${rate}mbit" "${lat}ms")
    emu=(--emulate-bandwidth "$rate" --emulate-latency "$lat" --emulate-fabric "$FABRIC" --emulate-groups "$LINK_GROUPS")
    # The groups' LAN: wan-2dc's 10 GbE and 15 us, scaled (netlab's bridge is unshaped).
    [[ $LINK_GROUPS != off ]] && emu+=(--emulate-lan-bandwidth "$(f "10000 / $SCALE")" --emulate-lan-latency "$(f "0.015 * $SCALE")")
    variants=(
        "allreduce|--sync allreduce --allreduce-algorithm auto"
        "allreduce diloco|--sync allreduce --allreduce-algorithm auto --outer-optimizer nesterov"
        "asap noloco p2p|--sync asap --graph one-peer-exponential --outer-optimizer nesterov --transport p2p"
        "gaia 1%|--sync gaia --groups 2 --significance 0.01"
    )
    ;;
*) echo "usage: $0 links|wan" >&2; exit 2 ;;
esac
common=(--model mlp --hidden 1024 --batch-size 256 --lr 0.3 --emulate-compute "$step" --partition "${PARTITION:-iid}"
    --epochs "$EPOCHS" --own-models 1 --target "$TARGET" --target-on averaged --stop-at-target)

# The emulated side alone (SIDES=emulated) needs no netlab hosts.
[[ $SIDES == *real* ]] && nice -n -20 netlab/wan.sh "${setup[@]}" >/dev/null 2>&1
echo "# $WHAT: 8 ranks, scale 1/$SCALE (netlab/wan.sh ${setup[*]}; emulated ${emu[*]}), step $step ms, ${PARTITION:-iid} shards, target $TARGET on the averaged model, $REPS runs per row"
echo "# $(date -u '+%Y-%m-%d %H:%M UTC'), load $(cut -d' ' -f1-3 /proc/loadavg), binary $(git rev-parse --short HEAD)"
if [[ $SIDES != *real* ]]; then
    :
elif [[ $WHAT == links ]]; then
    echo "# bulk TCP through the relay, fast host 2 -> 3: $(netlab/wan.sh bulk 2 3 8); slow host 6 -> 2: $(netlab/wan.sh bulk 6 2 2)"
else
    echo "# bulk TCP through the relay, group 0 -> group 1 (host 0 -> 4): $(netlab/wan.sh bulk 0 4 2)"
fi

rows=()
for v in "${variants[@]}"; do
    for k in $INTERVALS; do
        name="${v%%|*}, k $k"
        rows+=("$name")
        [[ -n ${ONLY:-} && ! $name =~ $ONLY ]] && continue
        ev=$((EVAL_EVERY / k > 0 ? EVAL_EVERY / k : 1))
        read -ra args <<< "${v#*|} --sync-every $k --eval-every $ev"
        for rep in $(seq "$REPS"); do
            for side in $SIDES; do
                mkdir -p "$out/$side"
                stem="$out/$side/$(echo "$name" | tr ' /' '__')-$rep"
                if [[ $side == real ]]; then
                    setsid -w netlab/wan.sh run 8 train "${common[@]}" "${args[@]}" --metrics "$stem.jsonl" > "$stem.log" 2>&1 || rc=$?
                    netlab/wan.sh stats > "$stem.link.json" 2>/dev/null || true
                else
                    nice -n -20 mpirun -n 8 "$BIN" train "${common[@]}" "${emu[@]}" "${args[@]}" --metrics "$stem.jsonl" > "$stem.log" 2>&1 || rc=$?
                fi
                if [[ ${rc:-0} != 0 ]]; then echo "run $name #$rep ($side) failed: see $stem.log" >&2; touch "$stem.failed"; fi
                unset rc
            done
        done
    done
done
export TARGET_ON=averaged
for side in $SIDES; do
    echo; echo "## $side"; echo
    python3 benches/emulated-table.py "$out/$side" "$REPS" "${rows[@]}"
done
echo
python3 benches/uneven_real.py "$out" "$REPS" "${rows[@]}"
echo "# $(date -u '+%H:%M UTC'), load at the end $(cut -d' ' -f1-3 /proc/loadavg); runs in $out"
