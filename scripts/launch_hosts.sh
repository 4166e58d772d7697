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
# Checkpoints and restarts, as ember_launch.py: --checkpoint-dir DIR (the shards' rows in
# DIR/ps, the workers' dense state in DIR/dense; shared by every host), --checkpoint-every
# N, --resume (from the newest checkpoint that verifies), and --max-restarts N: a failed
# job is started again, up to N times, from the newest checkpoint that verifies (from the
# start without one), with one line per restart naming the cause, the checkpoint and the
# iterations lost; the failed attempt's logs move to OUT/attempt-K. A failure a restart
# cannot mend (a process refusing its settings or its data: exit 2 or 3; a full disk; a
# bad launcher option) ends the job at once. summary.json then lists the restarts.
# --spares K: the hostfile's last K entries are spare hosts; before a restart, a host of
# the job that does not answer ssh is replaced by the next spare (all its entries: its
# processes keep their ranks, and the job its model). With no spare left, the launcher
# waits up to --host-wait S seconds (default 60) for the host to answer again (a link or
# a reboot that comes back), then ends the job saying so.
#
# --ssh-config FILE runs every ssh with -F FILE (for example a cluster_local.sh
# cluster's STATE/ssh_config, to launch from outside the cluster). --rsh 'PROGRAM ARGS'
# runs `PROGRAM ARGS HOST COMMAND` in place of ssh (as mpirun's rsh agent), for hosts that
# have no sshd: `cluster_local.sh --state DIR rsh` on a --net-only cluster. --ps-args: extra
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
ssh_config="" rsh="" ckpt="" every=0 resume=0 max_restarts=0 attempt=0 spares=0 host_wait=60
args=("$@")
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
    --rsh) rsh="$2"; shift 2;;
    --checkpoint-dir) ckpt="$2"; shift 2;;
    --checkpoint-every) every="$2"; shift 2;;
    --resume) resume=1; shift;;
    --max-restarts) max_restarts="$2"; shift 2;;
    --spares) spares="$2"; shift 2;;
    --host-wait) host_wait="$2"; shift 2;;
    --attempt) attempt="$2"; shift 2;;  # internal: one attempt of a job with --max-restarts
    --) shift; break;;
    *) die "unknown option $1";;
  esac
done
if [ -z "$hostfile" ] || [ -z "$dataset" ] || [ -z "$out" ]; then die "--hostfile, --dataset and --out are required"; fi
[[ "$ps" =~ ^[1-9][0-9]*$ ]] || die "--ps $ps: not a positive integer"
[[ "$workers" =~ ^[1-9][0-9]*$ ]] || die "--workers $workers: not a positive integer"
if ! [[ "$port" =~ ^[0-9]+$ ]] || [ "$port" -gt 65535 ]; then die "--port $port: not a port (0: any free port)"; fi
[ -z "$ssh_config" ] || [ -r "$ssh_config" ] || die "--ssh-config $ssh_config: not a readable file"
[[ "$every" =~ ^[0-9]+$ ]] || die "--checkpoint-every $every: not a number"
[[ "$max_restarts" =~ ^[0-9]+$ ]] || die "--max-restarts $max_restarts: not a number"
[[ "$spares" =~ ^[0-9]+$ ]] || die "--spares $spares: not a number"
[[ "$host_wait" =~ ^[0-9]+$ ]] || die "--host-wait $host_wait: not a number of seconds"
{ [ "$every" -eq 0 ] && [ "$resume" = 0 ]; } || [ -n "$ckpt" ] || die "--checkpoint-every and --resume need --checkpoint-dir"

# --max-restarts: this invocation runs the attempts (each this script again, with
# --attempt K) and restarts the failed ones. An attempt exits 3 for a failure a restart
# cannot mend, 2 for a bad launcher option, 1 for any other failure.
if [ "$max_restarts" -gt 0 ] && [ "$attempt" = 0 ]; then
  mkdir -p "$out"
  out="$(cd "$out" && pwd)"
  restarts=()
  k=1 again=()
  [ "$resume" = 1 ] && again=(--resume)
  # The launcher's own arguments and the workers' (after `--`): each attempt gets the
  # hosts it runs on (the hostfile's first entries; spares replace lost hosts) after the
  # former, so that they win.
  pre=() post=() seen=0
  for x in "${args[@]}"; do
    if [ "$seen" = 0 ] && [ "$x" = -- ]; then seen=1; continue; fi
    if [ "$seen" = 0 ]; then pre+=("$x"); else post+=("$x"); fi
  done
  mapfile -t entries < <(grep -v '^\s*#' "$hostfile" | awk 'NF{print $1}')
  [ "${#entries[@]}" -gt "$spares" ] || die "$hostfile lists ${#entries[@]} host(s), not more than --spares $spares"
  active=("${entries[@]:0:$(( ${#entries[@]} - spares ))}")
  spare=("${entries[@]:$(( ${#entries[@]} - spares ))}")
  ssh_probe=(ssh -o BatchMode=yes -o ConnectTimeout=5)
  [ -z "$ssh_config" ] || ssh_probe=(ssh -F "$ssh_config" "${ssh_probe[@]:1}")
  [ -z "$rsh" ] || read -ra ssh_probe <<< "$rsh"
  answers() { timeout 15 "${ssh_probe[@]}" "$1" true < /dev/null > /dev/null 2>&1; }
  while :; do
    rc=0
    printf '%s\n' "${active[@]}" > "$out/hosts-attempt-$k"
    # A restarted attempt's workers report the restarts (ember-worker --restart-record).
    record=()
    [ "$k" -gt 1 ] && record=(--restart-record "$out/restart-record.json")
    bash "${BASH_SOURCE[0]}" --attempt "$k" "${again[@]}" "${pre[@]}" --hostfile "$out/hosts-attempt-$k" --spares 0 -- "${post[@]}" "${record[@]}" || rc=$?
    lost_at="$(date +%s.%N)"
    if [ "$rc" = 0 ]; then
      if [ ${#restarts[@]} -gt 0 ]; then  # the restarts into summary.json
        printf '%s\n' "${restarts[@]}" | python3 -c '
import json, sys
p = sys.argv[1]
s = json.load(open(p))
s["restarts"] = [json.loads(l) for l in sys.stdin if l.strip()]
s["restart_count"] = len(s["restarts"])
s["iterations_recomputed"] = sum(r["iterations_lost"] for r in s["restarts"])
# From the last loss to training again, as worker 0 measured it (--restart-record).
for line in open(sys.argv[2]):
    w = json.loads(line)
    if w.get("summary") and "recovery_s" in w:
        s["restarts"][-1]["recovery_s"] = w["recovery_s"]
open(p + ".tmp", "w").write(json.dumps(s, indent=1) + "\n")
' "$out/summary.json" "$out/w0.jsonl" && mv "$out/summary.json.tmp" "$out/summary.json"
      fi
      exit 0
    fi
    [ "$rc" = 3 ] && { echo "launch_hosts: not restarted: a restart cannot mend this failure (above)" >&2; exit 1; }
    [ "$rc" = 2 ] && exit 2
    if [ "$k" -gt "$max_restarts" ]; then
      echo "launch_hosts: giving up: the job failed $k times, --max-restarts $max_restarts" >&2
      exit 1
    fi
    # A host that does not answer ssh is replaced by a spare: its processes keep their
    # ranks (the same hostfile entries), so the job trains the same model. With no spare
    # left, it may come back (a link down for a while, a reboot): waited for, --host-wait.
    replaced="" waited=""
    for h in $(printf '%s\n' "${active[@]}" | awk '!seen[$0]++'); do
      answers "$h" && continue
      if [ ${#spare[@]} -eq 0 ]; then
        echo "launch_hosts: host $h does not answer ssh and no spare host is left: waiting up to $host_wait s for it (--host-wait)" >&2
        from=$SECONDS
        until answers "$h"; do
          if [ $((SECONDS - from)) -ge "$host_wait" ]; then
            echo "launch_hosts: host $h is lost (no answer for $((SECONDS - from)) s) and no spare host is left: the job needs $(printf '%s\n' "${active[@]}" | sort -u | wc -l) hosts" >&2
            exit 1
          fi
          sleep 2
        done
        waited+=" $h answered again after $((SECONDS - from)) s;"
        continue
      fi
      for i in "${!active[@]}"; do [ "${active[$i]}" = "$h" ] && active[$i]="${spare[0]}"; done
      replaced+=" $h by the spare ${spare[0]};"
      spare=("${spare[@]:1}")
    done
    reached="$(python3 "$root/scripts/ember_job.py" reached "$out")"
    mkdir -p "$out/attempt-$k"
    mv "$out"/*.log "$out"/*.jsonl "$out"/failure.json "$out/attempt-$k/" 2> /dev/null || true
    point="" start=0 again=()
    if [ -n "$ckpt" ] && [ -d "$ckpt/ps" ] && point="$(python3 "$root/scripts/ember_job.py" resume-point "$ckpt" --bin "$bin")"; then
      start="$(basename "$point" | sed 's/^iter-0*//')"
      start="${start:-0}"
      again=(--resume)
    fi
    lost=$(( reached > start ? reached - start : 0 ))
    echo "launch_hosts: restart $k/$max_restarts: from ${point:-the start (no checkpoint verifies)}; $lost iteration(s) lost;${waited}${replaced:+ replaced$replaced} the failed attempt's logs in $out/attempt-$k" >&2
    restarts+=("{\"attempt\": $k, \"checkpoint\": \"$point\", \"resumed_at\": $start, \"iterations_lost\": $lost, \"replaced\": \"${replaced# }\", \"waited\": \"${waited# }\"}")
    printf '%s\n' "${restarts[@]}" > "$out/restarts.jsonl"
    python3 "$root/scripts/ember_job.py" restart-record "$out/restart-record.json" --restarts "$out/restarts.jsonl" --lost-at "$lost_at"
    k=$((k + 1))
  done
fi
mapfile -t hosts < <(grep -v '^\s*#' "$hostfile" | awk 'NF{print $1}')
[ ${#hosts[@]} -gt "$spares" ] || die "$hostfile lists ${#hosts[@]} host(s), not more than --spares $spares"
hosts=("${hosts[@]:0:$(( ${#hosts[@]} - spares ))}")  # the last --spares entries wait for a lost host
remote=(ssh -o BatchMode=yes -tt)
[ -z "$ssh_config" ] || remote=(ssh -F "$ssh_config" "${remote[@]:1}")
[ -z "$rsh" ] || read -ra remote <<< "$rsh"
read -ra user_ps <<< "$ps_args"
worker_args=("$@")
if [ -n "$ckpt" ]; then
  mkdir -p "$ckpt"
  ckpt="$(cd "$ckpt" && pwd)"
  ckpt_ps=(--checkpoint-dir "$ckpt/ps" --checkpoint-every "$every" --checkpoint-on-exit)
  if [ "$resume" = 1 ]; then
    restore="$(python3 "$root/scripts/ember_job.py" resume-point "$ckpt" --bin "$bin")" || exit 1
    ckpt_ps=(--restore "$restore" "${ckpt_ps[@]}")
    worker_args=(--checkpoint-dir "$ckpt/dense" --resume "${worker_args[@]}")
  else
    worker_args=(--checkpoint-dir "$ckpt/dense" "${worker_args[@]}")
  fi
  user_ps=("${ckpt_ps[@]}" "${user_ps[@]}")
fi
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
  "${remote[@]}" "$host" "cd $(printf '%q' "$root") && exec $(printf '%q ' "$@") >> $(printf '%q' "$log") 2>&1" \
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
    # Whether a restart can mend it is the failed member's exit status (it says which on
    # the control plane: "exit"), not the status of the first survivor to notice.
    said="$(sed -n 's/.*"exit":\([0-9]*\).*/\1/p' "$out/failure.json")"
    if [ -n "$member" ] && [ -n "$said" ]; then failed="$member" failed_rc="$said"; fi
  else
    echo "launch_hosts: $failed exited with status $failed_rc" >&2
  fi
  echo "== last lines of $log" >&2
  tail -n 15 "$log" >&2
  # For --max-restarts: 3 when a restart cannot mend it (exit 2: settings refused; 3: data
  # or model refused; a full disk), else 1.
  if [ "$attempt" != 0 ] && { [ "$failed_rc" = 2 ] || [ "$failed_rc" = 3 ] || grep -q "No space left on device" "$log" "$out/$failed.log" 2> /dev/null; }; then
    exit 3
  fi
  exit 1
fi
python3 "$root/scripts/ember_job.py" summarize "$out" --ps "$ps" --workers "$workers" --policy "$policy" \
  --transport "$transport" --bin "$bin" -- "${worker_args[@]}"
