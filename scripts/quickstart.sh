#!/usr/bin/env bash
# The README's main command: installs dependencies, builds, and runs the main job on an
# embedded default (synthetic Criteo-like data on localhost).
#
# Today the data pipeline is what runs: generate Criteo-like data, prepare it, show its
# skew, and simulate the scheduling policies' traffic on it. Distributed training needs
# ember-worker, which does not exist yet; this script says so rather than pretending.
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

echo "== embedding traffic per scheduling policy (ember-sim: 8 workers x 128 samples, 10% cache)"
"$bin/ember-sim" --data "$work/criteo" --policies vanilla,laia,plan,herald --iterations 150 --warmup 20 -q

if [ -x "$bin/ember-worker" ]; then
  echo "== training: see scripts/run_local.sh"
else
  echo "== training: not yet available: ember-ps (parameter server) is built, ember-worker is not yet;"
  echo "   the dataset above is ready for them: $work/criteo"
fi
