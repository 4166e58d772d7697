#!/usr/bin/env bash
# A cluster of N hosts on this one machine (docs/cluster.md): each host a network
# namespace with its own address on one Linux bridge and its own host name (a UTS
# namespace), its link shaped by tc tbf, an sshd and a slurmd of its own; one slurmctld
# and one munged in the root namespace, which has an address on the bridge too.
#
#   scripts/cluster_local.sh up [--hosts N] [--link-mbit R] [--intra-mbit R] [--cpus C]
#   scripts/cluster_local.sh status        # prints what is up (exit 0) or not (exit 3)
#   scripts/cluster_local.sh exec HOST CMD...   # runs CMD on HOST (its network, name, /etc/hosts)
#   scripts/cluster_local.sh rsh HOST 'CMD'     # the same through sh -c, as ssh takes a command
#   scripts/cluster_local.sh down          # stops everything, removes namespaces, links, mounts
#   ssh -F /var/lib/ember-cluster/ssh_config host1 hostname
#   export SLURM_CONF=/var/lib/ember-cluster/slurm.conf; sinfo; srun --nodes=3 hostname
#
# Options (before the command or after up/down/status): --state DIR (default
# $EMBER_CLUSTER_DIR or /var/lib/ember-cluster), --hosts N (default 3, at most 200),
# --link-mbit R (each host's link, both directions, Mbit/s; 0, the default: unshaped),
# --intra-mbit R (each host's loopback; 0: unshaped), --cpus C (CPUs each node declares
# to Slurm, default 4), --net-only (up: the namespaces, names and links alone, no sshd,
# munge or Slurm; for a machine without them, with launch_hosts.sh --rsh 'cluster_local.sh
# rsh' in place of ssh). Hosts are host1..hostN at 10.77.0.11.., the root namespace
# 10.77.0.1, on bridge ember-br0. `up` on a cluster that is up with the same settings does
# nothing; with other rates it reshapes the links in place; with another host count it
# refuses. A half-up cluster is taken down and brought up again.
#
# Outside DIR it creates, and `down` removes: the namespaces (/run/netns/ember-hostK),
# the links (ember-br0, ember-vK), and /run/netns and /run/sshd when it made them. The
# hosts' /etc/hosts, /etc/ssh/ssh_config and /etc/slurm are DIR's files bound over them
# in the hosts' own mount namespaces: the machine's files are not written. It creates the
# munge key /etc/munge/munge.key when missing, as slurm_local.sh does, and leaves it.
set -euo pipefail
# shellcheck source=local_slurm.sh
. "$(dirname "${BASH_SOURCE[0]}")/local_slurm.sh"

prog=cluster_local
die() { echo "$prog: $*" >&2; exit 1; }
usage="usage: cluster_local.sh up|down|status|exec HOST CMD...|rsh HOST CMD [--state DIR] [--hosts N] [--link-mbit R] [--intra-mbit R] [--cpus C] [--net-only]"

cmd="" state="${EMBER_CLUSTER_DIR:-/var/lib/ember-cluster}" hosts=3 link_mbit=0 intra_mbit=0 cpus=4 net_only=0
exec_host="" exec_argv=()
while [ $# -gt 0 ]; do
  case "$1" in
    up|down|status) cmd="$1" ;;
    exec)
      cmd="exec"
      exec_host="${2:?exec needs a host and a command}"; shift 2
      [ $# -gt 0 ] || die "exec $exec_host: no command"
      exec_argv=("$@")
      break ;;
    rsh)
      cmd="exec"
      exec_host="${2:?rsh needs a host and a command}"
      [ $# -ge 3 ] || die "rsh $exec_host: no command"
      shift 2
      exec_argv=(/bin/sh -c "$*")
      break ;;
    --net-only) net_only=1 ;;
    --state) state="${2:?--state needs a directory}"; shift ;;
    --hosts) hosts="${2:?--hosts needs a number}"; shift ;;
    --link-mbit) link_mbit="${2:?--link-mbit needs Mbit/s}"; shift ;;
    --intra-mbit) intra_mbit="${2:?--intra-mbit needs Mbit/s}"; shift ;;
    --cpus) cpus="${2:?--cpus needs a number}"; shift ;;
    -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown argument '$1' ($usage)" ;;
  esac
  shift
done
[ -n "$cmd" ] || die "$usage"
[[ "$hosts" =~ ^[1-9][0-9]*$ ]] && [ "$hosts" -le 200 ] || die "--hosts $hosts: not a number from 1 to 200"
[[ "$link_mbit" =~ ^[0-9]+$ ]] || die "--link-mbit $link_mbit: not a whole number of Mbit/s"
[[ "$intra_mbit" =~ ^[0-9]+$ ]] || die "--intra-mbit $intra_mbit: not a whole number of Mbit/s"
[[ "$cpus" =~ ^[1-9][0-9]*$ ]] || die "--cpus $cpus: not a positive integer"
[ "$EUID" -eq 0 ] || die "needs root (network namespaces, a bridge, sshd and slurmd)"
PATH="$PATH:/usr/sbin:/sbin"
# A cluster that is up keeps the kind it was brought up as (cluster.env's up_net_only).
if [ "$cmd" != up ] && [ -s "$state/cluster.env" ] && grep -qx "up_net_only=1" "$state/cluster.env"; then net_only=1; fi
missing=()
need() {  # PACKAGE COMMAND...
  local pkg="$1" b; shift
  for b in "$@"; do
    command -v "$b" > /dev/null || { missing+=("$pkg"); return 0; }
  done
}
need iproute2 ip tc
need util-linux unshare nsenter mountpoint runuser
if [ "$net_only" = 0 ]; then
  need openssh-server sshd
  need openssh-client ssh ssh-keygen
  need munge munged
  need slurm-wlm slurmctld slurmd sinfo scontrol squeue scancel srun
  id munge > /dev/null 2>&1 || missing+=(munge)
fi
if [ ${#missing[@]} -gt 0 ]; then
  die "missing package(s): $(printf '%s\n' "${missing[@]}" | sort -u | tr '\n' ' ')(apt-get install them, or bash scripts/install_deps.sh --ops)"
fi

mkdir -p "$state"
state="$(cd "$state" && pwd)"
chmod 755 "$state"
net=10.77.0 bridge=ember-br0 ctld_port=6827 slurmd_port=6828
head_ip="$net.1"
head_name="$(hostname -s)"
env_file="$state/cluster.env"
conf="$state/slurm.conf"
export SLURM_CONF="$conf"

host_ip() { echo "$net.$((10 + $1))"; }
ns_of() { echo "ember-host$1"; }
uts_of() { echo "$state/ns/host$1.uts"; }
alive() { [ -s "$1" ] && kill -0 "$(cat "$1")" 2> /dev/null; }

# Settings of the cluster that is up (or was), from cluster.env.
up_hosts=0 up_link=0 up_intra=0 up_cpus=0 up_net_only=0 made_run_netns=0 made_run_sshd=0
# shellcheck disable=SC1090
[ -s "$env_file" ] && . "$env_file"

# Runs a command on host K: in its network and UTS namespaces, and in a mount namespace
# of its own where DIR/etc/hosts, DIR/ssh_config and DIR/etc/slurm are bound over
# /etc/hosts, /etc/ssh/ssh_config and /etc/slurm (ip netns exec would bind /etc/netns/NAME the same way, but it also mounts
# a new /sys, without /sys/fs/cgroup, where slurmd refuses to start).
on_host() {
  local k="$1"; shift
  nsenter --net="/run/netns/$(ns_of "$k")" --uts="$(uts_of "$k")" -- \
    unshare --mount --propagation slave -- /bin/sh -c 'd="$1" n="$2"; shift 2
      mount --bind "$d/etc/hosts" /etc/hosts || exit 1
      if [ "$n" = 0 ]; then
        mount --bind "$d/ssh_config" /etc/ssh/ssh_config && mount --bind "$d/etc/slurm" /etc/slurm || exit 1
      fi
      exec "$@"' on_host "$state" "$net_only" env SLURM_CONF="$conf" "$@"
}

bridge_owner() { ip -o link show "$bridge" 2> /dev/null | sed -n 's/.* alias \(.*\)$/\1/p' || true; }

# Prints the parts that are missing (nothing when the whole cluster of up_hosts is up).
missing_parts() {
  local k
  [ "$up_hosts" -gt 0 ] || { echo "nothing"; return; }
  [ "$(bridge_owner)" = "$state" ] || echo "bridge $bridge"
  if [ "$up_net_only" = 0 ]; then
    alive "$state/munge/munged.pid" || echo "munged"
    alive "$state/slurm/run/slurmctld.pid" || echo "slurmctld"
  fi
  for k in $(seq "$up_hosts"); do
    [ -e "/run/netns/$(ns_of "$k")" ] || echo "namespace $(ns_of "$k")"
    mountpoint -q "$(uts_of "$k")" 2> /dev/null || echo "host$k's UTS namespace"
    [ "$up_net_only" = 1 ] && continue
    alive "$state/ssh/host$k/sshd.pid" || echo "host$k's sshd"
    alive "$state/slurm/run/slurmd-host$k.pid" || echo "host$k's slurmd"
  done
}

node_states() { sinfo -h -N -o '%N %T' 2> /dev/null | sort -V || true; }

shape_desc() {
  local l="unshaped" i="unshaped"
  [ "$1" -eq 0 ] || l="$1 Mbit/s"
  [ "$2" -eq 0 ] || i="$2 Mbit/s"
  echo "links $l, loopback $i"
}

# tc tbf at RATE Mbit/s as the root qdisc of DEV in namespace NS ("" = root namespace);
# rate 0 removes it. The bucket holds at least 1/100 s at the rate and two of the
# device's largest packets (64 KiB GSO packets on veth and lo).
shape() {
  local ns="$1" dev="$2" rate="$3" burst
  local -a tcn=(tc)
  [ -z "$ns" ] || tcn=(ip netns exec "$ns" tc)
  "${tcn[@]}" qdisc del dev "$dev" root 2> /dev/null || true
  [ "$rate" -gt 0 ] || return 0
  burst=$((rate * 1000000 / 8 / 100))
  [ "$burst" -ge 131072 ] || burst=131072
  "${tcn[@]}" qdisc add dev "$dev" root tbf rate "${rate}mbit" burst "$burst" latency 50ms ||
    die "tc tbf on $dev${ns:+ in $ns} failed"
}

shape_all() {  # LINK INTRA
  local k
  for k in $(seq "$up_hosts"); do
    shape "" "ember-v$k" "$1"
    shape "$(ns_of "$k")" eth0 "$1"
    shape "$(ns_of "$k")" lo "$2"
  done
}

write_env() {
  cat > "$env_file.tmp" <<EOF
up_hosts=$up_hosts
up_link=$up_link
up_intra=$up_intra
up_cpus=$up_cpus
up_net_only=$up_net_only
made_run_netns=$made_run_netns
made_run_sshd=$made_run_sshd
EOF
  mv "$env_file.tmp" "$env_file"
}

stop_pid() {  # NAME PID: SIGTERM, up to 10 s, then SIGKILL
  local name="$1" pid="$2"
  kill -TERM "$pid" 2> /dev/null || return 0
  for _ in $(seq 100); do kill -0 "$pid" 2> /dev/null || return 0; sleep 0.1; done
  echo "$prog: $name ($pid) did not stop within 10 s; killing it" >&2
  kill -KILL "$pid" 2> /dev/null || true
}

stop_pidfile() {
  alive "$2" && stop_pid "$1" "$(cat "$2")"
  rm -f "$2"
}

teardown() {
  local k n ns pids p
  # The hosts of cluster.env, and any ember-hostK namespace beyond them (a lost env file).
  n="$up_hosts"
  for ns in $(ip netns list 2> /dev/null | sed -n 's/^ember-host\([0-9]*\).*/\1/p'); do
    [ "$ns" -le "$n" ] || n="$ns"
  done
  # Slurm first: cancel the jobs, then slurmctld and every slurmd stop together.
  if alive "$state/slurm/run/slurmctld.pid"; then
    scancel --full --quiet --partition=ember 2> /dev/null || true
    for _ in $(seq 100); do
      [ -z "$(squeue -h -t R,CG,PD -o %i 2> /dev/null)" ] && break
      sleep 0.1
    done
    scontrol shutdown > /dev/null 2>&1 || true
    for _ in $(seq 100); do
      alive "$state/slurm/run/slurmctld.pid" || break
      sleep 0.1
    done
  fi
  stop_pidfile slurmctld "$state/slurm/run/slurmctld.pid"
  # Every process left on a host (sshd, slurmd, sessions, steps, whatever exec started).
  for k in $(seq "$n"); do
    ns="$(ns_of "$k")"
    [ -e "/run/netns/$ns" ] || continue
    pids="$(ip netns pids "$ns" 2> /dev/null | tr '\n' ' ')"
    [ -n "${pids// /}" ] || continue
    kill -TERM $pids 2> /dev/null || true
    for _ in $(seq 50); do
      [ -z "$(ip netns pids "$ns" 2> /dev/null)" ] && break
      sleep 0.1
    done
    for p in $(ip netns pids "$ns" 2> /dev/null); do
      echo "$prog: process $p on host$k did not stop within 5 s; killing it" >&2
      kill -KILL "$p" 2> /dev/null || true
    done
  done
  stop_pidfile munged "$state/munge/munged.pid"
  for k in $(seq "$n"); do
    ip link del "ember-v$k" 2> /dev/null || true
    ns="$(ns_of "$k")"
    [ -e "/run/netns/$ns" ] && { ip netns del "$ns" 2> /dev/null || echo "$prog: could not delete namespace $ns" >&2; }
    mountpoint -q "$(uts_of "$k")" 2> /dev/null && umount "$(uts_of "$k")"
    rm -f "$(uts_of "$k")"
  done
  [ "$(bridge_owner)" = "$state" ] && ip link del "$bridge"
  if [ "$made_run_netns" -eq 1 ] && [ -d /run/netns ] && [ -z "$(ls -A /run/netns 2> /dev/null)" ]; then
    mountpoint -q /run/netns && umount /run/netns
    rmdir /run/netns 2> /dev/null || true
  fi
  if [ "$made_run_sshd" -eq 1 ] && [ -d /run/sshd ]; then rmdir /run/sshd 2> /dev/null || true; fi
  # Secrets and runtime files go; logs stay in DIR/log.
  rm -rf "${state:?}/ssh" "${state:?}/ns" "${state:?}/etc" "$state/slurm/run" "$state/munge/munge.socket.2"* \
    "$state/ssh_config" "$state/hostfile" "$state/hostfile.addr"
  rm -f "$env_file"
  up_hosts=0 up_net_only=0 made_run_netns=0 made_run_sshd=0
}

case "$cmd" in
status)
  gaps="$(missing_parts)"
  if [ -z "$gaps" ]; then
    echo "$prog: up ($state): $up_hosts hosts on $bridge $net.0/24 (this namespace $head_ip), $(shape_desc "$up_link" "$up_intra")"
    if [ "$up_net_only" = 1 ]; then
      echo "  namespaces and links only (--net-only): cluster_local.sh rsh HOST 'CMD' in place of ssh"
      exit 0
    fi
    declare -A st=()
    while read -r n s; do [ -n "$n" ] && st[$n]="$s"; done < <(node_states)
    for k in $(seq "$up_hosts"); do
      printf '  host%-4s %-12s sshd %-8s slurmd %-8s %s\n' "$k" "$(host_ip "$k")" "$(cat "$state/ssh/host$k/sshd.pid")" \
        "$(cat "$state/slurm/run/slurmd-host$k.pid")" "${st[host$k]:-unknown}"
    done
    echo "  slurmctld $(cat "$state/slurm/run/slurmctld.pid") on $head_name ($head_ip:$ctld_port), munged $(cat "$state/munge/munged.pid")"
    echo "  export SLURM_CONF=$conf; ssh -F $state/ssh_config host1; hostfiles $state/hostfile, $state/hostfile.addr"
    exit 0
  fi
  if [ "$gaps" = nothing ]; then
    echo "$prog: down ($state)"
  else
    echo "$prog: partly up ($state), missing: $(echo "$gaps" | paste -sd, | sed 's/,/, /g')"
  fi
  exit 3
  ;;

exec)
  [[ "$exec_host" =~ ^host([1-9][0-9]*)$ ]] || die "exec $exec_host: hosts are named host1..hostN"
  k="${BASH_REMATCH[1]}"
  [ "$k" -le "$up_hosts" ] && [ -e "/run/netns/$(ns_of "$k")" ] && mountpoint -q "$(uts_of "$k")" ||
    die "exec $exec_host: no such host up ($state; cluster_local.sh status)"
  on_host "$k" "${exec_argv[@]}"
  ;;

up)
  if [ "$up_hosts" -gt 0 ] && [ -z "$(missing_parts)" ]; then
    [ "$up_hosts" -eq "$hosts" ] ||
      die "up with $up_hosts hosts ($state); cluster_local.sh down first to have $hosts"
    if [ "$up_link" -eq "$link_mbit" ] && [ "$up_intra" -eq "$intra_mbit" ] && [ "$up_cpus" -eq "$cpus" ]; then
      echo "$prog: already up ($state): $up_hosts hosts, $(shape_desc "$up_link" "$up_intra")"
      exit 0
    fi
    [ "$up_cpus" -eq "$cpus" ] || die "up with --cpus $up_cpus ($state); cluster_local.sh down first to change it"
    [ "$up_net_only" -eq "$net_only" ] || die "up with --net-only $up_net_only ($state); cluster_local.sh down first to change it"
    shape_all "$link_mbit" "$intra_mbit"
    up_link="$link_mbit" up_intra="$intra_mbit"
    write_env
    echo "$prog: up ($state): $up_hosts hosts, reshaped: $(shape_desc "$up_link" "$up_intra")"
    exit 0
  fi
  owner="$(bridge_owner)"
  if ip link show "$bridge" > /dev/null 2>&1 && [ "$owner" != "$state" ]; then
    die "$bridge exists and belongs to another cluster (${owner:-not one of ours}); down that one first"
  fi
  ip route show | grep -q "^$net\.0/24 " && [ "$owner" != "$state" ] &&
    die "$net.0/24 is routed here already ($(ip route show | grep "^$net\.0/24 "))"
  # Half up (a crash, a partial start) or left over: start over.
  [ "$up_hosts" -gt 0 ] && { echo "$prog: half up ($(missing_parts | paste -sd, )); starting over" >&2; teardown; }
  up_hosts="$hosts" up_link="$link_mbit" up_intra="$intra_mbit" up_cpus="$cpus" up_net_only="$net_only"
  [ -d /run/netns ] || made_run_netns=1
  [ "$net_only" = 1 ] || [ -d /run/sshd ] || { mkdir -p /run/sshd; chmod 755 /run/sshd; made_run_sshd=1; }
  write_env
  up_failed() {
    local rc=$?
    [ "$rc" -eq 0 ] && return 0
    echo "$prog: up failed; taking down what it started" >&2
    teardown > /dev/null 2>&1 || true
  }
  trap up_failed EXIT
  mkdir -p "$state/ns" "$state/etc/slurm" "$state/log" "$state/ssh" "$state/munge" \
    "$state/slurm/state" "$state/slurm/run"
  chmod 700 "$state/ssh"

  # Names: one hosts file for every host (bound over /etc/hosts on each).
  {
    echo "# Written by scripts/cluster_local.sh ($state)"
    echo "127.0.0.1 localhost"
    echo "$head_ip $head_name"
    for k in $(seq "$hosts"); do echo "$(host_ip "$k") host$k"; done
  } > "$state/etc/hosts"
  seq "$hosts" | sed 's/^/host/' > "$state/hostfile"
  for k in $(seq "$hosts"); do host_ip "$k"; done > "$state/hostfile.addr"

  # The bridge (its alias names the state directory that owns it) and the root's address.
  ip link add "$bridge" type bridge || die "cannot create bridge $bridge (no bridge support in this kernel?)"
  ip link set "$bridge" alias "$state"
  ip addr add "$head_ip/24" dev "$bridge"
  ip link set "$bridge" up
  for k in $(seq "$hosts"); do
    ns="$(ns_of "$k")"
    ip netns add "$ns" || die "cannot create network namespace $ns"
    ip link add "ember-v$k" type veth peer name eth0 netns "$ns" || die "cannot create veth ember-v$k"
    ip link set "ember-v$k" master "$bridge" up
    ip -n "$ns" addr add "$(host_ip "$k")/24" dev eth0
    ip -n "$ns" link set eth0 up
    ip -n "$ns" link set lo up
    # A UTS namespace kept by a bind mount on DIR/ns/hostK.uts, named hostK.
    touch "$(uts_of "$k")"
    unshare --uts="$(uts_of "$k")" hostname "host$k" || die "cannot create host$k's UTS namespace"
  done
  shape_all "$link_mbit" "$intra_mbit"
  if [ "$net_only" = 1 ]; then
    trap - EXIT
    echo "$prog: up ($state): host1..host$hosts at $(host_ip 1)..$(host_ip "$hosts") on $bridge, $(shape_desc "$link_mbit" "$intra_mbit"); namespaces and links only (--net-only)"
    exit 0
  fi

  # ssh: one client key, a host key per host, sshd on each host's address only.
  ssh-keygen -q -t ed25519 -N "" -C "ember-cluster" -f "$state/ssh/id_ed25519" <<< y > /dev/null
  cp "$state/ssh/id_ed25519.pub" "$state/ssh/authorized_keys"
  chmod 600 "$state/ssh/authorized_keys"
  : > "$state/ssh/known_hosts"
  {
    echo "# Written by scripts/cluster_local.sh: ssh -F $state/ssh_config host1"
    for k in $(seq "$hosts"); do printf 'Host host%s\n    HostName %s\n' "$k" "$(host_ip "$k")"; done
    cat <<EOF
Host *
    User root
    IdentityFile $state/ssh/id_ed25519
    IdentitiesOnly yes
    UserKnownHostsFile $state/ssh/known_hosts
    GlobalKnownHostsFile /dev/null
    StrictHostKeyChecking yes
    BatchMode yes
    ConnectTimeout 5
    LogLevel ERROR
EOF
  } > "$state/ssh_config"
  chmod 644 "$state/ssh_config"
  for k in $(seq "$hosts"); do
    d="$state/ssh/host$k"
    mkdir -p "$d"
    ssh-keygen -q -t ed25519 -N "" -C "host$k" -f "$d/ssh_host_ed25519_key" <<< y > /dev/null
    echo "host$k,$(host_ip "$k") $(cut -d' ' -f1,2 "$d/ssh_host_ed25519_key.pub")" >> "$state/ssh/known_hosts"
    cat > "$d/sshd_config" <<EOF
# Written by scripts/cluster_local.sh: host$k's sshd.
ListenAddress $(host_ip "$k"):22
HostKey $d/ssh_host_ed25519_key
PidFile $d/sshd.pid
AuthorizedKeysFile $state/ssh/authorized_keys
PermitRootLogin prohibit-password
AllowUsers root
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
HostbasedAuthentication no
UsePAM no
PrintMotd no
PrintLastLog no
X11Forwarding no
Subsystem sftp internal-sftp
EOF
    /usr/sbin/sshd -t -f "$d/sshd_config" || die "host$k's sshd config is refused (sshd -t -f $d/sshd_config)"
    on_host "$k" /usr/sbin/sshd -f "$d/sshd_config" -E "$state/log/sshd-host$k.log" ||
      die "host$k's sshd did not start (see $state/log/sshd-host$k.log)"
  done

  # munge: the system key (created when missing), our own socket.
  key=/etc/munge/munge.key
  ensure_munge_key "$prog" "$state/munge"
  socket="$state/munge/munge.socket.2"
  rm -f "$socket" "$socket.lock"
  touch "$state/log/munged.log"; chown munge:munge "$state/log/munged.log"
  runuser -u munge -- munged --key-file="$key" --socket="$socket" --pid-file="$state/munge/munged.pid" \
    --log-file="$state/log/munged.log" --seed-file="$state/munge/munged.seed" ||
    die "munged did not start (see $state/log/munged.log)"

  # Slurm: slurmctld here, slurmd -N hostK on host K.
  : > "$state/slurm/plugstack.conf"
  nodes="$(seq -s, "$hosts" | sed 's/\([0-9]*\)/host\1/g')"
  {
    cat <<EOF
# Written by scripts/cluster_local.sh: $hosts hosts of a scratch cluster for Ember.
ClusterName=ember-cluster
SlurmctldHost=$head_name($head_ip)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$socket
SlurmctldPort=$ctld_port
SlurmdPort=$slurmd_port
StateSaveLocation=$state/slurm/state
SlurmdSpoolDir=$state/slurm/spool/%n
SlurmctldPidFile=$state/slurm/run/slurmctld.pid
SlurmdPidFile=$state/slurm/run/slurmd-%n.pid
SlurmctldLogFile=$state/log/slurmctld.log
SlurmdLogFile=$state/log/slurmd-%n.log
PlugStackConfig=$state/slurm/plugstack.conf
EOF
    slurm_conf_common 30
    for k in $(seq "$hosts"); do
      echo "NodeName=host$k NodeAddr=$(host_ip "$k") NodeHostname=host$k CPUs=$cpus State=UNKNOWN"
    done
    echo "PartitionName=ember Nodes=$nodes Default=YES MaxTime=INFINITE State=UP"
  } > "$conf.tmp"
  mv "$conf.tmp" "$conf"
  chmod 644 "$conf"
  ln -sfn "$conf" "$state/etc/slurm/slurm.conf"
  slurmctld -c -f "$conf" || die "slurmctld did not start (see $state/log/slurmctld.log)"
  for k in $(seq "$hosts"); do
    mkdir -p "$state/slurm/spool/host$k"
    on_host "$k" slurmd -f "$conf" -N "host$k" || die "host$k's slurmd did not start (see $state/log/slurmd-host$k.log)"
  done

  # Ready: every sshd answers by name, every node idle.
  for k in $(seq "$hosts"); do
    ok=0
    for _ in $(seq 50); do
      [ "$(ssh -F "$state/ssh_config" "host$k" hostname 2> /dev/null)" = "host$k" ] && { ok=1; break; }
      sleep 0.2
    done
    [ "$ok" -eq 1 ] || die "ssh host$k did not answer with its name within 10 s (see $state/log/sshd-host$k.log)"
  done
  idle=0
  for _ in $(seq 300); do  # 30 s
    idle="$(node_states | awk '$2 == "idle"' | wc -l)"
    [ "$idle" -eq "$hosts" ] && break
    sleep 0.1
  done
  [ "$idle" -eq "$hosts" ] ||
    die "$idle of $hosts nodes idle 30 s after start: $(node_states | paste -sd, ) (see $state/log/slurmctld.log)"
  trap - EXIT
  echo "$prog: up ($state): host1..host$hosts at $(host_ip 1)..$(host_ip "$hosts") on $bridge, $(shape_desc "$link_mbit" "$intra_mbit"); sshd and slurmd on each, slurmctld on $head_name"
  echo "$prog: ssh -F $state/ssh_config host1; export SLURM_CONF=$conf"
  ;;

down)
  owner="$(bridge_owner)"
  if [ "$up_hosts" -eq 0 ] && [ -z "$owner" ]; then
    echo "$prog: down ($state)"
    exit 0
  fi
  [ -z "$owner" ] || [ "$owner" = "$state" ] || [ "$up_hosts" -gt 0 ] ||
    die "$bridge belongs to the cluster in $owner, not $state"
  teardown
  echo "$prog: down ($state)"
  ;;
esac
