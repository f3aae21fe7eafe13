#!/usr/bin/env bash
# A real single-node Slurm cluster (munge + slurmctld + slurmd) in a private directory, without
# systemd, for trying the batch scripts and for the Slurm integration test. Needs root and the
# packages slurm-wlm slurmctld slurmd slurm-client munge (make deps installs them).
#   slurm/local-cluster.sh start DIR   -> prints "export SLURM_CONF=DIR/slurm.conf"
#   slurm/local-cluster.sh stop DIR
# Exit status of start: 0 up; 77 the machine cannot run it (not root, packages missing, a daemon
# refused by the system: permissions, address in use), with the reason on stderr, so tests can
# skip; 1 anything else (e.g. a bad slurm.conf from this script: a real failure).
set -euo pipefail
cmd=${1:?usage: local-cluster.sh start|stop DIR}
dir=$(realpath -m "${2:?usage: local-cluster.sh start|stop DIR}")
cpus=$(nproc)

stop() {
    for f in slurmd slurmctld munged; do
        if [ -f "$dir/$f.pid" ]; then
            kill "$(cat "$dir/$f.pid")" 2>/dev/null || true
            rm -f "$dir/$f.pid"
        fi
    done
}

case "$cmd" in
stop) stop; exit 0 ;;
start) ;;
*) echo "unknown command $cmd (start|stop)" >&2; exit 2 ;;
esac

# The machine, not this script: say why and exit 77.
unusable() {
    echo "local-cluster: cannot start Slurm here: $*" >&2
    stop
    exit 77
}
# A daemon failed: environmental if its log or output blames the system, else a real failure.
failed() {
    local what=$1 log=$2
    if grep -qiE 'permission denied|operation not permitted|address already in use|cannot assign requested address|read-only file system' "$log" 2>/dev/null; then
        unusable "$what failed: $(grep -iE 'permission denied|operation not permitted|address already in use|cannot assign|read-only' "$log" | tail -1)"
    fi
    echo "local-cluster: $what failed; its log ($log):" >&2
    tail -20 "$log" >&2 2>/dev/null || true
    stop
    exit 1
}
[ "$(id -u)" = 0 ] || unusable "needs root (munged and slurmd run as root in this set-up)"
for c in mungekey munged slurmctld slurmd sinfo sbatch srun; do
    command -v "$c" >/dev/null || unusable "$c not found (apt-get install slurm-wlm slurmctld slurmd slurm-client munge, or make deps)"
done

mkdir -p "$dir"/{state,spool,log} || unusable "cannot create $dir"
[ -f "$dir/munge.key" ] || mungekey --create --keyfile="$dir/munge.key" 2>"$dir/log/mungekey.err" || failed mungekey "$dir/log/mungekey.err"
chmod 600 "$dir/munge.key"
munged --force --key-file="$dir/munge.key" --socket="$dir/munge.socket" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munged.seed" \
    2>"$dir/log/munged.err" || { cat "$dir/munged.log" >>"$dir/log/munged.err" 2>/dev/null; failed munged "$dir/log/munged.err"; }

cat > "$dir/slurm.conf" <<CONF
ClusterName=asaplocal
SlurmctldHost=localhost
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge.socket
CredType=cred/munge
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
SlurmctldPort=$((16817 + RANDOM % 1000))
SlurmdPort=$((17818 + RANDOM % 1000))
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SchedulerType=sched/backfill
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
MpiDefault=none
ReturnToService=2
NodeName=localhost CPUs=$cpus State=UNKNOWN
PartitionName=debug Nodes=localhost Default=YES OverSubscribe=FORCE:8 MaxTime=INFINITE State=UP
CONF

export SLURM_CONF="$dir/slurm.conf"
slurmctld -f "$SLURM_CONF" 2>>"$dir/log/slurmctld.log" || failed slurmctld "$dir/log/slurmctld.log"
slurmd -f "$SLURM_CONF" -N localhost 2>>"$dir/log/slurmd.log" || failed slurmd "$dir/log/slurmd.log"
for _ in $(seq 1 50); do
    if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed)'; then
        echo "export SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    sleep 0.2
done
# The daemons started but the node never became usable: a daemon that died after forking is
# judged by its log like one that failed at once.
for d in slurmctld slurmd; do
    if ! { [ -f "$dir/$d.pid" ] && kill -0 "$(cat "$dir/$d.pid")" 2>/dev/null; }; then
        failed "$d (exited after start)" "$dir/log/$d.log"
    fi
done
echo "local-cluster: slurm did not come up in 10 s; logs in $dir/log" >&2
tail -5 "$dir/log/slurmctld.log" "$dir/log/slurmd.log" >&2 2>/dev/null || true
stop
exit 1
