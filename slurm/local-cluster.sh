#!/usr/bin/env bash
# A real single-node Slurm cluster (munge + slurmctld + slurmd) in a private directory, without
# systemd, for trying the batch scripts and for the Slurm integration test. Needs root and the
# packages slurm-wlm slurmctld slurmd slurm-client munge (make deps installs them).
#   slurm/local-cluster.sh start DIR   -> prints "export SLURM_CONF=DIR/slurm.conf"
#   slurm/local-cluster.sh stop DIR
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

mkdir -p "$dir"/{state,spool,log}
[ -f "$dir/munge.key" ] || mungekey --create --keyfile="$dir/munge.key"
chmod 600 "$dir/munge.key"
munged --force --key-file="$dir/munge.key" --socket="$dir/munge.socket" \
    --pid-file="$dir/munged.pid" --log-file="$dir/munged.log" --seed-file="$dir/munged.seed"

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
slurmctld -f "$SLURM_CONF"
slurmd -f "$SLURM_CONF" -N localhost
for _ in $(seq 1 50); do
    if sinfo -h -o '%T' 2>/dev/null | grep -qE '^(idle|mixed)'; then
        echo "export SLURM_CONF=$SLURM_CONF"
        exit 0
    fi
    sleep 0.2
done
echo "slurm did not come up; logs in $dir/log" >&2
stop
exit 1
