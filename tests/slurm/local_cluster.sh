#!/usr/bin/env bash
# A real SLURM on this machine, for the launcher tests and for trying `hydra/launcher=slurm` or an sbatch script by
# hand: munged and slurmctld, and one slurmd per node. One node (the default) runs on localhost; with --nodes N (2 to
# 4) each node n1..nN is a network namespace of its own (rn50perf-n1, ...: `ip netns pids rn50perf-n1` lists its
# processes), joined to the others by a bridge, so a job's ranks on different nodes talk over a real (virtual) link.
#
#   tests/slurm/local_cluster.sh start [--nodes N]  install slurm-wlm and munge if missing (root and apt-get), start
#                                                   the daemons, wait until every node is idle; prints the SLURM_CONF
#                                                   line to export
#   tests/slurm/local_cluster.sh stop               cancel its jobs and wait for their steps to end, stop exactly the
#                                                   daemons `start` started (and kill its job steps left), remove the
#                                                   namespaces, links and files it made: nothing of it is left
#   tests/slurm/local_cluster.sh status             exit 0 if this cluster answers with every node idle or busy
#   tests/slurm/local_cluster.sh can [--nodes N]    exit 0 if this machine can run it; else print why on one line, exit 1
#
# Faults, on a cluster of several nodes (what tests/slurm/test_faults.py injects, and a user may try by hand):
#
#   tests/slurm/local_cluster.sh kill-node nI       SIGKILL every process in node nI's namespace, its slurmd too
#   tests/slurm/local_cluster.sh start-node nI      start node nI's slurmd again (SLURM returns the node to service)
#   tests/slurm/local_cluster.sh link nI down|up    cut node nI's link to the bridge, or restore it
#
# Everything lives in $RN50PERF_SLURM_DIR (default /tmp/rn50perf-slurm): slurm.conf, its own munge key and socket,
# state, logs and pid files (the names own_files lists), and `made`, what `start` made there and on the machine, which
# `stop` removes (a `start` that fails keeps its logs until then). A user's files in that folder are never touched:
# `start` adds its own beside them, and refuses (exit status 2) a folder that holds one of its names but is not its
# own. Its own ports (16817, 16818) and munge socket keep it apart from a cluster the machine already belongs to;
# clients find it through SLURM_CONF. The configuration is the smallest that runs jobs without cgroups or
# accounting: ProctrackType=proctrack/linuxproc, TaskPlugin=task/none, no slurmdbd (so `sacct` has nothing to say,
# and submitit learns that a job ended from its result file).
#
# The nodes' network is 198.18.0.0/24, a range set aside for benchmarking networks (RFC 2544), on the bridge
# rn50perf-br: the controller is 198.18.0.1 (the bridge's address here), node nI is 198.18.0.(10+I) on the eth0 of
# its namespace, its end of the veth pair rn50perf-vI; a namespace has no route but that subnet. Each node's slurmd,
# and so every job it runs, has the node's own host name (a UTS namespace) and /etc/hosts (/etc/netns/rn50perf-nI/
# hosts, mounted over it), so a job finds its peers by node name.
set -euo pipefail

STATE=${RN50PERF_SLURM_DIR:-/tmp/rn50perf-slurm}
export SLURM_CONF=$STATE/slurm.conf
PACKAGES=(slurm-wlm munge)
MAX_NODES=4
BRIDGE=rn50perf-br
SUBNET=198.18.0
CONTROLLER=$SUBNET.1

MADE_BY="# made by tests/slurm/local_cluster.sh start; its stop removes it all"  # the first line of $STATE/made

nodes_asked() {  # --nodes N from the arguments, 1 without it
  local nodes=1
  while [ $# -gt 0 ]; do
    case $1 in
      --nodes) nodes=${2:-}; shift 2 ;;
      --nodes=*) nodes=${1#--nodes=}; shift ;;
      *) echo "unknown argument $1" >&2; exit 2 ;;
    esac
  done
  [[ $nodes =~ ^[1-9][0-9]*$ ]] && [ "$nodes" -le $MAX_NODES ] \
    || { echo "--nodes takes 1 to $MAX_NODES, got '$nodes'" >&2; exit 2; }
  echo "$nodes"
}

can_run() {  # nodes
  if [ "$(id -u)" != 0 ]; then
    echo "needs root: slurmd runs jobs as their users"
    return 1
  fi
  if ! installed && ! command -v apt-get >/dev/null; then
    echo "slurm-wlm and munge are not installed and there is no apt-get to install them"
    return 1
  fi
  if [ "$1" -gt 1 ]; then
    if ! command -v ip >/dev/null || ! command -v unshare >/dev/null || ! command -v nsenter >/dev/null; then
      echo "several nodes need iproute2's ip and util-linux's unshare and nsenter"
      return 1
    fi
    local probe=rn50perf-probe$$
    if ! ip netns add "$probe" 2>/dev/null; then
      echo "several nodes need network namespaces: 'ip netns add' fails here"
      return 1
    fi
    ip netns del "$probe"
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

node_names() {  # the nodes of the running cluster, one a line
  cat "$STATE/nodes"
}

nodes_of() {  # N: the names of a cluster of N nodes
  if [ "$1" = 1 ]; then hostname -s; else seq -f 'n%g' "$1"; fi
}

own_files() {  # node...: the names that start, and the daemons it starts, write in $STATE
  echo made nodes started apt.log slurm.conf munge.key munge.socket munge.socket.lock munged.pid munged.log \
    munged.seed slurmctld slurmctld.pid slurmctld.log slurmd
  local node
  for node in "$@"; do
    echo "slurmd-$node.pid" "slurmd-$node.log"
  done
}

ours() {  # $STATE is a folder this script made its own
  [ "$(head -1 "$STATE/made" 2>/dev/null)" = "$MADE_BY" ]
}

claim() {  # nodes: make $STATE this cluster's: a new folder, or one without any of its names (its files go beside
  # the others there), or its own, where a cluster that did not stop left its processes and files (removed first)
  local made_folder=
  if ours; then
    grep -qx "folder" "$STATE/made" && made_folder=1
    stop >/dev/null
  fi
  if [ -d "$STATE" ]; then
    local name taken=()
    for name in $(own_files $(nodes_of "$1")); do
      if [ -e "$STATE/$name" ] || [ -L "$STATE/$name" ]; then taken+=("$name"); fi
    done
    if [ ${#taken[@]} -gt 0 ]; then
      echo "error: $STATE holds files by this cluster's names that it did not make (${taken[*]}): set" \
        "RN50PERF_SLURM_DIR to a new folder (or remove them, if an earlier local_cluster.sh left them)" >&2
      exit 2
    fi
  else
    mkdir -p -m 700 "$STATE"
    made_folder=1
  fi
  echo "$MADE_BY" >"$STATE/made"
  [ -z "$made_folder" ] || echo "folder" >>"$STATE/made"
}

node_address() {  # nI -> its address on the bridge
  echo "$SUBNET.$((10 + ${1#n}))"
}

write_config() {  # nodes
  local host machine controller
  host=$(hostname -s)
  machine=$(slurmd -C | head -1 | sed 's/^NodeName=[^ ]* //')  # CPUs=... RealMemory=...: this machine, per node
  nodes_of "$1" >"$STATE/nodes"
  if [ "$1" = 1 ]; then controller=127.0.0.1; else controller=$CONTROLLER; fi
  cat >"$SLURM_CONF" <<EOF
ClusterName=rn50perf
SlurmctldHost=$host($controller)
SlurmctldPort=16817
SlurmdPort=16818
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$STATE/munge.socket
StateSaveLocation=$STATE/slurmctld
SlurmdSpoolDir=$STATE/slurmd/%n
SlurmctldPidFile=$STATE/slurmctld.pid
SlurmdPidFile=$STATE/slurmd-%n.pid
SlurmctldLogFile=$STATE/slurmctld.log
SlurmdLogFile=$STATE/slurmd-%n.log
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
SlurmdTimeout=20
EOF
  local node
  for node in $(node_names); do
    if [ "$1" = 1 ]; then
      echo "NodeName=$node $machine NodeAddr=127.0.0.1 State=UNKNOWN"
    else
      echo "NodeName=$node $machine NodeAddr=$(node_address "$node") State=UNKNOWN"
    fi
  done >>"$SLURM_CONF"
  echo "PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP" >>"$SLURM_CONF"
}

make_network() {  # the bridge with the controller's address, and a namespace per node with its end of a veth pair
  local node namespace link
  ip link add "$BRIDGE" type bridge
  echo "link $BRIDGE" >>"$STATE/made"
  ip addr add "$CONTROLLER/24" dev "$BRIDGE"
  ip link set "$BRIDGE" up
  if ! [ -d /etc/netns ]; then
    mkdir /etc/netns
    echo "etc /etc/netns" >>"$STATE/made"
  fi
  for node in $(node_names); do
    namespace=rn50perf-$node link=rn50perf-v${node#n}
    ip netns add "$namespace"
    echo "netns $namespace" >>"$STATE/made"
    ip link add "$link" type veth peer name eth0 netns "$namespace"
    ip link set "$link" master "$BRIDGE" up
    ip -n "$namespace" addr add "$(node_address "$node")/24" dev eth0
    ip -n "$namespace" link set eth0 up
    ip -n "$namespace" link set lo up
    mkdir "/etc/netns/$namespace"
    echo "etc /etc/netns/$namespace" >>"$STATE/made"
    hosts_file >"/etc/netns/$namespace/hosts"
  done
}

hosts_file() {  # what a node's /etc/hosts says: itself, the controller, its peers
  echo "127.0.0.1 localhost"
  echo "$CONTROLLER $(hostname -s)"
  local node
  for node in $(node_names); do
    echo "$(node_address "$node") $node"
  done
}

remove_network() {  # what make_network noted, last made first
  [ -f "$STATE/made" ] || return 0
  local kind name
  tac "$STATE/made" | while read -r kind name; do
    case $kind in
      netns)
        ip netns pids "$name" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
        ip netns del "$name" 2>/dev/null || true
        ;;
      link) ip link del "$name" 2>/dev/null || true ;;
      etc) rm -f "$name/hosts" && rmdir "$name" 2>/dev/null || true ;;  # /etc/netns only if nothing else is in it
    esac
  done
}

remove_files() {  # the files start and its daemons wrote in $STATE, `made` last; the folder if start made it
  local made_folder= name
  grep -qx "folder" "$STATE/made" && made_folder=1
  for name in $(own_files $(node_names 2>/dev/null)); do
    [ "$name" = made ] || rm -rf "${STATE:?}/$name"
  done
  rm -f "$STATE/made"
  [ -z "$made_folder" ] || rmdir "$STATE" 2>/dev/null || true  # a user's files in it keep it
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
    || { echo "$name did not start: see $STATE/$name*.log" >&2; stop_started; remove_network; exit 1; }
  echo "$name $(cat "$pidfile")" >>"$STATE/started"
}

start_node() {  # the node's slurmd: on localhost for one node, else in the node's namespace under its own name
  local node=$1
  rm -f "$STATE/slurmd-$node.pid"
  mkdir -p "$STATE/slurmd/$node"
  if [ "$(node_names | wc -l)" = 1 ]; then
    start_daemon slurmd "$STATE/slurmd-$node.pid" slurmd
  else
    # nsenter, not `ip netns exec`, which mounts a /sys of the namespace's own, without the cgroup file systems
    # slurmd looks for: the node's own host name (UTS) and /etc/hosts (a bind mount in a mount namespace) instead.
    start_daemon slurmd "$STATE/slurmd-$node.pid" \
      nsenter --net="/run/netns/rn50perf-$node" unshare --uts --mount --propagation private sh -c \
      "hostname $node && mount --bind /etc/netns/rn50perf-$node/hosts /etc/hosts && exec slurmd -N $node"
  fi
}

node_states() {
  sinfo -h -N -o %T 2>/dev/null
}

all_nodes() {  # state...: every node in one of these states
  local states
  states=$(node_states)
  [ -n "$states" ] && [ "$(echo "$states" | wc -l)" = "$(node_names | wc -l)" ] \
    && ! echo "$states" | grep -qvxE "$(IFS='|'; echo "$*")"
}

start() {  # nodes
  if status; then
    echo "already up (SLURM_CONF=$SLURM_CONF)"
    return
  fi
  claim "$1"
  install_packages
  mkdir "$STATE/slurmctld" "$STATE/slurmd"
  write_config "$1"
  [ "$1" = 1 ] || make_network
  [ -s "$STATE/munge.key" ] || mungekey --create --keyfile="$STATE/munge.key"
  start_daemon munged "$STATE/munged.pid" munged --force --socket="$STATE/munge.socket" \
    --key-file="$STATE/munge.key" --pid-file="$STATE/munged.pid" --log-file="$STATE/munged.log" \
    --seed-file="$STATE/munged.seed"
  start_daemon slurmctld "$STATE/slurmctld.pid" slurmctld -i
  local node
  for node in $(node_names); do
    start_node "$node"
  done
  for _ in $(seq 300); do
    all_nodes idle && { echo "up: export SLURM_CONF=$SLURM_CONF"; return; }
    sleep 0.1
  done
  echo "the nodes are not idle after 30 s (sinfo: $(node_states | tr '\n' ' ')): see $STATE/slurmctld.log" >&2
  stop_started
  remove_network
  exit 1
}

status() {
  ours && [ -f "$SLURM_CONF" ] && [ -f "$STATE/started" ] && [ -f "$STATE/nodes" ] || return 1
  all_nodes idle mixed allocated completing
}

running() {  # [name]: the daemons in $STATE/started (those called name) still running as those processes; a zombie
  # (ended, its name kept until its parent reaps it) is not running
  [ -f "$STATE/started" ] || return 0
  local name pid
  while read -r name pid; do
    if [ "${1:-$name}" = "$name" ] && ps -p "$pid" -o state=,comm= | grep -qx "[^Z] $name"; then echo "$pid"; fi
  done <"$STATE/started"
}

stop_started() {  # the daemons start started, all at once (each may take seconds to stop)
  local pids
  pids=$(running)
  if [ -n "$pids" ]; then
    kill $pids 2>/dev/null || true
    for _ in $(seq 100); do
      [ -n "$(running)" ] || break
      sleep 0.1
    done
  fi
  rm -f "$STATE/started"
}

steps() {  # this cluster's job steps: its slurmstepd and srun processes (by the SLURM_CONF slurmd gives its
  # slurmstepd and a job its srun: never another cluster's), with every process under them
  local pid
  for pid in $(pgrep -x 'slurmstepd|srun'); do
    if tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qxF "SLURM_CONF=$SLURM_CONF"; then
      with_children "$pid"
    fi
  done
}

with_children() {  # pid...: each, and every process under it
  local pid
  for pid in "$@"; do
    echo "$pid"
    with_children $(pgrep -P "$pid")
  done
}

stop() {
  ours || { echo "stopped (nothing of this script's in $STATE)"; return; }
  # SLURM ends its jobs' steps (SIGTERM, then SIGKILL after KillWait) while its daemons run; the steps left after
  # that (or where the controller is gone) are killed here, as srun and slurmstepd outlive slurmd.
  if [ -n "$(running slurmctld)" ] && scancel --full --quiet --partition=debug 2>/dev/null; then
    for _ in $(seq 150); do
      [ -z "$(squeue -h -o %i 2>/dev/null)" ] && [ -z "$(steps)" ] && break
      sleep 0.2
    done
  fi
  stop_started
  local left
  left=$(steps)
  [ -z "$left" ] || kill -9 $left 2>/dev/null || true
  remove_network
  remove_files
  echo "stopped"
}

a_node() {  # nI: one of this cluster's nodes in namespaces, or exit 2
  ours && grep -qx "netns rn50perf-${1:-}" "$STATE/made" \
    || { echo "no node '${1:-}' in a namespace of this cluster (start --nodes N makes n1..nN)" >&2; exit 2; }
}

kill_node() {
  a_node "$1"
  ip netns pids "rn50perf-$1" | xargs -r kill -9
}

link() {
  a_node "$1"
  case ${2:-} in
    up | down) ip link set "rn50perf-v${1#n}" "$2" ;;
    *) echo "link $1 takes up or down" >&2; exit 2 ;;
  esac
}

case ${1:-} in
  start) nodes=$(nodes_asked "${@:2}"); can_run "$nodes" >&2 || exit 1; start "$nodes" ;;
  stop) stop ;;
  status) status ;;
  can) nodes=$(nodes_asked "${@:2}"); can_run "$nodes" ;;
  kill-node) kill_node "${2:-}" ;;
  start-node) a_node "${2:-}"; start_node "$2" ;;
  link) link "${2:-}" "${3:-}" ;;
  *) echo "usage: $0 start [--nodes N]|stop|status|can [--nodes N]|kill-node nI|start-node nI|link nI up|down" >&2; exit 2 ;;
esac
