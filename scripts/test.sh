#!/usr/bin/env bash
# Installs dependencies, builds, and runs the test suite (the README's test command).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
bash "$root/scripts/install_deps.sh" --ops
bash "$root/scripts/build.sh"
# Tests labelled `long` (the full resume matrix, about 15 minutes) run with: ctest -L long
ctest --test-dir "${EMBER_BUILD_DIR:-$root/build}" -j "$(nproc)" --output-on-failure -LE long "$@"
