#!/usr/bin/env bash
# Real "hosts" on one machine: one network namespace per host, joined by veth pairs to a bridge,
# with the links between groups ("data centres") shaped by tc netem (rate and one-way delay) and
# the links inside a group left alone. mpirun then starts its daemons inside the namespaces
# (netlab/nsexec as its rsh agent) and the ranks talk over TCP (pml ob1, btl tcp).
#
#   netlab/wan.sh check                   exit 0 if namespaces can be made here, 3 (with why) if not
#   netlab/wan.sh up G H RATE DELAY       G groups x H hosts, e.g. up 2 1 100mbit 50ms
#                                         (RATE none: no shaping, the "LAN" baseline)
#   netlab/wan.sh run NP ARGS...          mpirun -n NP over the hosts (NP/(G*H) ranks per host,
#                                         consecutive ranks on one host), ARGS after `asap-train`
#   netlab/wan.sh down                    removes everything `up` made, by name
#
# NETLAB_NAME (default awan, at most 6 characters: interface names are short) and NETLAB_NET
# (default 10.77.0) let two set-ups coexist. Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN), iproute2
# and tc. The hostfile and the host -> namespace map are in $NETLAB_DIR (/tmp/netlab-NAME).
set -euo pipefail
NAME=${NETLAB_NAME:-awan}
NET=${NETLAB_NET:-10.77.0}
DIR=${NETLAB_DIR:-/tmp/netlab-$NAME}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-$HERE/../target/release/asap-train}
[[ ${#NAME} -le 6 ]] || { echo "netlab: NETLAB_NAME must be at most 6 characters, got $NAME" >&2; exit 2; }

check() {
    local probe="$NAME-probe" err
    command -v ip >/dev/null && command -v tc >/dev/null || { echo "netlab: needs iproute2 (ip, tc)" >&2; exit 3; }
    if ! err=$(ip netns add "$probe" 2>&1); then
        echo "netlab: network namespaces are not permitted here (ip netns add: $err); needs root with CAP_SYS_ADMIN and CAP_NET_ADMIN" >&2
        exit 3
    fi
    if ! err=$(ip netns exec "$probe" tc qdisc add dev lo root handle 1: htb 2>&1); then
        ip netns del "$probe"
        echo "netlab: tc htb (rate shaping) is not available here ($err)" >&2
        exit 3
    fi
    NETEM=1
    ip netns exec "$probe" tc qdisc add dev lo parent 1:1 netem delay 1ms >/dev/null 2>&1 ||
        ip netns exec "$probe" tc qdisc replace dev lo root netem delay 1ms >/dev/null 2>&1 || NETEM=0
    ip netns del "$probe"
}

down() {
    for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$NAME-h[0-9]+$" || true); do
        ip netns del "$ns"
    done
    ip link del "$NAME-br" 2>/dev/null || true
    for l in $(ip -o link show 2>/dev/null | awk -F': ' '{print $2}' | cut -d@ -f1 | grep -E "^$NAME-v[0-9]+$" || true); do
        ip link del "$l" 2>/dev/null || true
    done
    rm -rf "$DIR"
}

up() {
    local G=$1 H=$2 RATE=$3 DELAY=$4
    check
    if [[ $NETEM == 0 && ! $DELAY =~ ^0+(ms|us|s)?$ ]]; then
        echo "netlab: this kernel has no tc netem (sch_netem), so a delay of $DELAY cannot be shaped;" \
             "use DELAY 0ms (rate only, by htb) and add latency in the program (--emulate-latency)" >&2
        exit 3
    fi
    down
    mkdir -p "$DIR"
    ip link add "$NAME-br" type bridge
    ip addr add "$NET.1/24" dev "$NAME-br"
    ip link set "$NAME-br" up
    local n=$((G * H)) h
    for ((h = 0; h < n; h++)); do
        local ns="$NAME-h$h" ip="$NET.$((11 + h))"
        ip netns add "$ns"
        ip link add "$NAME-v$h" type veth peer name eth0 netns "$ns"
        ip link set "$NAME-v$h" master "$NAME-br" up
        ip -n "$ns" addr add "$ip/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        echo "$ip $ns $((h / H))" >> "$DIR/hosts"
    done
    # Shaping: every host's egress to hosts of other groups goes through an htb class of RATE
    # (chosen by destination address; with netem, DELAY is added under it); everything else is
    # unclassified, which htb sends on unshaped.
    if [[ $RATE != none ]]; then
        for ((h = 0; h < n; h++)); do
            local ns="$NAME-h$h" o
            ip netns exec "$ns" tc qdisc add dev eth0 root handle 1: htb r2q 1000
            ip netns exec "$ns" tc class add dev eth0 parent 1: classid 1:30 htb rate "$RATE" ceil "$RATE"
            if [[ $NETEM == 1 ]]; then
                ip netns exec "$ns" tc qdisc add dev eth0 parent 1:30 handle 30: netem delay "$DELAY" limit 100000
            fi
            for ((o = 0; o < n; o++)); do
                if ((o / H != h / H)); then
                    ip netns exec "$ns" tc filter add dev eth0 parent 1: protocol ip prio 1 u32 match ip dst "$NET.$((11 + o))/32" flowid 1:30
                fi
            done
        done
    fi
    echo "$G $H $RATE $DELAY" > "$DIR/shape"
    echo "netlab: $G group(s) x $H host(s) on $NET.0/24, between groups: $RATE, $DELAY one way" >&2
}

run() {
    local np=$1; shift
    [[ -f $DIR/hosts ]] || { echo "netlab: no set-up $NAME (run netlab/wan.sh up first)" >&2; exit 2; }
    local n per
    n=$(wc -l < "$DIR/hosts")
    ((np % n == 0)) || { echo "netlab: $np ranks do not divide evenly over $n hosts" >&2; exit 2; }
    per=$((np / n))
    awk -v s="$per" '{print $1 " slots=" s}' "$DIR/hosts" > "$DIR/hostfile"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NETLAB_DIR="$DIR"
    # The daemons connect back to mpirun over the bridge; ranks on different hosts use TCP only
    # (UCX's shared-memory transports would cross namespaces and bypass the shaped links).
    mpirun --hostfile "$DIR/hostfile" -n "$np" --map-by slot \
        --mca plm_rsh_agent "$HERE/nsexec" --mca plm_rsh_no_tree_spawn 1 \
        --mca pml ob1 --mca btl tcp,self,vader \
        --mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24" \
        -x OMPI_MCA_mpi_yield_when_idle=1 -x PATH \
        "$BIN" "$@"
}

case ${1:-} in
check) check ;;
up) shift; [[ $# -eq 4 ]] || { echo "usage: netlab/wan.sh up GROUPS HOSTS_PER_GROUP RATE|none DELAY" >&2; exit 2; }; up "$@" ;;
run) shift; run "$@" ;;
down) down ;;
*) echo "usage: netlab/wan.sh check | up G H RATE DELAY | run NP ARGS... | down" >&2; exit 2 ;;
esac
