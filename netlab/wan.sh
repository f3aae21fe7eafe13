#!/usr/bin/env bash
# Real "hosts" on one machine: one network namespace per host, each group's ("data centre's")
# hosts on its own bridge, and the groups joined by a wide-area link with a rate and a one-way
# delay. mpirun runs on the first host and starts its daemons in the other namespaces
# (netlab/nsexec as its rsh agent); the ranks talk over TCP (pml ob1, btl tcp).
#
#   netlab/wan.sh check                   exit 0 if namespaces and tap devices can be made here,
#                                         3 (saying why) if not
#   netlab/wan.sh up G H RATE DELAY       G groups x H hosts, e.g. up 2 1 100mbit 50ms
#                                         RATE: Nmbit|Ngbit|Nkbit or none; DELAY: Nms|Nus|Ns (one
#                                         way). none + 0ms: one bridge for every host (the "LAN")
#   netlab/wan.sh hosts RATE/DELAY...     one host per RATE/DELAY, each behind a link of its own
#                                         to one switch, e.g. hosts 100mbit/1ms 100mbit/1ms
#                                         10mbit/1ms: host 2's link is 10x slower; a frame from
#                                         host a to host b takes a's DELAY plus b's and the slower
#                                         rate, and the senders to one host share its link
#   netlab/wan.sh run NP ARGS...          mpirun -n NP over the hosts (NP/(G*H) ranks per host,
#                                         consecutive ranks on one host), ARGS after `asap-train`
#   netlab/wan.sh ping FROM TO [N]        ICMP round trips from host FROM to host TO (JSON)
#   netlab/wan.sh bulk FROM TO MB         one TCP stream of MB MiB from host FROM to TO (JSON)
#   netlab/wan.sh stats                   the link's counters (JSON): the kernel's tap counters
#                                         per group, the relay's frames, bytes and drops, and
#                                         each host's TCP/ICMP counters
#   netlab/wan.sh down                    removes everything `up` made, by name
#
# The link: this kernel has no sch_netem (`tc qdisc add ... netem`: "Specified qdisc kind is
# unknown"), so the delay cannot come from tc. Instead the namespace gaia-NAME-sw holds one
# bridge per group; each bridge has a tap device whose other end is netlab/wanlink.py, a
# user-space relay that serialises each frame between groups at RATE, holds it DELAY and
# writes it into the destination group's tap (drop-tail beyond 2 x DELAY + 20 ms of backlog).
# Every directed pair of groups is one such link, shared by the hosts of the group.
#
# Names: namespaces gaia-NAME-h0.. (hosts) and gaia-NAME-sw (bridges, taps, relay); no
# interface is made outside them, so `down` is deleting those namespaces (and the relay, by
# its pid file). NETLAB_QUEUE_MS sets the relay's drop-tail buffer (default 2 x DELAY + 20 ms),
# NETLAB_IDLE_RESTART the hosts' net.ipv4.tcp_slow_start_after_idle (default 1, Linux's),
# NETLAB_TRACE a file for the relay's per-frame trace (wanlink.py --trace, written at `down`
# and on SIGUSR1), NETLAB_CC the hosts' TCP congestion control (default cubic, Linux's).
# NETLAB_NAME (default wan) and NETLAB_NET (default 10.77.0) let two set-ups
# coexist; NETLAB_EAGER (default 4194304) is Open MPI's TCP eager limit in bytes. Needs root (CAP_SYS_ADMIN, CAP_NET_ADMIN), iproute2, /dev/net/tun and python3.
# State (hostfile, host -> namespace map, relay pid, log and counters): $NETLAB_DIR
# (/tmp/netlab-NAME).
set -euo pipefail
NAME=${NETLAB_NAME:-wan}
NET=${NETLAB_NET:-10.77.0}
DIR=${NETLAB_DIR:-/tmp/netlab-$NAME}
HERE=$(cd "$(dirname "$0")" && pwd)
BIN=${BIN:-$HERE/../target/release/asap-train}
PY=${NETLAB_PYTHON:-/usr/bin/python3}
P=gaia-$NAME
[[ $NAME =~ ^[a-z0-9]{1,12}$ ]] || { echo "netlab: NETLAB_NAME must be 1-12 lower-case letters or digits, got $NAME" >&2; exit 2; }

fail3() { echo "netlab: $*" >&2; exit 3; }

check() {
    local probe="$P-probe" err
    command -v ip >/dev/null || fail3 "needs iproute2 (ip)"
    [[ -x $PY ]] || fail3 "needs $PY (the link relay, netlab/wanlink.py, is Python)"
    if ! err=$(ip netns add "$probe" 2>&1); then
        fail3 "network namespaces are not permitted here (ip netns add: $err); needs root with CAP_SYS_ADMIN and CAP_NET_ADMIN"
    fi
    if ! err=$(ip -n "$probe" tuntap add mode tap name t0 2>&1); then
        ip netns del "$probe"
        fail3 "tap devices cannot be made here (ip tuntap add: $err); the delayed link needs /dev/net/tun"
    fi
    if ! err=$(ip netns exec "$probe" "$PY" -c '
import fcntl, os, struct
fd = os.open("/dev/net/tun", os.O_RDWR)
fcntl.ioctl(fd, 0x400454CA, struct.pack("16sH", b"t0", 0x1002))' 2>&1); then
        ip netns del "$probe"
        fail3 "a tap device cannot be attached through /dev/net/tun ($err)"
    fi
    ip netns del "$probe"
}

# Mbit/s of a RATE (none: 0), milliseconds of a DELAY.
num() { # num X FACTOR: X * FACTOR, X a non-negative decimal number
    [[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]] || { echo "netlab: $1 is not a number" >&2; exit 2; }
    awk -v x="$1" -v f="$2" 'BEGIN {print x * f}'
}
mbit() {
    case $1 in
    none) echo 0 ;;
    *gbit) num "${1%gbit}" 1000 ;;
    *mbit) num "${1%mbit}" 1 ;;
    *kbit) num "${1%kbit}" 0.001 ;;
    *) echo "netlab: RATE must be like 100mbit, 1gbit, 500kbit or none, got $1" >&2; exit 2 ;;
    esac
}
msec() {
    case $1 in
    *ms) num "${1%ms}" 1 ;;
    *us) num "${1%us}" 0.001 ;;
    *s) num "${1%s}" 1000 ;;
    *) echo "netlab: DELAY must be like 50ms, 500us or 0.05s, got $1" >&2; exit 2 ;;
    esac
}

down() {
    if [[ -f $DIR/wanlink.pid ]]; then
        local pid
        pid=$(cat "$DIR/wanlink.pid")
        if grep -q wanlink.py "/proc/$pid/cmdline" 2>/dev/null; then
            kill "$pid" 2>/dev/null || true
            for _ in $(seq 50); do [[ -d /proc/$pid ]] || break; sleep 0.1; done
        fi
    fi
    # Processes still inside a host: a job its caller's timeout killed leaves Open MPI's daemon
    # on every other host running (it opens its own session, out of the timeout's reach) with
    # its ranks, which then spin on a link that is gone, for good (measured: 2 daemons and 4
    # ranks left from 2 timed-out jobs, 4 min later still running). TERM, then KILL.
    local nss pids sig
    nss=$(ip netns list 2>/dev/null | awk '{print $1}' | grep -E "^$P-(h[0-9]+|sw|probe)$" || true)
    inside() { for ns in $nss; do ip netns pids "$ns" 2>/dev/null; done; }
    for sig in TERM KILL; do
        pids=$(inside)
        [[ -n $pids ]] || break
        [[ $sig == KILL ]] && echo "netlab: killing what ignored TERM in $NAME's hosts: $pids" >&2
        kill -"$sig" $pids 2>/dev/null || true
        for _ in $(seq 30); do
            [[ -n $(inside) ]] || break
            sleep 0.1
        done
    done
    for ns in $nss; do
        ip netns del "$ns"
    done
    rm -rf "$DIR"
}

# With `hosts`: the relay's --uplink RATE_MBIT:DELAY_MS of each host, in host order (up's G
# groups of 1 host; empty for `up`).
UPLINKS=()

up() {
    local G=$1 H=$2 RATE=$3 DELAY=$4 rate delay
    rate=$(mbit "$RATE")
    delay=$(msec "$DELAY")
    check
    down
    mkdir -p "$DIR"
    local shaped=1 sw="$P-sw"
    if [[ $RATE == none && $delay == 0 ]] || ((G == 1)); then shaped=0; fi
    ((${#UPLINKS[@]} == 0)) || shaped=1
    ip netns add "$sw"
    ip -n "$sw" link set lo up
    local g
    for ((g = 0; g < (shaped ? G : 1); g++)); do
        ip -n "$sw" link add "b$g" type bridge
        ip -n "$sw" link set "b$g" up
        if ((shaped)); then
            ip -n "$sw" tuntap add mode tap name "t$g"
            ip -n "$sw" link set "t$g" master "b$g" up
        fi
    done
    local n=$((G * H)) h
    for ((h = 0; h < n; h++)); do
        local ns="$P-h$h" ip="$NET.$((11 + h))"
        ip netns add "$ns"
        ip -n "$ns" link add eth0 type veth peer name "v$h" netns "$sw"
        ip -n "$sw" link set "v$h" master "b$((shaped ? h / H : 0))" up
        ip -n "$ns" addr add "$ip/24" dev eth0
        ip -n "$ns" link set eth0 up
        ip -n "$ns" link set lo up
        # TCP windows large enough for the bandwidth-delay product (100 Mbit/s x 100 ms RTT =
        # 1.25 MB) with room: autotuning may grow to 32 MiB.
        ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_rmem="4096 131072 33554432" net.ipv4.tcp_wmem="4096 16384 33554432"
        # NETLAB_IDLE_RESTART=0: TCP keeps its congestion window across idle gaps (Linux's
        # default, 1, restarts slow start after an idle RTO, which a program that computes
        # between messages meets every round). benches/emulation-links.sh measures both.
        ip netns exec "$ns" sysctl -q -w net.ipv4.tcp_slow_start_after_idle="${NETLAB_IDLE_RESTART:-1}"
        # Congestion control: Linux's default, cubic, whatever this machine's is (a new
        # namespace inherits the host's: bbr here). Under bbr a connection that only ever
        # carried small messages learns a low bandwidth from its app-limited rounds and paces
        # its sends at ~2.9x that: on 2 hosts at 10 ms one way, rank 1's 31 KB asap message took
        # 8 ms to leave (`ss -tin`: bw 9.8 Mbit/s, pacing_rate 28 Mbit/s) while rank 0's, whose
        # connection had carried the data set, left at once (bw 96 Mbit/s). The program's
        # --emulate-fabric tcp models Linux's defaults. NETLAB_CC picks another. Set on the
        # route (congctl): a namespace may not set its default to an algorithm outside the
        # host's tcp_allowed_congestion_control ("Operation not permitted").
        ip -n "$ns" route replace "$NET.0/24" dev eth0 proto kernel scope link src "$ip" congctl "${NETLAB_CC:-cubic}"
        echo "$ip $ns $((h / H))" >> "$DIR/hosts"
    done
    if ((shaped)); then
        local taps=()
        for ((g = 0; g < G; g++)); do taps+=(--tap "t$g" ${UPLINKS[g]:+--uplink "${UPLINKS[g]}"}); done
        ((${#UPLINKS[@]} == 0)) || { rate=0; delay=0; }
        # The relay models the link, not a program on a loaded host: it runs under SCHED_FIFO
        # where permitted (else nice -10), so other jobs' CPU use does not stretch the delay
        # (at load ~100 with plain priority it fell up to 1.1 s behind). It blocks in select()
        # between frames, ~15 % of a core at 100 Mbit/s.
        # NETLAB_RELAY_PRIO=inherit keeps the caller's priority instead (e.g. under `nice -n 19`
        # on a machine whose other users must not be disturbed; then read the relay's lateness
        # counters in `stats`).
        local prio=(nice -n -10)
        chrt -f 20 true 2>/dev/null && prio=(chrt -f 20)
        [[ ${NETLAB_RELAY_PRIO:-} == inherit ]] && prio=()
        ip netns exec "$sw" "${prio[@]}" "$PY" "$HERE/wanlink.py" "${taps[@]}" --rate-mbit "$rate" --delay-ms "$delay" \
            ${NETLAB_QUEUE_MS:+--queue-ms "$NETLAB_QUEUE_MS"} ${NETLAB_TRACE:+--trace "$NETLAB_TRACE"} \
            --stats "$DIR/link.json" --ready "$DIR/wanlink.ready" > "$DIR/wanlink.log" 2>&1 &
        echo $! > "$DIR/wanlink.pid"
        for _ in $(seq 100); do [[ -f $DIR/wanlink.ready ]] && break; sleep 0.1; done
        [[ -f $DIR/wanlink.ready ]] || { cat "$DIR/wanlink.log" >&2; down; fail3 "the link relay did not start"; }
    fi
    if ((${#UPLINKS[@]} > 0)); then
        echo "hosts ${HOST_SPECS[*]}" > "$DIR/shape"
        echo "netlab: $G host(s) on $NET.0/24 ($P-h0..h$((n - 1))), each behind its own link (RATE/DELAY one way): ${HOST_SPECS[*]}" >&2
        return
    fi
    echo "$G $H $RATE $DELAY" > "$DIR/shape"
    echo "netlab: $G group(s) x $H host(s) on $NET.0/24 ($P-h0..h$((n - 1))), between groups: $RATE, $DELAY one way" >&2
}

# One host per RATE/DELAY, each behind a link of its own (wanlink.py's --uplink).
hosts() {
    (($# >= 2)) || { echo "netlab: hosts needs two RATE/DELAY or more (one per host), e.g. hosts 100mbit/1ms 10mbit/1ms" >&2; exit 2; }
    HOST_SPECS=("$@")
    local spec
    for spec in "$@"; do
        [[ $spec == */* ]] || { echo "netlab: a host's link is RATE/DELAY, e.g. 100mbit/1ms, got $spec" >&2; exit 2; }
        UPLINKS+=("$(mbit "${spec%%/*}"):$(msec "${spec#*/}")")
    done
    up "$#" 1 none 0ms
}

hostns() { # the namespace of host number $1
    [[ -f $DIR/hosts ]] || { echo "netlab: no set-up $NAME (run netlab/wan.sh up first)" >&2; exit 2; }
    local ns
    ns=$(awk -v i="$1" 'NR == i + 1 {print $2}' "$DIR/hosts")
    [[ -n $ns ]] || { echo "netlab: no host $1 in $DIR/hosts" >&2; exit 2; }
    echo "$ns"
}
hostip() { awk -v i="$1" 'NR == i + 1 {print $1}' "$DIR/hosts"; }

run() {
    local np=$1; shift
    local n per h0
    h0=$(hostns 0)
    n=$(wc -l < "$DIR/hosts")
    ((np % n == 0)) || { echo "netlab: $np ranks do not divide evenly over $n hosts" >&2; exit 2; }
    per=$((np / n))
    awk -v s="$per" '{print $1 " slots=" s}' "$DIR/hosts" > "$DIR/hostfile"
    export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 NETLAB_DIR="$DIR"
    # Messages up to EAGER bytes go eagerly (Open MPI's default is 64 KiB, above which a
    # rendezvous waits for the receiver to match the first fragment and the sender to be back
    # in MPI before the rest moves: our ranks poll between computing, so a 0.3 MB message per
    # clock crossed at ~45 % of the link. Measured, gaia MF 2 ranks over 100 Mbit/s, 0 ms, two
    # runs each: 3.59 / 3.67 s at 64 KiB, 1.64 / 1.61 s at 4 MiB; docs/gaia.md.)
    local EAGER=${NETLAB_EAGER:-4194304}
    # mpirun runs on host 0 (its namespace, its own host name), as on a cluster's first node;
    # the daemons connect back to it over the bridges. Ranks on different hosts use TCP only
    # (shared-memory transports would cross namespaces and bypass the link). One-sided traffic
    # goes through UCX (the program sets OMPI_MCA_osc=ucx), which finds its peers' shared
    # memory by the kernel's boot id, not the host name: left to itself it put ASAP's windows
    # across "hosts" through /dev/shm (measured: 20 rounds of 0.81 MB puts over a 100 Mbit/s
    # link in 0.31 s, 4x faster than the link can carry). UCX_TLS=tcp,self keeps it on eth0.
    # A launch that hangs is killed by its caller's timeout, and its sockets go with it (issue 27:
    # Open MPI's TCP connect between two namespace hosts refused, 3 times in 10 whole-suite runs
    # beside two CPU burners, each host counting one refused connect more than in a run that
    # works; the cause was host 1 starved of CPU, see the autogroups below). So every
    # NETLAB_SOCKETS_S seconds (default 30) while the job runs, each host's TCP
    # sockets with their owners (`ss -tanp`) replace $DIR/sockets.txt, which `stats` prints: the
    # listeners a hung job's ranks hold, and the state of the connect that failed.
    # (The watcher must not hold the caller's stdout or stderr, or a caller that reads them to
    # the end waits for it: a first version hung the test for 10 minutes. It ends with the job,
    # by the EXIT trap when the caller's timeout kills this script (`watcher` is global for it),
    # or at its next wake-up once `down` removed $DIR.)
    # Host 0's ranks run in this session; Open MPI's daemon on every other host opens its own
    # session, and where the kernel groups processes by session (autogroups), sessions share
    # the CPU by their group's nice, not the processes'. A caller whose group is raised (e.g.
    # a shell that ran benches/priority.sh before it restored it) starved the other hosts:
    # at -20 beside two burners, the other host's ranks had 0 s of CPU after 80 s (issue 27).
    # So the watcher below raises every other host's groups to this session's nice as their
    # processes appear (every 0.2 s). Before (until 2026-11-29), under benches/priority.sh at
    # load 3-6, host 1's rank of a 2-host ring allreduce (MLR, 1 ms one way) drifted 4-11 %
    # behind its declared steps and the ring, which waits for it at every step, took 1.10 s
    # where the same training with both hosts' ranks at nice 0 took 0.64 (docs/emulation.md).
    local ag raise=
    ag=$(cat /proc/self/autogroup 2>/dev/null) || ag=
    if [[ -n $ag && ${ag##* } != 0 && $(cat /proc/sys/kernel/sched_autogroup_enabled 2>/dev/null) == 1 ]]; then
        raise=${ag##* }
    fi
    local every=${NETLAB_SOCKETS_S:-30} rc=0
    (
        n=0
        while sleep 0.2; do
            [[ -d $DIR ]] || exit 0
            if [[ -n $raise ]]; then
                while read -r _ ns _; do
                    [[ $ns == "$h0" ]] && continue
                    for pid in $(ip netns pids "$ns" 2>/dev/null); do
                        g=$(cat "/proc/$pid/autogroup" 2>/dev/null) || continue
                        [[ ${g##* } == "$raise" ]] || echo "$raise" > "/proc/$pid/autogroup" 2>/dev/null || true
                    done
                done < "$DIR/hosts"
            fi
            (((n += 1) % (every * 5) == 0)) || continue
            { date -u +%T; while read -r ip ns _; do echo "== $ns ($ip)"; ip netns exec "$ns" ss -tanp; done < "$DIR/hosts"; } \
                > "$DIR/sockets.tmp" 2>&1 && mv -f "$DIR/sockets.tmp" "$DIR/sockets.txt"
        done
    ) > /dev/null 2>&1 < /dev/null &
    watcher=$!
    # `|| true`: under set -e a kill that finds the watcher already reaped fails the script
    # (exit 1 after a job that succeeded, in 1 of 2 runs before this).
    trap 'kill "$watcher" 2>/dev/null || true' EXIT
    ip netns exec "$h0" unshare --uts sh -c 'hostname "$0" && exec "$@"' "$h0" \
        mpirun --hostfile "$DIR/hostfile" -n "$np" --map-by slot \
        --mca plm_rsh_agent "$HERE/nsexec" --mca plm_rsh_no_tree_spawn 1 \
        --mca pml ob1 --mca btl tcp,self,vader \
        --mca btl_tcp_if_include "$NET.0/24" --mca oob_tcp_if_include "$NET.0/24" \
        --mca btl_tcp_eager_limit "$EAGER" --mca btl_tcp_rndv_eager_limit "$EAGER" --mca btl_tcp_max_send_size "$EAGER" \
        -x OMPI_MCA_mpi_yield_when_idle=1 -x PATH \
        -x UCX_TLS="${NETLAB_UCX_TLS:-tcp,self}" -x UCX_NET_DEVICES=eth0 \
        "$BIN" "$@" || rc=$?
    kill "$watcher" 2>/dev/null || true
    return "$rc"
}

stats() {
    local sw="$P-sw" pid
    [[ -f $DIR/shape ]] || { echo "netlab: no set-up $NAME" >&2; exit 2; }
    if [[ -f $DIR/wanlink.pid ]]; then
        pid=$(cat "$DIR/wanlink.pid")
        rm -f "$DIR/link.json"
        kill -USR1 "$pid"
        for _ in $(seq 50); do [[ -f $DIR/link.json ]] && break; sleep 0.1; done
    fi
    "$PY" - "$DIR" "$sw" <<'PY'
import json, os, subprocess, sys
d, sw = sys.argv[1], sys.argv[2]
def counter(dev, what):
    out = subprocess.run(["ip", "netns", "exec", sw, "cat", f"/sys/class/net/{dev}/statistics/{what}"],
                         capture_output=True, text=True)
    return int(out.stdout) if out.returncode == 0 else None
taps = []
g = 0
while (tx := counter(f"t{g}", "tx_bytes")) is not None:
    taps.append({"group": g, "out_bytes": tx, "in_bytes": counter(f"t{g}", "rx_bytes")})
    g += 1
relay = json.load(open(f"{d}/link.json")) if os.path.exists(f"{d}/link.json") else None
# Each host's kernel TCP/ICMP counters (its namespace's own, from zero at `up`): what a failed
# connect() met (refused: TcpAttemptFails with the peer's TcpOutRsts; unreachable: IcmpInDestUnreachs;
# SYNs sent again: TcpExtTCPSynRetrans), since Open MPI 4.1.4 prints a stale errno for it.
names = ["TcpActiveOpens", "TcpAttemptFails", "TcpOutRsts", "TcpEstabResets", "TcpRetransSegs",
         "TcpExtTCPSynRetrans", "TcpExtTCPTimeouts", "TcpExtListenDrops", "IcmpInDestUnreachs", "IcmpOutDestUnreachs"]
hosts = []
for line in open(f"{d}/hosts"):
    ip, ns, group = line.split()
    out = subprocess.run(["ip", "netns", "exec", ns, "nstat", "-azsj", *names], capture_output=True, text=True)
    kernel = json.loads(out.stdout).get("kernel") if out.returncode == 0 else None
    hosts.append({"host": ns, "ip": ip, "group": int(group), "kernel": kernel})
# The hosts' TCP sockets, as `run` last saw them (every NETLAB_SOCKETS_S s while its job ran).
sockets = open(f"{d}/sockets.txt").read().splitlines() if os.path.exists(f"{d}/sockets.txt") else None
print(json.dumps({"taps": taps, "relay": relay, "hosts": hosts, "sockets": sockets}))
PY
}

case ${1:-} in
check) check ;;
up) shift; [[ $# -eq 4 ]] || { echo "usage: netlab/wan.sh up GROUPS HOSTS_PER_GROUP RATE|none DELAY" >&2; exit 2; }; up "$@" ;;
hosts) shift; hosts "$@" ;;
run) shift; run "$@" ;;
ping) shift; ip netns exec "$(hostns "$1")" "$PY" "$HERE/probe.py" ping "$(hostip "$2")" "${3:-10}" ;;
bulk)
    shift
    to=$(hostns "$2")
    ip netns exec "$to" "$PY" "$HERE/probe.py" sink 5201 > "$DIR/sink.json" 2>/dev/null &
    sink=$!
    sleep 0.5
    ip netns exec "$(hostns "$1")" "$PY" "$HERE/probe.py" bulk "$(hostip "$2")" 5201 "$3"
    wait "$sink"
    cat "$DIR/sink.json" ;;
stats) stats ;;
down) down ;;
*) echo "usage: netlab/wan.sh check | up G H RATE DELAY | hosts RATE/DELAY... | run NP ARGS... | ping FROM TO [N] | bulk FROM TO MB | stats | down" >&2; exit 2 ;;
esac
