#!/bin/sh
# ember-bench ps with both sides pinned, to the first CPU this process may use (any host,
# any cpuset): the figures come out and name the CPUs. Usage: pinned_smoke.sh EMBER_BENCH
set -eu
cpu=$(sed -n 's/^Cpus_allowed_list:[[:space:]]*\([0-9]*\).*/\1/p' /proc/self/status)
exec "$1" --json ps --seconds 0.05 --repeats 1 --dims 16 --threads 1 --ops push --rows 64 --num-keys 4096 \
  --server-cpus "$cpu" --client-cpus "$cpu"
