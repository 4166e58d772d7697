#!/usr/bin/env bash
# Multi-node launcher over ssh (same configuration as ember_launch.py, one process per
# host slot). Assumes the repository, the build and the dataset are at the same path on
# every host (shared filesystem) and password-less ssh.
#
#   scripts/launch_hosts.sh --hostfile hosts.txt --ps 2 --workers 8 --dataset /shared/criteo \
#       --policy herald [--transport rdma] --out /shared/runs/herald -- --model dlrm --iterations 1000
#
# hostfile: one host per line (# comments allowed). PS shard s runs on host s mod H,
# worker w on host (S + w) mod H. Rendezvous: ember-ps shard 0 binds the control plane at
# tcp://<its host>:PORT (--port, default 29600); every process gets that endpoint and the
# job token (written to OUT/token, mode 600). Data-plane ports are chosen by each PS and
# exchanged over the control plane; the dense all-reduce (Gloo) store is hosted by
# worker 0 on a free port, also exchanged there. Processes bind on their host's name as
# resolved by `hostname -f` (override with --bind-ip-cmd).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
hostfile="" ps=1 workers=1 dataset="" policy=herald out="" port=29600 ps_args="" bin="$root/build/bin" transport=tcp
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
    --) shift; break;;
    *) echo "launch_hosts: unknown option $1" >&2; exit 2;;
  esac
done
[ -n "$hostfile" ] && [ -n "$dataset" ] && [ -n "$out" ] || { echo "launch_hosts: --hostfile, --dataset and --out are required" >&2; exit 2; }
mapfile -t hosts < <(grep -v '^\s*#' "$hostfile" | awk 'NF{print $1}')
[ ${#hosts[@]} -gt 0 ] || { echo "launch_hosts: $hostfile lists no hosts" >&2; exit 2; }
mkdir -p "$out"
python3 "$root/scripts/ember_job.py" token "$out"  # mode 600, as every launcher writes it
coord="tcp://${hosts[0]}:$port"
pids=() names=()
run() {  # name host command...
  local name="$1" host="$2"; shift 2
  ssh -o BatchMode=yes -tt "$host" "cd '$root' && exec $*" > "$out/$name.log" 2>&1 < /dev/null &
  pids+=($!); names+=("$name")
}
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; }
trap cleanup EXIT INT TERM
for ((s = 0; s < ps; s++)); do
  h="${hosts[$((s % ${#hosts[@]}))]}"
  run "ps$s" "$h" "$bin/ember-ps --dataset '$dataset' --shard $s --shards $ps --workers $workers --listen $h:0 --coordinator $coord \
    --transport $transport --token-file '$out/token' --stats-interval 30 $ps_args"
  [ "$s" -eq 0 ] && sleep 2
done
for ((w = 0; w < workers; w++)); do
  h="${hosts[$(((ps + w) % ${#hosts[@]}))]}"
  run "worker$w" "$h" "$bin/ember-worker --dataset '$dataset' --coordinator $coord --workers $workers --rank $w --policy $policy \
    --transport $transport --gloo-host $h --token-file '$out/token' --metrics '$out/w$w.jsonl' $*"
done
status=0
for i in "${!pids[@]}"; do
  if ! wait "${pids[$i]}"; then
    echo "launch_hosts: ${names[$i]} failed; its last log lines:" >&2
    tail -n 15 "$out/${names[$i]}.log" >&2
    status=1
    break
  fi
done
exit $status
