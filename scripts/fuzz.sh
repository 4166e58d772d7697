#!/usr/bin/env bash
# Builds the libFuzzer targets with clang into build-fuzz/ and runs each decoder's fuzzer
# (the data plane's message header, the control plane's JSON messages) for $1 seconds
# (default 60). Needs clang and libclang-rt-14-dev (libFuzzer). Any crash fails the script.
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
seconds="${1:-60}"
build="$root/build-fuzz"
mkdir -p "$build"
CC=clang CXX=clang++ cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DEMBER_FUZZ=ON \
  -DEMBER_WITH_TORCH=OFF -DEMBER_WITH_TESTS=OFF -DEMBER_WITH_BENCH=OFF > "$build/configure.log" 2>&1 || { cat "$build/configure.log"; exit 1; }
cmake --build "$build" -j "$(nproc)" --target fuzz_message fuzz_control

mkdir -p "$build/corpus-message" "$build/corpus-control"
# Seeds for the control decoder: one valid message of each kind, so the fuzzer starts
# from the accepted shapes.
i=0
h16=00112233445566778899aabbccddeeff
for seed in "{\"op\":\"hello\",\"nonce\":\"$h16\"}" "{\"op\":\"challenge\",\"nonce\":\"$h16\",\"proof\":\"$h16$h16\"}" \
  "{\"op\":\"join\",\"proof\":\"$h16$h16\",\"role\":\"worker\",\"rank\":-1,\"data\":\"\"}" '{"op":"hb"}' \
  '{"op":"barrier","group":1,"gen":7}' '{"op":"publish","key":"k","value":"v"}' '{"op":"lookup","key":"k"}' \
  '{"op":"add","id":3,"key":"k","delta":-2}' '{"op":"leave"}' '{"op":"abort","why":"x"}' \
  '{"op":"welcome","rank":0,"ps":1,"workers":1,"peers":[{"role":"ps","rank":0,"data":"h:1"},{"role":"worker","rank":0,"data":""}]}' \
  '{"op":"dead","member":"worker 1","why":"no heartbeat"}' '{"op":"added","id":3,"value":9}'; do
  printf '%s' "$seed" > "$build/corpus-control/seed-$i"
  i=$((i + 1))
done
"$build/bin/fuzz_message" -max_total_time="$seconds" -max_len=256 "$build/corpus-message"
"$build/bin/fuzz_control" -max_total_time="$seconds" -max_len=4096 "$build/corpus-control"
