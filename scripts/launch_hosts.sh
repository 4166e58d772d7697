#!/usr/bin/env bash
# Multi-node launcher over ssh (same configuration as ember_launch.py, one process per
# host slot). Assumes the repository, the build and the dataset are at the same path on
# every host (shared filesystem) and password-less ssh.
#
#   scripts/launch_hosts.sh --hostfile hosts.txt --ps 2 --workers 8 --dataset /shared/criteo \
#       --policy herald [--transport rdma] [--ssh-config FILE] --out /shared/runs/herald -- --model dlrm --iterations 1000
#
# hostfile: one host per line (# comments allowed), a name or an address as the hosts
# themselves resolve it. PS shard s runs on host s mod H, worker w on host (S + w) mod H.
# Rendezvous: ember-ps shard 0 binds the control plane at tcp://<its host>:PORT (--port,
# default 29600; 0: any free port) and publishes it in OUT/coordinator; every other
# process gets that endpoint and the job token (written to OUT/token, mode 600).
# Data-plane ports are chosen by each PS and exchanged over the control plane; the dense
# all-reduce (Gloo) store is hosted by worker 0 on a free port, also exchanged there.
# Each shard listens, and each worker binds Gloo, on its hostfile entry (a name is
# resolved on that host); each process states the entry as its host (ember-ps and
# ember-worker --host), which decides what counts as traffic within a host.
#
# --ssh-config FILE runs every ssh with -F FILE (for example a cluster_local.sh
# cluster's STATE/ssh_config, to launch from outside the cluster). --ps-args: extra
# arguments for every ember-ps, split on white space, {shard} becoming the shard's index;
# after `--`: arguments for every ember-worker (a --heartbeat-timeout-ms among either is
# also how long the launcher waits for the control plane's word on a failure).
#
# Output in OUT: each process's log (NAME.log), the workers' metrics (wN.jsonl), the
# shards' totals (psN.json) and summary.json (scripts/ember_job.py, as ember_launch.py
# writes it). When a process fails, the launcher names the member that failed first by
# the control plane's word (OUT/failure.json, written by shard 0), not by which process
# ended first, prints its last log lines and exits 1, closing the ssh sessions still open
# 4 s after that word (their remote processes get SIGHUP). Processes on a host that
# cannot be reached stop by themselves: the control plane's heartbeats fail the job.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
die() { echo "launch_hosts: $*" >&2; exit 2; }
hostfile="" ps=1 workers=1 dataset="" policy=herald out="" port=29600 ps_args="" bin="$root/build/bin" transport=tcp
ssh_config=""
while [ $# -gt 0 ]; do
  case "$1" in
    --hostfile) hostfile="$2"; shift 2;;
    --ps) ps="$2"; shift 2;;
    --workers) workers="$2"; shift 2;;
    --dataset) dataset="$2"; shift 2;;
    --policy) policy="$2"; shift 2;;
    --transport) transport="$2"; shift 2;;
    --out) out="$2"; shift 2;;
    --port) port="$2"; shift 2;;
    --ps-args) ps_args="$2"; shift 2;;
    --bin) bin="$2"; shift 2;;
    --ssh-config) ssh_config="$2"; shift 2;;
    --) shift; break;;
    *) die "unknown option $1";;
  esac
done
if [ -z "$hostfile" ] || [ -z "$dataset" ] || [ -z "$out" ]; then die "--hostfile, --dataset and --out are required"; fi
[[ "$ps" =~ ^[1-9][0-9]*$ ]] || die "--ps $ps: not a positive integer"
[[ "$workers" =~ ^[1-9][0-9]*$ ]] || die "--workers $workers: not a positive integer"
if ! [[ "$port" =~ ^[0-9]+$ ]] || [ "$port" -gt 65535 ]; then die "--port $port: not a port (0: any free port)"; fi
[ -z "$ssh_config" ] || [ -r "$ssh_config" ] || die "--ssh-config $ssh_config: not a readable file"
mapfile -t hosts < <(grep -v '^\s*#' "$hostfile" | awk 'NF{print $1}')
[ ${#hosts[@]} -gt 0 ] || die "$hostfile lists no hosts"
ssh_opts=(-o BatchMode=yes -tt)
[ -z "$ssh_config" ] || ssh_opts=(-F "$ssh_config" "${ssh_opts[@]}")
read -ra user_ps <<< "$ps_args"
worker_args=("$@")
# The heartbeat timeout the processes run with (the last one given wins, as in them).
hb_ms=10000
set -- "${user_ps[@]}" "${worker_args[@]}"
while [ $# -gt 0 ]; do
  case "$1" in
    --heartbeat-timeout-ms) [[ "${2:-}" =~ ^[0-9]+$ ]] && hb_ms="$2"; shift ;;
    --heartbeat-timeout-ms=*) [[ "${1#*=}" =~ ^[0-9]+$ ]] && hb_ms="${1#*=}" ;;
  esac
  shift
done

mkdir -p "$out"
out="$(cd "$out" && pwd)"
rm -f "$out"/w*.jsonl "$out"/ps*.json "$out/coordinator" "$out/failure.json" "$out/summary.json"
python3 "$root/scripts/ember_job.py" token "$out"  # mode 600, as every launcher writes it

pids=() names=()
# NAME HOST COMMAND...: the command on HOST, its arguments quoted for the remote shell.
# The process writes its log on its host (OUT is shared): a host cut off from this one
# still logs; ssh's own errors (a host that cannot be reached) go to the same file.
run() {
  local name="$1" host="$2" log="$out/$1.log"; shift 2
  : > "$log"
  # shellcheck disable=SC2029  # expanded here on purpose: the remote shell gets it quoted
  ssh "${ssh_opts[@]}" "$host" "cd $(printf '%q' "$root") && exec $(printf '%q ' "$@") >> $(printf '%q' "$log") 2>&1" \
    >> "$log" 2>&1 < /dev/null &
  pids+=($!); names+=("$name")
}
cleanup() {  # closes the ssh sessions still open: their remote processes get SIGHUP
  local p
  for p in "${pids[@]}"; do kill "$p" 2> /dev/null || true; done
}
trap cleanup EXIT
trap 'cleanup; exit 130' INT
trap 'cleanup; exit 143' TERM

coord="tcp://${hosts[0]}:$port"
for ((s = 0; s < ps; s++)); do
  h="${hosts[$((s % ${#hosts[@]}))]}"
  extra=()
  for x in "${user_ps[@]}"; do extra+=("${x//\{shard\}/$s}"); done
  if [ "$s" -eq 0 ]; then
    extra=(--coordinator-file "$out/coordinator" --failure-file "$out/failure.json" "${extra[@]}")
  fi
  run "ps$s" "$h" "$bin/ember-ps" --dataset "$dataset" --shard "$s" --shards "$ps" --workers "$workers" --listen "$h:0" --host "$h" \
    --coordinator "$coord" --transport "$transport" --token-file "$out/token" --stats-interval 30 \
    --summary-file "$out/ps$s.json" "${extra[@]}"
  if [ "$s" -eq 0 ]; then
    # Shard 0 publishes the control plane's endpoint once it is bound (the port it got).
    for _ in $(seq 600); do
      [ -s "$out/coordinator" ] && break
      kill -0 "${pids[0]}" 2> /dev/null || { echo "launch_hosts: ps0 ended before the job formed; its log:" >&2; tail -n 15 "$out/ps0.log" >&2; exit 1; }
      sleep 0.1
    done
    [ -s "$out/coordinator" ] || { echo "launch_hosts: ps0 did not publish its coordinator endpoint within 60 s (see $out/ps0.log)" >&2; exit 1; }
    coord="$(cat "$out/coordinator")"
  fi
done
for ((w = 0; w < workers; w++)); do
  h="${hosts[$(((ps + w) % ${#hosts[@]}))]}"
  run "worker$w" "$h" "$bin/ember-worker" --dataset "$dataset" --coordinator "$coord" --workers "$workers" --rank "$w" \
    --policy "$policy" --transport "$transport" --gloo-host "$h" --host "$h" --token-file "$out/token" \
    --metrics "$out/w$w.jsonl" "${worker_args[@]}"
done
echo "launch_hosts: $ps shard(s) on ${hosts[0]}$([ "$ps" -gt 1 ] && echo " ..") ($coord), $workers worker(s); output in $out"

# Wait for every process; at the first that fails, name the member that failed first.
declare -A name_of=()
for i in "${!pids[@]}"; do name_of[${pids[$i]}]="${names[$i]}"; done
live=("${pids[@]}")
failed="" failed_rc=0
while [ ${#live[@]} -gt 0 ]; do
  pid="" rc=0
  wait -n -p pid "${live[@]}" || rc=$?
  [ -n "$pid" ] || continue
  mapfile -t live < <(printf '%s\n' "${live[@]}" | grep -vx "$pid" || true)
  if [ "$rc" -ne 0 ]; then failed="${name_of[$pid]}" failed_rc=$rc; break; fi
done
if [ -n "$failed" ]; then
  # Shard 0 (the coordinator's host) writes the control plane's word when the job fails.
  for _ in $(seq $(( (hb_ms / 1000 + 5) * 10 ))); do
    [ -s "$out/failure.json" ] && break
    kill -0 "${pids[0]}" 2> /dev/null || break
    sleep 0.1
  done
  # The others stop by themselves on that word (a worker blocked in the all-reduce after
  # its 3 s grace): they get that long, and 1 s, to log why before their sessions close.
  for _ in $(seq 40); do
    mapfile -t live < <(for p in "${live[@]}"; do kill -0 "$p" 2> /dev/null && echo "$p"; done)
    [ ${#live[@]} -gt 0 ] || break
    sleep 0.1
  done
  log="$out/$failed.log"
  if [ -s "$out/failure.json" ]; then
    echo "launch_hosts: the job failed; by the control plane: $(cat "$out/failure.json")" >&2
    member="$(sed -n 's/.*"member":"\([a-z]*\) \([0-9]*\)".*/\1\2/p' "$out/failure.json")"
    [ -n "$member" ] && [ -f "$out/$member.log" ] && log="$out/$member.log"
  else
    echo "launch_hosts: $failed exited with status $failed_rc" >&2
  fi
  echo "== last lines of $log" >&2
  tail -n 15 "$log" >&2
  exit 1
fi
python3 "$root/scripts/ember_job.py" summarize "$out" --ps "$ps" --workers "$workers" --policy "$policy" \
  --transport "$transport" --bin "$bin" -- "${worker_args[@]}"
