#!/usr/bin/env bash
# Builds the libFuzzer targets with clang into build-fuzz/ and runs the message decoder
# fuzzer for $1 seconds (default 60). Needs clang and libclang-rt-14-dev (libFuzzer).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-60}"
build="$root/build-fuzz"
mkdir -p "$build"
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBER_FUZZ=ON \
  -DEMBER_WITH_TORCH=OFF -DEMBER_WITH_TESTS=OFF -DEMBER_WITH_BENCH=OFF > "$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" --target fuzz_message
mkdir -p "$build/corpus"
"$build/bin/fuzz_message" -max_total_time="$seconds" -max_len=256 "$build/corpus"
