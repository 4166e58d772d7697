#!/usr/bin/env bash
# Configures and builds Ember into ./build (or $EMBER_BUILD_DIR). Extra arguments go to cmake.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
build="${EMBER_BUILD_DIR:-$root/build}"
mkdir -p "$build"
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE="${EMBER_BUILD_TYPE:-RelWithDebInfo}" "$@" > "$build/configure.log" 2>&1 || {
  cat "$build/configure.log"; echo "build.sh: cmake configure failed (log above)"; exit 1; }
grep -E "^-- ember:" "$build/configure.log" || true
cmake --build "$build" -j "$(nproc)"
