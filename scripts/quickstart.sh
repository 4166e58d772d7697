#!/usr/bin/env bash
# The README's main command: installs dependencies, builds, and runs the main job on an
# embedded default (synthetic Criteo-like data on localhost).
#
# Generates a small Criteo-like dataset, shows its skew, predicts each policy's traffic
# (ember-sim), then trains DLRM with 1 PS and 4 workers over TCP, once with vanilla and
# once with herald, and prints them side by side with a plot of loss and traffic.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/install_deps.sh"
bash "$root/scripts/build.sh"
bin="${EMBER_BUILD_DIR:-$root/build}/bin"
work="${EMBER_WORK_DIR:-$root/out/quickstart}"
mkdir -p "$work"
# Debian's interpreter has python3-matplotlib (a pyenv or venv python3 first on PATH may not).
py=/usr/bin/python3
[ -x "$py" ] || py=python3

echo "== generating 200,000 Criteo-like rows (1/100 of Kaggle's cardinalities)"
"$bin/ember-data" gen --like criteo --rows 200000 --scale 0.01 --seed 1 --force -o "$work/criteo.tsv"
echo "== preparing the binary dataset (90% train, 10% validation)"
"$bin/ember-data" prep --format criteo --val-fraction 0.1 --force -o "$work/criteo" "$work/criteo.tsv"
echo "== table skew and Herald's degree of infrequency (8 workers, 10% cache)"
"$bin/ember-data" stats --workers 8 --cache-ratio 0.1 "$work/criteo"

echo "== predicted embedding traffic per policy (ember-sim: 4 workers x 128 samples, 10% cache)"
# The same flushes as the jobs below (an evaluation every 100 iterations) and their row
# format (dim 16, Adagrad), so the prediction is what the jobs count on the wire.
"$bin/ember-sim" --data "$work/criteo" --workers 4 --policies vanilla,laia,plan,herald --iterations ${EMBER_ITERATIONS:-300} --warmup 0 \
  --eval-every 100 --dim 16 --optimizer adagrad -q

# The jobs are examples/vanilla.toml and examples/herald.toml: DLRM with small MLPs so 4
# CPU workers train at a useful speed on a laptop-class machine. The flags here override
# the files' paths (EMBER_WORK_DIR, EMBER_BUILD_DIR) and iterations.
for policy in vanilla herald; do
  echo "== training with $policy: 1 PS + 4 workers over TCP on localhost (examples/$policy.toml)"
  "$py" "$root/scripts/ember_launch.py" --config "$root/examples/$policy.toml" --dataset "$work/criteo" \
    --bin "$bin" --out "$work/run-$policy" -- --iterations "${EMBER_ITERATIONS:-300}"
done
echo "== vanilla vs herald (ratios against vanilla)"
"$py" "$root/scripts/compare_runs.py" "$work/run-vanilla" "$work/run-herald" --plot "$work/vanilla-vs-herald.png"
