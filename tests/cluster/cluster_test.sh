#!/usr/bin/env bash
# scripts/cluster_local.sh for real: a 3-host cluster on this machine.
#   1. up --hosts 3 --link-mbit 50: each host answers ssh by name with its own name (from
#      here with DIR/ssh_config, and from another host by plain `ssh hostK`); a key is
#      needed; sshd listens on the host's address only;
#   2. a host cannot be reached on another host's loopback;
#   3. 3 MB from host1 to host2 arrive at 40-55 Mbit/s; unshaped (up --link-mbit 0) at
#      more than 4 times that;
#   4. sinfo lists 3 idle nodes; `srun --nodes=3 hostname` and `sbatch --nodes=3` print
#      the 3 names, each step on its own host (its name, its address);
#   5. up again is a no-op (same daemons); status exits 0, and 3 once down;
#   6. down leaves no namespace, link, process or mount behind.
# Skips (exit 77, the reason printed) when not root, when a package is missing, when
# namespaces cannot be made, or when a cluster is up already (bridge ember-br0). `down`
# runs on any exit.
#   tests/cluster/cluster_test.sh SOURCE_DIR
set -euo pipefail
src="$(cd "${1:?usage: cluster_test.sh SOURCE_DIR}" && pwd)"
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*" >&2; exit 1; }
[ "$EUID" -eq 0 ] || skip "needs root (network namespaces, a bridge, sshd, slurmd)"
PATH="$PATH:/usr/sbin:/sbin"
for b in ip tc unshare nsenter mountpoint sshd ssh ssh-keygen munged slurmctld slurmd sinfo srun sbatch python3; do
  command -v "$b" > /dev/null || skip "$b is missing (bash scripts/install_deps.sh --ops)"
done
unshare --net --uts true 2> /dev/null || skip "cannot create network and UTS namespaces here"
ip link show ember-br0 > /dev/null 2>&1 && skip "a cluster is up already (bridge ember-br0): cluster_local.sh down it first"

t_start=$SECONDS
cl="$src/scripts/cluster_local.sh"
tp="$src/tests/cluster/throughput.py"
state="${EMBER_CLUSTER_TEST_DIR:-/var/lib/ember-cluster-test}"
export SLURM_CONF="$state/slurm.conf"
work="$(mktemp -d /tmp/ember-cluster-test.XXXXXX)"
cleanup() {
  local rc=$?
  bash "$cl" down --state "$state" > /dev/null 2>&1 || true
  if [ $rc -eq 0 ]; then rm -rf "$work"; else echo "(kept $work; logs in $state/log)" >&2; fi
}
trap cleanup EXIT
cl() { bash "$cl" --state "$state" "$@"; }
on() { local h="$1"; shift; bash "$cl" --state "$state" exec "$h" "$@"; }

# Mbit/s of BYTES sent from host $1 to host $2 (port $3), as the receiver measured it.
rate() {
  local from="$1" to="$2" port="$3" bytes="$4" out="$work/recv-$3"
  on "$to" python3 "$tp" recv "$to" "$port" 20 > "$out" &
  local rpid=$!
  on "$from" python3 "$tp" send "$to" "$port" "$bytes" || fail "sending $bytes bytes $from -> $to failed"
  wait "$rpid" || fail "receiving on $to failed"
  sed -n 's/^mbit=\([0-9.]*\) .*/\1/p' "$out"
}

echo "== up"
timeout 90 bash "$cl" up --state "$state" --hosts 3 --link-mbit 50 || fail "cluster_local.sh up failed"
cl status > "$work/status1" || fail "status exited $? while up"
cat "$work/status1"

echo "== ssh by name"
for k in 1 2 3; do
  name="$(ssh -F "$state/ssh_config" "host$k" hostname)" || fail "ssh host$k failed"
  [ "$name" = "host$k" ] || fail "ssh host$k printed '$name'"
  echo "ssh -F $state/ssh_config host$k hostname: $name"
done
name="$(on host1 ssh host3 hostname)" || fail "ssh host3 from host1 failed"
[ "$name" = host3 ] || fail "ssh host3 from host1 printed '$name'"
echo "on host1, ssh host3 hostname: $name"
# Without the cluster's key: refused (no password login).
err="$(ssh -F /dev/null -o BatchMode=yes -o PubkeyAuthentication=no -o StrictHostKeyChecking=no \
  -o UserKnownHostsFile=/dev/null -o LogLevel=ERROR root@10.77.0.11 true 2>&1)" &&
  fail "ssh without the cluster's key logged in"
case "$err" in *"Permission denied (publickey)"*) ;; *) fail "ssh without a key: '$err', not 'Permission denied (publickey)'" ;; esac
on host1 python3 "$tp" probe 127.0.0.1 22 && fail "host1's sshd answers on its loopback (it should listen on 10.77.0.11 only)"
echo "sshd: key only, on the host's address only"

echo "== loopbacks are the hosts' own"
on host1 python3 "$tp" listen 127.0.0.1 47311 5 &
lpid=$!
ok=0
for _ in $(seq 50); do on host1 python3 "$tp" probe 127.0.0.1 47311 && { ok=1; break; }; sleep 0.1; done
[ "$ok" -eq 1 ] || fail "host1 cannot reach its own listener on 127.0.0.1:47311"
on host2 python3 "$tp" probe 127.0.0.1 47311 && fail "host2 reached host1's loopback listener"
on host3 python3 "$tp" probe 127.0.0.1 47311 && fail "host3 reached host1's loopback listener"
wait "$lpid" || true
echo "host1 reaches its 127.0.0.1:47311, host2 and host3 do not"

echo "== shaped link"
shaped="$(rate host1 host2 5001 3000000)"
echo "3 MB host1 -> host2 at --link-mbit 50: $shaped Mbit/s"
python3 -c "import sys; r = float(sys.argv[1]); sys.exit(0 if 40 <= r <= 55 else 1)" "$shaped" ||
  fail "shaped rate $shaped Mbit/s is not within 40-55"

echo "== slurm"
sinfo
idle="$(sinfo -h -N -o '%N %T' | awk '$2 == "idle"' | wc -l)"
[ "$idle" -eq 3 ] || fail "sinfo lists $idle idle nodes, not 3: $(sinfo -h -N -o '%N %T' | paste -sd,)"
srun --nodes=3 sh -c 'echo "$(hostname) $SLURMD_NODENAME $(ip -4 -o addr show eth0 | awk "{print \$4}")"' |
  sort > "$work/srun" || fail "srun --nodes=3 failed"
echo "srun --nodes=3 (hostname, SLURMD_NODENAME, eth0's address):"
cat "$work/srun"
printf 'host1 host1 10.77.0.11/24\nhost2 host2 10.77.0.12/24\nhost3 host3 10.77.0.13/24\n' | diff - "$work/srun" > /dev/null ||
  fail "srun --nodes=3 did not run one step on each host with its own name and address"
names="$(srun --nodes=3 hostname | sort -u | paste -sd' ')"
[ "$names" = "host1 host2 host3" ] || fail "srun --nodes=3 hostname printed '$names'"
echo "srun --nodes=3 hostname: $names"
(cd "$work" && sbatch --wait --nodes=3 -o "$work/batch.out" --wrap 'srun hostname' > /dev/null) ||
  fail "sbatch --nodes=3 failed: $(cat "$work/batch.out" 2> /dev/null)"
names="$(sort -u "$work/batch.out" | paste -sd' ')"
[ "$names" = "host1 host2 host3" ] || fail "sbatch --nodes=3 --wrap 'srun hostname' printed '$names'"
echo "sbatch --nodes=3 --wrap 'srun hostname': $names"

echo "== up again"
out="$(bash "$cl" up --state "$state" --hosts 3 --link-mbit 50)" || fail "up again failed"
echo "$out"
case "$out" in *"already up"*) ;; *) fail "up again did something: $out" ;; esac
cl status > "$work/status2" || fail "status exited $? after up again"
diff "$work/status1" "$work/status2" > /dev/null || fail "up again changed the daemons: $(diff "$work/status1" "$work/status2")"

echo "== unshaped link"
bash "$cl" up --state "$state" --hosts 3 --link-mbit 0 || fail "up --link-mbit 0 failed"
unshaped="$(rate host1 host2 5002 30000000)"
echo "30 MB host1 -> host2 unshaped: $unshaped Mbit/s"
python3 -c "import sys; sys.exit(0 if float(sys.argv[1]) > 4 * float(sys.argv[2]) else 1)" "$unshaped" "$shaped" ||
  fail "unshaped rate $unshaped Mbit/s is not much above the shaped $shaped"

echo "== down"
pids=""
for k in 1 2 3; do pids+=" $(ip netns pids "ember-host$k" | tr '\n' ' ')"; done
pids+=" $(cat "$state/slurm/run/slurmctld.pid" "$state/munge/munged.pid")"
on host2 sleep 600 2> /dev/null &  # a process down must stop
sleep 0.3
pids+=" $(ip netns pids ember-host2 | tr '\n' ' ')"
bash "$cl" down --state "$state" || fail "down failed"
wait || true
status=0
cl status > /dev/null || status=$?
[ "$status" -eq 3 ] || fail "status exited $status once down, not 3"
left="$(ip netns list | grep ember-host || true)"
[ -z "$left" ] || fail "namespaces left: $left"
left="$(ip -o link show | grep -E 'ember-(br0|v[0-9])' || true)"
[ -z "$left" ] || fail "links left: $left"
for p in $pids; do
  [ -d "/proc/$p" ] && [ "$(cut -d' ' -f3 "/proc/$p/stat" 2> /dev/null)" != Z ] &&
    fail "process $p ($(tr '\0' ' ' < "/proc/$p/cmdline")) is still running"
done
left="$(grep -E "$state|/run/netns/ember-host" /proc/self/mountinfo || true)"
[ -z "$left" ] || fail "mounts left: $left"
echo "down: no namespace, link, process (of $(echo $pids | wc -w)) or mount left"

echo "PASS (${shaped} Mbit/s shaped, ${unshaped} Mbit/s unshaped) in $((SECONDS - t_start)) s"
