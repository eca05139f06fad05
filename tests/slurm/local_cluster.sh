#!/usr/bin/env bash
# A real one-node SLURM on this machine: munged, slurmctld and slurmd on localhost, for the launcher tests and for
# trying `hydra/launcher=slurm` or an sbatch script by hand.
#
#   tests/slurm/local_cluster.sh start    install slurm-wlm and munge if missing (root and apt-get), start the three
#                                         daemons, wait until the node is idle; prints the SLURM_CONF line to export
#   tests/slurm/local_cluster.sh stop     cancel its jobs and stop exactly the daemons `start` started
#   tests/slurm/local_cluster.sh status   exit 0 if this cluster answers with its node idle or busy
#   tests/slurm/local_cluster.sh can      exit 0 if this machine can run it; else print why on one line, exit 1
#
# Everything lives in $RN50PERF_SLURM_DIR (default /tmp/rn50perf-slurm): slurm.conf, its own munge key and socket,
# state, logs and pid files. Its own ports (16817, 16818) and munge socket keep it apart from a cluster the machine
# already belongs to; clients find it through SLURM_CONF. The configuration is the smallest that runs jobs without
# cgroups or accounting: ProctrackType=proctrack/linuxproc, TaskPlugin=task/none, no slurmdbd (so `sacct` has
# nothing to say, and submitit learns that a job ended from its result file).
set -euo pipefail

STATE=${RN50PERF_SLURM_DIR:-/tmp/rn50perf-slurm}
export SLURM_CONF=$STATE/slurm.conf
PACKAGES=(slurm-wlm munge)

can_run() {
  if [ "$(id -u)" != 0 ]; then
    echo "needs root: slurmd runs jobs as their users"
    return 1
  fi
  if ! installed && ! command -v apt-get >/dev/null; then
    echo "slurm-wlm and munge are not installed and there is no apt-get to install them"
    return 1
  fi
}

installed() {
  command -v slurmctld >/dev/null && command -v slurmd >/dev/null && command -v munged >/dev/null \
    && command -v mungekey >/dev/null && command -v sbatch >/dev/null
}

install_packages() {
  installed && return
  echo "installing ${PACKAGES[*]} (apt-get)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >"$STATE/apt.log" 2>&1 \
    || { apt-get update -q >>"$STATE/apt.log" 2>&1 \
      && apt-get install -y -q --no-install-recommends "${PACKAGES[@]}" >>"$STATE/apt.log" 2>&1; } \
    || { echo "apt-get could not install ${PACKAGES[*]}: see $STATE/apt.log" >&2; exit 1; }
}

write_config() {
  local host node
  host=$(hostname -s)
  node=$(slurmd -C | head -1)  # this machine as slurmd sees it: NodeName=... CPUs=... RealMemory=...
  cat >"$SLURM_CONF" <<EOF
ClusterName=rn50perf
SlurmctldHost=$host(127.0.0.1)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge.socket
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
MpiDefault=none
ReturnToService=2
SchedulerParameters=sched_interval=1
KillWait=10
$node NodeAddr=127.0.0.1 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
EOF
}

start_daemon() {  # name pidfile command...: start it and note it as ours
  local name=$1 pidfile=$2
  shift 2
  "$@"
  for _ in $(seq 50); do
    [ -s "$pidfile" ] && kill -0 "$(cat "$pidfile")" 2>/dev/null && break
    sleep 0.1
  done
  kill -0 "$(cat "$pidfile" 2>/dev/null)" 2>/dev/null \
    || { echo "$name did not start: see $STATE/$name.log" >&2; stop_started; exit 1; }
  echo "$name $(cat "$pidfile")" >>"$STATE/started"
}

node_state() {
  sinfo -h -N -o %T 2>/dev/null | head -1
}

start() {
  if status; then
    echo "already up (SLURM_CONF=$SLURM_CONF)"
    return
  fi
  mkdir -p "$STATE"
  chmod 700 "$STATE"
  install_packages
  stop_started
  rm -rf "$STATE/slurmctld" "$STATE/slurmd"
  mkdir -p "$STATE/slurmctld" "$STATE/slurmd"
  write_config
  [ -s "$STATE/munge.key" ] || mungekey --create --keyfile="$STATE/munge.key"
  start_daemon munged "$STATE/munged.pid" munged --force --socket="$STATE/munge.socket" \
    --key-file="$STATE/munge.key" --pid-file="$STATE/munged.pid" --log-file="$STATE/munged.log" \
    --seed-file="$STATE/munged.seed"
  start_daemon slurmctld "$STATE/slurmctld.pid" slurmctld -i
  start_daemon slurmd "$STATE/slurmd.pid" slurmd
  for _ in $(seq 300); do
    [ "$(node_state)" = idle ] && { echo "up: export SLURM_CONF=$SLURM_CONF"; return; }
    sleep 0.1
  done
  echo "the node is not idle after 30 s (sinfo: $(node_state)): see $STATE/slurmctld.log" >&2
  stop_started
  exit 1
}

status() {
  [ -f "$SLURM_CONF" ] && [ -f "$STATE/started" ] || return 1
  case $(node_state) in idle | mixed | allocated | completing) return 0 ;; *) return 1 ;; esac
}

stop_started() {  # the daemons in $STATE/started, and only if they are still those processes: all at once, as
  [ -f "$STATE/started" ] || return 0  # each takes about 2 s to stop
  local name pid pids=()
  while read -r name pid; do
    [ "$(cat "/proc/$pid/comm" 2>/dev/null)" = "$name" ] && pids+=("$pid")
  done <"$STATE/started"
  if [ ${#pids[@]} -gt 0 ]; then
    kill "${pids[@]}"
    for _ in $(seq 100); do
      kill -0 "${pids[@]}" 2>/dev/null || break
      sleep 0.1
    done
  fi
  rm -f "$STATE/started"
}

stop() {
  if status; then
    scancel --full --quiet --partition=debug 2>/dev/null || true
    for _ in $(seq 150); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break
      sleep 0.2
    done
  fi
  stop_started
  echo "stopped"
}

case ${1:-} in
  start) can_run >&2 || exit 1; start ;;
  stop) stop ;;
  status) status ;;
  can) can_run ;;
  *) echo "usage: $0 start|stop|status|can" >&2; exit 2 ;;
esac
