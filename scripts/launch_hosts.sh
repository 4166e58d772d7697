#!/usr/bin/env bash
# The multi-node launcher over ssh: scripts/launch_hosts.py (its --help, and its header
# for hostfiles, spares and restarts), kept under this name for the commands users have.
#
#   scripts/launch_hosts.sh --hostfile hosts.txt --ps 2 --workers 8 --dataset /shared/criteo \
#       --policy herald --out /shared/runs/herald -- --model dlrm --iterations 1000
exec python3 "$(dirname "${BASH_SOURCE[0]}")/launch_hosts.py" "$@"
