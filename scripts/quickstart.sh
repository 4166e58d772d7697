#!/usr/bin/env bash
# The README's main command: installs dependencies, builds, and runs the main job on an
# embedded default (synthetic Criteo-like data on localhost).
#
# Generates a small Criteo-like dataset, shows its skew, predicts each policy's traffic
# (ember-sim), then trains DLRM with 1 PS and 4 workers over TCP, once with vanilla and
# once with herald (with lookahead, prefetch, the overlapped all-reduce and the refined
# allocation), and prints them side by side with a plot of loss and traffic. As root with
# iproute2 the PS and the workers sit in two network namespaces joined by a link shaped to
# 50 Mbit/s (EMBER_LINK_MBIT), and the table shows the bytes that crossed it; otherwise
# (or with EMBER_LOOPBACK=1) both jobs run over loopback, as the first line of that step
# says. scripts/readme_output.sh reruns it and writes its table into README.md.
#
# Builds only the four programs it runs (scripts/build.sh, which scripts/test.sh uses,
# builds everything, the tests included). EMBER_BUILD_LOCK=FILE: build under flock FILE.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/install_deps.sh"
build="${EMBER_BUILD_DIR:-$root/build}"
lock=()
[ -n "${EMBER_BUILD_LOCK:-}" ] && lock=(flock "$EMBER_BUILD_LOCK")
mkdir -p "$build"
if [ ! -f "$build/CMakeCache.txt" ]; then
  # The configuration scripts/build.sh makes; a configured tree is left as it is (cmake
  # --build reconfigures it when a CMakeLists.txt changed).
  "${lock[@]}" cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${EMBER_BUILD_TYPE:-RelWithDebInfo}" > "$build/configure.log" 2>&1 || {
    cat "$build/configure.log"; echo "quickstart: cmake configure failed (log above)"; exit 1; }
  grep -E "^-- ember:" "$build/configure.log" || true
fi
echo "== building ember-data, ember-sim, ember-ps, ember-worker"
"${lock[@]}" cmake --build "$build" -j "$(nproc)" --target ember-data ember-sim ember-ps ember-worker
bin="$build/bin"
built=$SECONDS
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
"$bin/ember-sim" --dataset "$work/criteo" --workers 4 --policy vanilla,laia,plan,herald --iterations ${EMBER_ITERATIONS:-300} --warmup 0 \
  --eval-every 100 --dim 16 --optimizer adagrad -q

# The jobs are examples/vanilla.toml and examples/herald.toml: DLRM with small MLPs so 4
# CPU workers train at a useful speed on a laptop-class machine. scripts/quickstart_jobs.py
# overrides the files' paths (EMBER_WORK_DIR, EMBER_BUILD_DIR) and iterations, gives herald
# its mechanisms, and makes the shaped link (docs/benchmarks.md#quickstart).
loopback=()
[ "${EMBER_LOOPBACK:-0}" = 1 ] && loopback=(--loopback)
"$py" "$root/scripts/quickstart_jobs.py" --dataset "$work/criteo" --work "$work" --bin "$bin" \
  --iterations "${EMBER_ITERATIONS:-300}" --link-mbit "${EMBER_LINK_MBIT:-50}" "${loopback[@]}"
echo "== vanilla vs herald (ratios against vanilla)"
"$py" "$root/scripts/compare_runs.py" "$work/run-vanilla" "$work/run-herald" --plot "$work/vanilla-vs-herald.png"
echo "quickstart: done in $SECONDS s, $((SECONDS - built)) s of it after the build step"
