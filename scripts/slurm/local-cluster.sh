#!/usr/bin/env bash
# A private one-node Slurm cluster for trying the batch scripts on one machine (and for the
# integration test): its own munge daemon and key, slurmctld and slurmd with a configuration,
# state and logs under DIR, on free ports; nothing system-wide is touched. Needs root (slurmd
# runs jobs as their users) and the packages of `scripts/setup.sh --slurm`.
#   scripts/slurm/local-cluster.sh start DIR   then: export SLURM_CONF=DIR/slurm.conf
#   scripts/slurm/local-cluster.sh stop DIR
set -euo pipefail
usage() {
  echo "usage: $0 start|stop DIR" >&2
  exit 2
}
[[ $# -eq 2 ]] || usage
action=$1
dir=$(mkdir -p "$2" && cd "$2" && pwd)

stop() {
  for pid_file in "$dir/slurmd.pid" "$dir/slurmctld.pid" "$dir/munge/munged.pid"; do
    [[ -f $pid_file ]] || continue
    pid=$(cat "$pid_file")
    kill "$pid" 2>/dev/null || true
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -9 "$pid" 2>/dev/null || true
    rm -f "$pid_file"
  done
}

# A port nothing listens on, from a range away from the usual services.
free_port() {
  local port
  for _ in $(seq 100); do
    port=$((20000 + RANDOM % 20000))
    if ! (echo >"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      echo "$port"
      return
    fi
  done
  echo "local-cluster: no free port found" >&2
  exit 1
}

start() {
  for tool in munged mungekey slurmctld slurmd sinfo; do
    command -v "$tool" >/dev/null ||
      { echo "local-cluster: $tool missing (scripts/setup.sh --slurm)" >&2; exit 1; }
  done
  [[ $(id -u) -eq 0 ]] || { echo "local-cluster: must run as root" >&2; exit 1; }
  stop
  rm -rf "$dir/munge" "$dir/state" "$dir/spool"
  mkdir -p "$dir/munge" "$dir/state" "$dir/spool" "$dir/log"
  chmod 700 "$dir/munge"
  mungekey --create --keyfile="$dir/munge/munge.key"
  munged --force --key-file="$dir/munge/munge.key" --socket="$dir/munge/socket" \
    --pid-file="$dir/munge/munged.pid" --log-file="$dir/log/munged.log" \
    --seed-file="$dir/munge/seed"
  local host
  host=$(hostname -s)
  cat >"$dir/slurm.conf" <<CONF
ClusterName=tessera-local
SlurmctldHost=$host
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
AuthInfo=socket=$dir/munge/socket
CredType=cred/munge
SlurmctldPort=$(free_port)
SlurmdPort=$(free_port)
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/slurmctld.pid
SlurmdPidFile=$dir/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MinJobAge=3600
NodeName=$host CPUs=$(nproc) State=UNKNOWN
PartitionName=local Nodes=$host Default=YES MaxTime=INFINITE State=UP
CONF
  export SLURM_CONF=$dir/slurm.conf
  slurmctld -f "$SLURM_CONF"
  slurmd -f "$SLURM_CONF"
  # Up when the node reports idle.
  for _ in $(seq 100); do
    if [[ $(sinfo -h -o %T 2>/dev/null) == idle ]]; then
      echo "local-cluster: up; export SLURM_CONF=$SLURM_CONF"
      return
    fi
    sleep 0.2
  done
  echo "local-cluster: the node did not come up; logs in $dir/log" >&2
  stop
  exit 1
}

case $action in
  start) start ;;
  stop) stop ;;
  *) usage ;;
esac
