#!/usr/bin/env bash
# A job watched by a real Prometheus server: starts Prometheus (Debian's prometheus
# package) scraping every endpoint of a localhost job every second, runs the job with
# ember_launch.py --metrics-port, and plots what Prometheus scraped (rows per second on
# the PS link, iteration time, cache hit ratio) with scripts/plot_prometheus.py.
#
#   scripts/metrics_demo.sh DATASET OUT [PS WORKERS POLICY [-- worker arguments]]
#   scripts/metrics_demo.sh out/quickstart/criteo out/metrics-demo 1 4 herald -- --iterations 3000
#
# Ports: Prometheus on $EMBER_PROMETHEUS_PORT (default 9090), the job's endpoints from
# $EMBER_METRICS_PORT (default 9400: shards first, then workers). Writes OUT/rows.png.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
[ $# -ge 2 ] || { echo "usage: $0 DATASET OUT [PS WORKERS POLICY [-- worker arguments]]" >&2; exit 2; }
dataset="$1" out="$2"; shift 2
ps="${1:-1}" workers="${2:-4}" policy="${3:-herald}"
shift $(( $# < 3 ? $# : 3 ))
[ "${1:-}" = "--" ] && shift
command -v prometheus > /dev/null || { echo "metrics_demo: no prometheus binary (apt-get install prometheus)" >&2; exit 2; }
prom_port="${EMBER_PROMETHEUS_PORT:-9090}" base="${EMBER_METRICS_PORT:-9400}"
py=/usr/bin/python3
[ -x "$py" ] || py=python3
mkdir -p "$out"
targets=""
for ((i = 0; i < ps + workers; i++)); do targets+="${targets:+, }'127.0.0.1:$((base + i))'"; done
cat > "$out/prometheus.yml" <<YML
global:
  scrape_interval: 1s
  scrape_timeout: 900ms
scrape_configs:
  - job_name: ember
    static_configs:
      - targets: [$targets]
YML
rm -rf "$out/tsdb"
prometheus --config.file="$out/prometheus.yml" --storage.tsdb.path="$out/tsdb" \
  --web.listen-address="127.0.0.1:$prom_port" > "$out/prometheus.log" 2>&1 &
prom=$!
trap 'kill $prom 2>/dev/null; wait $prom 2>/dev/null || true' EXIT
start=$(date +%s)
"$py" "$root/scripts/ember_launch.py" --dataset "$dataset" --ps "$ps" --workers "$workers" --policy "$policy" \
  --out "$out/run" --metrics-port "$base" -- "$@"
sleep 3  # the last scrapes
"$py" "$root/scripts/plot_prometheus.py" --prometheus "http://127.0.0.1:$prom_port" --start "$start" --end "$(date +%s)" \
  --title "Ember: $policy, $ps PS + $workers workers, scraped by Prometheus every 1 s" -o "$out/rows.png"
