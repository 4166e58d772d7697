#!/usr/bin/env bash
# The README's main command: installs dependencies, builds, and runs the main job on an
# embedded default (synthetic Criteo-like data on localhost).
#
# Today the data pipeline is what runs: generate Criteo-like data, prepare it, and show
# its skew. Distributed training (PS + workers) is not available yet; this script says so
# rather than pretending.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/install_deps.sh"
bash "$root/scripts/build.sh"
bin="${EMBER_BUILD_DIR:-$root/build}/bin"
work="${EMBER_WORK_DIR:-$root/out/quickstart}"
mkdir -p "$work"

echo "== generating 200,000 Criteo-like rows (1/100 of Kaggle's cardinalities)"
"$bin/ember-data" gen --like criteo --rows 200000 --scale 0.01 --seed 1 --force -o "$work/criteo.tsv"
echo "== preparing the binary dataset (90% train, 10% validation)"
"$bin/ember-data" prep --format criteo --val-fraction 0.1 --force -o "$work/criteo" "$work/criteo.tsv"
echo "== table skew and Herald's degree of infrequency (8 workers, 10% cache)"
"$bin/ember-data" stats --workers 8 --cache-ratio 0.1 "$work/criteo"

if [ -x "$bin/ember-worker" ] && [ -x "$bin/ember-ps" ]; then
  echo "== training: see scripts/run_local.sh"
else
  echo "== training: not yet available (ember-ps and ember-worker are not built yet);"
  echo "   the dataset above is ready for them: $work/criteo"
fi
