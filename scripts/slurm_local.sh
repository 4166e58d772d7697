#!/usr/bin/env bash
# A one-node Slurm cluster on this machine, from Debian's slurm-wlm and munge packages,
# for running scripts/ember.sbatch for real (docs/slurm.md):
#
#   scripts/slurm_local.sh up       # munged, slurmctld, slurmd; waits until the node is idle
#   export SLURM_CONF=/var/lib/ember-slurm/slurm.conf
#   sbatch --wait scripts/ember.sbatch ...
#   scripts/slurm_local.sh down     # cancels its jobs, stops the daemons it started
#   scripts/slurm_local.sh status   # prints whether it is up (exit 0) or not (exit 3)
#
# Options (before or after the command): --dir DIR (state, config, logs, sockets; default
# $EMBER_SLURM_DIR or /var/lib/ember-slurm), --cpus N (CPUs the node declares, default 8:
# 2 PS shards + 4 workers with room; slurmd accepts more than the real cores through
# SlurmdParameters=config_overrides), --kill-wait S (seconds between the SIGTERM and the
# SIGKILL of a cancelled job's steps, default 30).
#
# Nothing outside DIR is written except the munge key, /etc/munge/munge.key, created
# (0400, owner munge) when missing. The system's /etc/slurm/slurm.conf is not touched: the
# daemons get `-f DIR/slurm.conf`, and client commands read $SLURM_CONF. The daemons run
# without systemd or cgroups (proctrack/linuxproc, task/none). `up` and `down` are
# idempotent; `up` clears old job state (slurmctld -c): the cluster is a scratch one.
set -euo pipefail
# shellcheck source=local_slurm.sh
. "$(dirname "${BASH_SOURCE[0]}")/local_slurm.sh"

die() { echo "slurm_local: $*" >&2; exit 1; }

cmd="" dir="${EMBER_SLURM_DIR:-/var/lib/ember-slurm}" cpus=8 kill_wait=30
while [ $# -gt 0 ]; do
  case "$1" in
    up|down|status) cmd="$1" ;;
    --dir) dir="${2:?--dir needs a directory}"; shift ;;
    --cpus) cpus="${2:?--cpus needs a number}"; shift ;;
    --kill-wait) kill_wait="${2:?--kill-wait needs seconds}"; shift ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' (usage: slurm_local.sh up|down|status [--dir DIR] [--cpus N] [--kill-wait S])" ;;
  esac
  shift
done
[ -n "$cmd" ] || die "usage: slurm_local.sh up|down|status [--dir DIR] [--cpus N] [--kill-wait S]"
[[ "$cpus" =~ ^[1-9][0-9]*$ ]] || die "--cpus $cpus: not a positive integer"
[[ "$kill_wait" =~ ^[0-9]+$ ]] || die "--kill-wait $kill_wait: not a number of seconds"
[ "$EUID" -eq 0 ] || die "needs root (it starts munged, slurmctld and slurmd)"
for b in munged slurmctld slurmd sinfo scontrol squeue scancel runuser; do
  command -v "$b" > /dev/null || PATH="$PATH:/usr/sbin:/sbin" command -v "$b" > /dev/null ||
    die "$b is missing (apt-get install slurm-wlm munge)"
done
id munge > /dev/null 2>&1 || die "no user 'munge' (apt-get install munge)"
PATH="$PATH:/usr/sbin:/sbin"

dir="$(mkdir -p "$dir" && cd "$dir" && pwd)"
conf="$dir/slurm.conf"
node="$(hostname -s)"
export SLURM_CONF="$conf"

alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2> /dev/null; }

node_state() { sinfo -h -N -n "$node" -o %T 2> /dev/null | head -1 || true; }

stop_pidfile() {  # NAME PIDFILE: SIGTERM, up to 15 s, then SIGKILL
  local name="$1" pf="$2" pid
  alive "$pf" || { rm -f "$pf"; return 0; }
  pid="$(cat "$pf")"
  kill -TERM "$pid" 2> /dev/null || true
  for _ in $(seq 150); do kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
  if kill -0 "$pid" 2> /dev/null; then
    echo "slurm_local: $name ($pid) did not stop within 15 s; killing it" >&2
    kill -KILL "$pid" 2> /dev/null || true
  fi
  rm -f "$pf"
}

case "$cmd" in
status)
  if alive "$dir/run/slurmctld.pid" && alive "$dir/run/slurmd.pid"; then
    echo "slurm_local: up ($dir; node $node $(node_state)); export SLURM_CONF=$conf"
    exit 0
  fi
  echo "slurm_local: down ($dir)"
  exit 3
  ;;

up)
  if alive "$dir/munge/munged.pid" && alive "$dir/run/slurmctld.pid" && alive "$dir/run/slurmd.pid"; then
    echo "slurm_local: already up ($dir; node $node $(node_state)); export SLURM_CONF=$conf"
    exit 0
  fi
  # Half up (a crash, a partial start): start over.
  stop_pidfile slurmd "$dir/run/slurmd.pid"
  stop_pidfile slurmctld "$dir/run/slurmctld.pid"
  mkdir -p "$dir/state" "$dir/spool" "$dir/log" "$dir/run" "$dir/munge"
  chmod 755 "$dir" "$dir/state" "$dir/spool" "$dir/log" "$dir/run"

  # munge: the system key (created when missing), our own socket.
  key=/etc/munge/munge.key
  ensure_munge_key slurm_local "$dir/munge"
  socket="$dir/munge/munge.socket.2"
  if ! alive "$dir/munge/munged.pid"; then
    rm -f "$socket" "$socket.lock"
    runuser -u munge -- munged --key-file="$key" --socket="$socket" --pid-file="$dir/munge/munged.pid" \
      --log-file="$dir/munge/munged.log" --seed-file="$dir/munge/munged.seed" ||
      die "munged did not start (see $dir/munge/munged.log)"
  fi

  # PlugStackConfig of our own (empty): the system's SPANK plugins stay out of it.
  : > "$dir/plugstack.conf"
  {
    cat <<EOF
# Written by scripts/slurm_local.sh: a one-node scratch cluster for Ember.
ClusterName=ember
SlurmctldHost=$node
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
SlurmctldPort=6817
SlurmdPort=6818
StateSaveLocation=$dir/state
SlurmdSpoolDir=$dir/spool
SlurmctldPidFile=$dir/run/slurmctld.pid
SlurmdPidFile=$dir/run/slurmd.pid
SlurmctldLogFile=$dir/log/slurmctld.log
SlurmdLogFile=$dir/log/slurmd.log
PlugStackConfig=$dir/plugstack.conf
EOF
    slurm_conf_common "$kill_wait"
    cat <<EOF
NodeName=$node CPUs=$cpus State=UNKNOWN
PartitionName=ember Nodes=$node Default=YES MaxTime=INFINITE State=UP
EOF
  } > "$conf.tmp"
  mv "$conf.tmp" "$conf"
  chmod 644 "$conf"

  slurmctld -c -f "$conf" || die "slurmctld did not start (see $dir/log/slurmctld.log)"
  slurmd -f "$conf" || die "slurmd did not start (see $dir/log/slurmd.log)"
  state=""
  for _ in $(seq 300); do  # 30 s
    state="$(node_state)"
    case "$state" in idle|mixed|allocated) break ;; esac
    sleep 0.1
  done
  case "$state" in
    idle|mixed|allocated) ;;
    *) die "node $node is '${state:-unknown}' 30 s after start, not idle (see $dir/log/slurmctld.log, slurmd.log)" ;;
  esac
  echo "slurm_local: up: node $node $state with $cpus CPUs, partition ember ($dir); export SLURM_CONF=$conf"
  ;;

down)
  if alive "$dir/run/slurmctld.pid"; then
    # Cancel the jobs first, so their steps are signalled while slurmd runs.
    scancel --full --quiet --partition=ember 2> /dev/null || true
    for _ in $(seq $(( (kill_wait + 15) * 10 ))); do
      [ -z "$(squeue -h -t R,CG,PD -o %i 2> /dev/null)" ] && break
      sleep 0.1
    done
    # slurmctld and slurmd stop together (1.4 s here; SIGTERM to slurmd alone takes 5 s).
    scontrol shutdown > /dev/null 2>&1 || true
    for _ in $(seq 100); do
      alive "$dir/run/slurmd.pid" || alive "$dir/run/slurmctld.pid" || break
      sleep 0.1
    done
  fi
  stop_pidfile slurmd "$dir/run/slurmd.pid"
  stop_pidfile slurmctld "$dir/run/slurmctld.pid"
  stop_pidfile munged "$dir/munge/munged.pid"
  echo "slurm_local: down ($dir)"
  ;;
esac
