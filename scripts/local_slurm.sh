# shellcheck shell=bash
# Sourced by slurm_local.sh and cluster_local.sh, the two scratch Slurm clusters:
#   ensure_munge_key PROG DIR    the munge key they share, /etc/munge/munge.key, created
#                                (0400, owner munge) when missing, and a munge directory
#                                DIR of the caller's own; PROG names the caller
#   slurm_conf_common KILL_WAIT  the slurm.conf lines both write: daemons without
#                                systemd or cgroups, and their timing
ensure_munge_key() {
  local prog="$1" dir="$2" key=/etc/munge/munge.key
  if [ ! -s "$key" ]; then
    mkdir -p /etc/munge
    (umask 077; head -c 1024 /dev/urandom > "$key.tmp") && mv "$key.tmp" "$key"
    echo "$prog: created $key"
  fi
  chown munge:munge /etc/munge "$key"
  chmod 700 /etc/munge
  chmod 400 "$key"
  chown munge:munge "$dir"
  chmod 755 "$dir"
}

slurm_conf_common() {
  cat <<EOF
# No systemd, no cgroups: processes are tracked by parentage.
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/none
SwitchType=switch/none
MpiDefault=none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
# Nodes may declare more CPUs than the machine has (2 PS shards + 4 workers on 2 cores).
SlurmdParameters=config_overrides
ReturnToService=2
# A cancelled job's steps get SIGTERM, then SIGKILL after KillWait seconds: time for
# Ember to stop at a checkpoint (docs/slurm.md).
KillWait=$1
InactiveLimit=0
# sbatch --wait polls every 2 s while its sleep stays under MinJobAge/2, else every 8 s
# then every 32 s (a 17 s job waited 42 s with the default 300). Finished jobs leave
# squeue/scontrol after a few seconds.
MinJobAge=4
SlurmctldTimeout=30
SlurmdTimeout=60
EOF
}
