#!/usr/bin/env bash
# Builds the modules that do not link LibTorch (common, data, cache, scheduler,
# transport, ps, bench) with AddressSanitizer + UndefinedBehaviorSanitizer into
# build-asan/ (or $EMBER_ASAN_BUILD_DIR) and runs their tests. Any report fails the run.
# (The worker's tests run under ASan too with `scripts/build.sh -DEMBER_SANITIZE=address`,
# at the cost of instrumenting the LibTorch-heavy worker: too slow for every CI run.)
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${EMBER_ASAN_BUILD_DIR:-$root/build-asan}"
bash "$root/scripts/install_deps.sh"
mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBER_SANITIZE=address -DEMBER_WITH_TORCH=OFF \
  > "$build/configure.log" 2>&1 || { cat "$build/configure.log"; echo "test_asan.sh: cmake configure failed"; exit 1; }
cmake --build "$build" -j "$(nproc)"
export ASAN_OPTIONS="halt_on_error=1:detect_leaks=1${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
ctest --test-dir "$build" -j "$(nproc)" --output-on-failure "$@"
