#!/usr/bin/env bash
# The GPU machine's checks in one run (a lease is 15 minutes, start included): build with
# the carried bundle, the CUDA tests, the cache benchmark, training on the GPU against CPU
# workers, soft-RoCE, the whole suite with the time left, then the namespace cluster
# benchmark (scripts/bench_cluster.py --net-only). Every step's output lands
# in $OUT (the device tool's folder; out/device-check here), the step lines in
# summary.txt. A failed step is reported and the next one runs.
#
#   bash scripts/device_check.sh [--budget SECONDS] [--no-build] [--steps LIST]
#
# --budget    seconds for the whole run (default 540); the suite gets what is left
# --no-build  use an existing build (EMBER_BUILD_DIR, default build-device/): the dry run
#             on a development machine, where the CUDA steps skip saying why
# --steps     which of build,cuda,cache,gpu,pipeline,rdma,suite,cluster to run (default all):
#             a lease's second call can run the rest on the first call's build
#
# The machine has no iproute2: device-tools/ (scripts/device_tools.sh, carried) gives
# ip, tc and rdma for soft-RoCE and the cluster benchmark's namespaces.
#
# Environment: EMBER_BUILD_DIR, EMBER_JOBS (nproc), EMBER_GPU_ITERATIONS (60).
set -uo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
out="${OUT:-$root/out/device-check}"
build="${EMBER_BUILD_DIR:-$root/build-device}"
export EMBER_BUILD_DIR="$build"
jobs="${EMBER_JOBS:-$(nproc)}"
budget=540 do_build=1 steps="build,cuda,cache,gpu,pipeline,rdma,suite,cluster"
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) budget="$2"; shift ;;
    --no-build) do_build=0 ;;
    --steps) steps="$2"; shift ;;
    *) echo "device_check: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
for s in ${steps//,/ }; do
  [[ ",build,cuda,cache,gpu,pipeline,rdma,suite,cluster," == *",$s,"* ]] || { echo "device_check: --steps: unknown step '$s'" >&2; exit 2; }
done
want() { [[ ",$steps," == *",$1,"* ]]; }
want build || do_build=0
command -v ip >/dev/null || [ ! -x "$root/device-tools/bin/ip" ] || PATH="$root/device-tools/bin:$PATH"
mkdir -p "$out"
summary="$out/summary.txt"
: >"$summary"
say() { echo "[$SECONDS s] $*" | tee -a "$summary"; }
left() { echo $((budget - SECONDS)); }
# step NAME LOG LIMIT CMD...: runs CMD with a time limit, output appended to LOG.
step() {
  local name="$1" log="$2" limit="$3"
  shift 3
  [ "$limit" -gt 5 ] || { say "$name: skipped, no time left"; return 1; }
  echo "== $name ($*)" >>"$log"
  timeout --kill-after=5 "$limit" "$@" >>"$log" 2>&1
  local rc=$?
  if [ $rc = 0 ]; then say "$name: ok"; elif [ $rc = 124 ] || [ $rc = 137 ]; then say "$name: TIMED OUT after ${limit}s"; else say "$name: FAILED (exit $rc)"; fi
  return $rc
}

# 1. The machine.
env_log="$out/env.txt"
{
  echo "== date"; date -u
  echo "== kernel"; uname -r
  echo "== cpus $(nproc), memory"; free -g | head -2
  echo "== nvidia-smi"; nvidia-smi -L 2>&1; nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv 2>&1
  echo "== toolchain"; g++ --version | head -1; cmake --version | head -1; ninja --version 2>&1; nvcc --version 2>&1 | tail -2
  echo "== python"; python3 -c 'import torch; print(torch.__version__, torch.version.cuda, torch.cuda.is_available(), torch._C._GLIBCXX_USE_CXX11_ABI)' 2>&1
  echo "== network namespaces and tc"
  if ip netns add ember-check 2>&1; then
    ip -n ember-check link add v0 type veth peer name v1 2>&1 && echo "veth: ok"
    ip -n ember-check link add br0 type bridge 2>&1 && echo "bridge: ok"
    ip -n ember-check link set lo up && tc -n ember-check qdisc add dev lo root tbf rate 25mbit burst 131072 latency 50ms 2>&1 && echo "tc tbf: ok"
    ip netns del ember-check; echo "netns: ok"
  fi
  command -v tc >/dev/null && echo "tc: $(command -v tc)" || echo "tc: not installed"
  for t in nsenter unshare mountpoint runuser; do command -v "$t" >/dev/null || echo "$t: not installed"; done
} >"$env_log" 2>&1
say "machine: $(nvidia-smi -L 2>/dev/null | head -1 || echo 'no nvidia-smi'), $(nproc) cpus"

# Soft-RoCE: an RDMA device over the loopback interface, for the RDMA suite below.
{
  echo "== soft-RoCE"
  modprobe rdma_rxe 2>&1 || true
  echo "modules for $(uname -r): $(ls /lib/modules/"$(uname -r)" 2>&1 | head -3 | tr '\n' ' ')"
  echo "rxe in the kernel: $(grep -c ' rxe_' /proc/kallsyms 2>/dev/null) symbols; ib_core: $(grep -c ' ib_register_device' /proc/kallsyms 2>/dev/null)"
  if command -v rdma >/dev/null; then
    rdma link add rxe0 type rxe netdev lo 2>&1 ||
      { ip link add ember-rxe type veth peer name ember-rxe1 && ip link set ember-rxe up && ip link set ember-rxe1 up &&
        rdma link add rxe0 type rxe netdev ember-rxe 2>&1; }
    rdma link show 2>&1
  else echo "no rdma tool (iproute2's rdma)"; fi
  ls /sys/class/infiniband 2>&1
} >>"$env_log" 2>&1
if [ -n "$(ls /sys/class/infiniband 2>/dev/null)" ]; then rdma_up=1; say "soft-RoCE: up ($(ls /sys/class/infiniband | tr '\n' ' '))"; else rdma_up=0; say "soft-RoCE: no RDMA device (env.txt says why)"; fi

# 2. Build: the CUDA targets first, so that a failure elsewhere still leaves them to run.
blog="$out/build.log"
if [ "$do_build" = 1 ]; then
  if ! step "configure (LibTorch + CUDA)" "$blog" 300 bash "$root/scripts/device_build.sh" --configure-only; then
    step "configure without LibTorch (the CUDA cache alone)" "$blog" 120 bash "$root/scripts/device_build.sh" --configure-only --no-torch
  fi
  # gtest_discover_tests runs each test binary at build time: the bundle's libraries
  # (libzmq's libsodium, found through no RUNPATH) must be on the path then too.
  # shellcheck source=/dev/null
  [ -f "$build/device-env.sh" ] && . "$build/device-env.sh"
  keep=(-k 0)
  grep -q "CMAKE_GENERATOR:INTERNAL=Ninja" "$build/CMakeCache.txt" 2>/dev/null || keep=(-k)
  step "build the CUDA cache, its test and ember-bench" "$blog" "$(left)" cmake --build "$build" -j "$jobs" --target cuda_cache_test ember-bench -- "${keep[@]}"
  step "build the worker, the PS and training_test" "$blog" "$(left)" cmake --build "$build" -j "$jobs" --target ember-worker ember-ps ember-data training_test -- "${keep[@]}"
  step "build everything" "$blog" "$(( $(left) - 120 ))" cmake --build "$build" -j "$jobs" -- "${keep[@]}"
  grep -E "error:|FAILED:" "$blog" | head -40 >>"$summary"
fi
# shellcheck source=/dev/null
[ -f "$build/device-env.sh" ] && . "$build/device-env.sh"
bin="$build/bin"

# 3. The CUDA tests.
clog="$out/cuda.log"
if want cuda; then
  step "CudaEmbeddingCache test" "$clog" 120 "$bin/cuda_cache_test"
  step "training on CUDA (Training.*Cuda*)" "$clog" 240 "$bin/training_test" --gtest_filter='*Cuda*'
  grep -E "SKIPPED|FAILED|PASSED|Skipped|error" "$clog" | head -20 >>"$summary"
fi

# 4. The cache's gather and scatter-add against a device-to-device copy.
if want cache; then
  step "ember-bench cache" "$out/cache.txt" 120 "$bin/ember-bench" cache --device cuda && tail -n 12 "$out/cache.txt" >>"$summary"
fi

# 5. Training: CUDA and CPU workers on this machine.
glog="$out/gpu.txt"
gpu_limit=$(( $(left) - 200 ))
[ "$gpu_limit" -gt 300 ] && gpu_limit=300
if want gpu; then
  step "training: CUDA vs CPU workers (scripts/bench_gpu.py)" "$glog" "$gpu_limit" \
    python3 "$root/scripts/bench_gpu.py" --bin "$bin" --work "$root/out/bench-gpu" --iterations "${EMBER_GPU_ITERATIONS:-60}" --batch 1024 &&
    grep "^|" "$glog" >>"$summary"
  [ -f "$root/out/bench-gpu/gpu.json" ] && cp "$root/out/bench-gpu/gpu.json" "$out/gpu.json"
fi

# 5b. The pipeline's ceiling on one CUDA worker (the fused embedding path's kernels):
# a model that computes nothing, one-hot and MLPerf bags (scripts/bench_pipeline.py).
if want pipeline; then
  if python3 -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)' 2>/dev/null; then
    plog="$out/pipeline.txt"
    pipe_limit=$(( $(left) - 200 ))
    [ "$pipe_limit" -gt 240 ] && pipe_limit=240
    step "the pipeline's ceiling on CUDA (scripts/bench_pipeline.py)" "$plog" "$pipe_limit" \
      python3 "$root/scripts/bench_pipeline.py" --bin "$bin" --work "$root/out/bench-pipeline" --device cuda --workers 1 \
      --batches 1024,8192 --iterations 20 --configs vanilla,herald+lookahead &&
      grep "^|" "$plog" >>"$summary"
  else
    say "the pipeline on CUDA: skipped, torch sees no CUDA device"
  fi
fi

# 6. RDMA against TCP, when soft-RoCE came up.
# The data for the jobs below: the quickstart's 200,000 Criteo-like rows.
data="$root/out/bench-gpu/criteo"
if { want rdma || want cluster; } && [ ! -f "$data/manifest.json" ]; then
  mkdir -p "$root/out/bench-gpu"
  step "data: 200,000 Criteo-like rows" "$out/data.log" 120 bash -c "'$bin/ember-data' gen --like criteo --rows 200000 --scale 0.01 --seed 1 --force -o '$root/out/bench-gpu/c.tsv' && '$bin/ember-data' prep --format criteo --val-fraction 0.1 --force -o '$data' '$root/out/bench-gpu/c.tsv'"
fi
if [ "$rdma_up" = 1 ] && want rdma; then
  for t in tcp rdma; do
    step "job over --transport $t" "$out/rdma.txt" 120 python3 "$root/scripts/ember_launch.py" --dataset "$data" --ps 1 --workers 2 \
      --transport "$t" --policy herald --bin "$bin" --out "$root/out/rdma-$t" -q --timeout 110 -- --iterations 50 --batch-per-worker 256 \
      --progress-every 0 &&
      say "  $t: $(python3 -c "import json; s=json.load(open('$root/out/rdma-$t/summary.json')); print(round(s['samples_s']), 'samples/s')")"
  done
fi

# 7. The whole suite (the long label excluded, as in CI), leaving the cluster step its time.
if want suite; then
  reserve=0
  want cluster && reserve=200
  step "ctest -LE long" "$out/ctest.log" "$(( $(left) - 10 - reserve ))" ctest --test-dir "$build" -j "$jobs" -LE long --timeout 240 --output-on-failure
  grep -E "tests passed|tests failed|\(Failed\)|\(Timeout\)|\(SEGFAULT\)|\(Subprocess|Not Run|\*\*\*Skipped" "$out/ctest.log" | head -40 >>"$summary"
fi

# 8. 2 worker hosts x 4 workers on network namespaces, 25 Mbit/s and unshaped: flat
# against the host hierarchy (no sshd or Slurm here: --net-only).
if want cluster; then
  step "cluster benchmark (scripts/bench_cluster.py --net-only)" "$out/cluster.txt" "$(( $(left) - 10 ))" \
    python3 "$root/scripts/bench_cluster.py" --net-only --dataset "$data" --bin "$bin" --work "$root/out/bench-cluster" \
    --links 25,0 --repeats 1 --iterations "${EMBER_CLUSTER_ITERATIONS:-30}" --configs vanilla,herald+lookahead,herald+hosts --down &&
    grep "^|" "$out/cluster.txt" >>"$summary"
  [ -f "$root/out/bench-cluster/cluster.json" ] && cp "$root/out/bench-cluster/cluster.json" "$out/cluster.json"
fi
say "done"
