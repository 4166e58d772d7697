#!/usr/bin/env bash
# Configures and builds Ember on a GPU machine with no apt and no network: every
# dependency but LibTorch and CUDA comes from device-deps/ (scripts/device_bundle.sh,
# carried with the working tree), LibTorch from the Python package, CUDA from nvcc.
#
#   bash scripts/device_build.sh [--test] [--no-torch] [--bundle-only] [--configure-only] [CMAKE ARGS...]
#
# --test            run ctest after the build (with the bundle's libraries on LD_LIBRARY_PATH)
# --no-torch        build without LibTorch (-DEMBER_WITH_TORCH=OFF): no Python needed
# --bundle-only     CMake may not look in the system's folders at all: proves that the
#                   bundle alone satisfies Ember's dependencies (with --no-torch)
# --configure-only  stop after the configure and its checks
#
# Before configuring it checks that the host can run the bundle (glibc and libstdc++ at
# least as new as manifest.env says) and that LibTorch's C++ string ABI matches the
# bundle's; after, that every one of Ember's non-Torch dependencies resolved into the
# bundle. It writes BUILD/device-env.sh (LD_LIBRARY_PATH for the binaries and tests) and
# prints its export line. Environment: EMBER_DEVICE_DEPS (the bundle), EMBER_BUILD_DIR
# (default build-device/), EMBER_BUILD_TYPE (RelWithDebInfo), EMBER_CUDA_ARCHS (90),
# EMBER_TORCH_NCCL (on when LibTorch has NCCL and nccl.h is found; a CUDA wheel's
# CMake config defines USE_C10D_NCCL itself, so NCCL is compiled in either way), EMBER_JOBS (nproc),
# PYTHON (python3).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
deps="$(cd "${EMBER_DEVICE_DEPS:-$root/device-deps}" 2>/dev/null && pwd)" ||
  { echo "device_build: no bundle at ${EMBER_DEVICE_DEPS:-$root/device-deps}: run scripts/device_bundle.sh on Debian 12 and carry device-deps/" >&2; exit 1; }
build="${EMBER_BUILD_DIR:-$root/build-device}"
python="${PYTHON:-python3}"
jobs="${EMBER_JOBS:-$(nproc)}"

die() { echo "device_build: $*" >&2; exit 1; }
say() { echo "ember-device: $*"; }
ver_ge() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" = "$2" ]; }  # $1 >= $2

run_tests=0 with_torch=1 bundle_only=0 configure_only=0 cmake_args=()
for a in "$@"; do
  case "$a" in
    --test) run_tests=1 ;;
    --no-torch) with_torch=0 ;;
    --bundle-only) bundle_only=1 ;;
    --configure-only) configure_only=1 ;;
    *) cmake_args+=("$a") ;;
  esac
done

[ -f "$deps/manifest.env" ] || die "$deps has no manifest.env: rebuild it with scripts/device_bundle.sh"
# shellcheck source=/dev/null
. "$deps/manifest.env"
ma="$EMBER_BUNDLE_MULTIARCH"
lib="$deps/usr/lib/$ma"
[ "$(uname -m)" = x86_64 ] || die "the bundle is for x86-64, this is $(uname -m)"
for tool in cmake "${CC:-gcc}" "${CXX:-g++}" getconf; do command -v "$tool" >/dev/null || die "needs $tool on PATH"; done
cmake_need="$(sed -n 's/^cmake_minimum_required(VERSION \([0-9.]*\)).*/\1/p' "$root/CMakeLists.txt")"
cmake_have="$(cmake --version | sed -n 's/^cmake version \([0-9.]*\).*/\1/p')"
ver_ge "$cmake_have" "$cmake_need" || die "CMake $cmake_have is older than the $cmake_need that CMakeLists.txt needs"

# The host must be able to run what the bundle holds.
glibc="$(getconf GNU_LIBC_VERSION | awk '{print $2}')"
ver_ge "$glibc" "$EMBER_BUNDLE_GLIBC" ||
  die "the bundle's libraries need glibc $EMBER_BUNDLE_GLIBC, this host has $glibc (rebuild the bundle on an older Debian)"
libstdcxx="$(readlink -f "$(g++ -print-file-name=libstdc++.so.6)")"
[ -f "$libstdcxx" ] || die "cannot find g++'s libstdc++.so.6"
for v in "GLIBCXX_$EMBER_BUNDLE_GLIBCXX" "CXXABI_$EMBER_BUNDLE_CXXABI"; do
  grep -qa "$v" "$libstdcxx" || die "the bundle's C++ libraries need $v, which $libstdcxx lacks (g++ $(g++ -dumpversion) is too old)"
done
say "host: glibc $glibc, g++ $(g++ -dumpversion), cmake $cmake_have; bundle needs glibc >= $EMBER_BUNDLE_GLIBC, $libstdcxx with GLIBCXX_$EMBER_BUNDLE_GLIBCXX: ok"

args=(-DCMAKE_BUILD_TYPE="${EMBER_BUILD_TYPE:-RelWithDebInfo}"
  -DCMAKE_PREFIX_PATH="$deps/usr"
  -DPKG_CONFIG_EXECUTABLE="$deps/bin/pkg-config")
# Named in full: --bundle-only hides PATH from CMake's searches.
if command -v ninja >/dev/null && [ ! -f "$build/Makefile" ]; then args+=(-G Ninja -DCMAKE_MAKE_PROGRAM="$(command -v ninja)"); fi
args+=(-DCMAKE_C_COMPILER="$(command -v "${CC:-gcc}")" -DCMAKE_CXX_COMPILER="$(command -v "${CXX:-g++}")")
if [ "$bundle_only" = 1 ]; then
  [ "$with_torch" = 0 ] || die "--bundle-only goes with --no-torch (LibTorch and CUDA live in the system's folders)"
  args+=(-DCMAKE_FIND_USE_CMAKE_SYSTEM_PATH=OFF -DCMAKE_FIND_USE_SYSTEM_ENVIRONMENT_PATH=OFF
    -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF -DCMAKE_FIND_USE_SYSTEM_PACKAGE_REGISTRY=OFF
    "-DCMAKE_IGNORE_PREFIX_PATH=/usr;/usr/local;/")
fi
std_includes=()  # folders searched after all others (nccl.h, Gloo's headers)

# CUDA: nvcc from CUDACXX, PATH or /usr/local/cuda*; the kernels for EMBER_CUDA_ARCHS (H100: 90).
nvcc="${CUDACXX:-$(command -v nvcc || true)}"
if [ -z "$nvcc" ]; then
  for c in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
    if [ -x "$c" ]; then nvcc="$c"; break; fi
  done
fi
if [ -n "$nvcc" ]; then
  [ -x "$nvcc" ] || die "CUDACXX=$nvcc is not an executable"
  archs="${EMBER_CUDA_ARCHS:-90}"
  export CUDACXX="$nvcc" TORCH_CUDA_ARCH_LIST="${TORCH_CUDA_ARCH_LIST:-$(sed -E 's/([0-9])([0-9])(;|$)/\1.\2\3/g' <<<"$archs")}"
  args+=(-DCMAKE_CUDA_COMPILER="$nvcc" -DCMAKE_CUDA_ARCHITECTURES="$archs")
  say "CUDA: nvcc $("$nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p' | head -1) at $nvcc, architectures $archs"
else
  say "CUDA: no nvcc (CUDACXX, PATH, /usr/local/cuda*): a CPU-only build"
fi

torch_lib=""
if [ "$with_torch" = 0 ]; then
  args+=(-DEMBER_WITH_TORCH=OFF)
else
  command -v "$python" >/dev/null || die "no $python: LibTorch comes from the torch Python package (or use --no-torch)"
  info="$("$python" - <<'EOF'
import os, torch
import torch.distributed as dist
print("TORCH_VERSION=" + torch.__version__)
print("TORCH_PREFIX=" + torch.utils.cmake_prefix_path)
print("TORCH_DIR=" + os.path.dirname(torch.__file__))
print("TORCH_CXX11_ABI=" + str(int(torch._C._GLIBCXX_USE_CXX11_ABI)))
print("TORCH_CUDA=" + (torch.version.cuda or ""))
print("TORCH_NCCL=" + str(int(dist.is_available() and dist.is_nccl_available())))
print("TORCH_GLOO=" + str(int(dist.is_available() and dist.is_gloo_available())))
EOF
)" || die "$python cannot import torch (or use --no-torch)"
  eval "$(sed -n 's/^\(TORCH_[A-Z0-9_]*\)=\(.*\)$/\1='"'"'\2'"'"'/p' <<<"$info")"
  [ "$TORCH_CXX11_ABI" = "$EMBER_BUNDLE_CXX11_ABI" ] ||
    die "LibTorch $TORCH_VERSION has _GLIBCXX_USE_CXX11_ABI=$TORCH_CXX11_ABI, the bundle's C++ libraries (spdlog, fmt, GoogleTest) $EMBER_BUNDLE_CXX11_ABI: they cannot be linked together"
  [ "$TORCH_GLOO" = 1 ] || die "LibTorch $TORCH_VERSION has no Gloo (c10d): worker/src/collective.cc needs ProcessGroupGloo"
  torch_inc="$TORCH_DIR/include"
  torch_lib="$TORCH_DIR/lib"
  [ -f "$TORCH_PREFIX/Torch/TorchConfig.cmake" ] || die "no TorchConfig.cmake under $TORCH_PREFIX/Torch"
  args+=(-DEMBER_WITH_TORCH=ON -DTorch_DIR="$TORCH_PREFIX/Torch")
  say "LibTorch $TORCH_VERSION (CUDA ${TORCH_CUDA:-none}) at $TORCH_DIR, _GLIBCXX_USE_CXX11_ABI=$TORCH_CXX11_ABI like the bundle: ok"
  # ProcessGroupGloo.hpp includes Gloo's headers; the wheel may not ship them.
  if [ ! -f "$torch_inc/gloo/algorithm.h" ]; then
    [ -f "$deps/fallback/gloo/include/gloo/algorithm.h" ] || die "LibTorch ships no gloo/ headers and the bundle has no fallback"
    std_includes+=("$deps/fallback/gloo/include")
    say "Gloo headers: LibTorch ships none; using the bundle's ($(cat "$deps/fallback/gloo/VERSION")), declarations only"
  fi
  # The wheel ships its own fmt in its include folder, which worker/ puts on the -I path:
  # spdlog and fmt from the bundle must not be compiled against it.
  fmt_version() { cat "$1"/fmt/base.h "$1"/fmt/core.h 2>/dev/null | sed -n 's/^#define FMT_VERSION \([0-9]*\).*/\1/p' | head -1 || true; }
  if [ -d "$torch_inc/fmt" ] && [ "$(fmt_version "$torch_inc")" != "$(fmt_version "$deps/usr/include")" ]; then
    args+=(-DEMBER_INCLUDE_FIRST="$deps/usr/include")
    say "fmt: LibTorch ships fmt $(fmt_version "$torch_inc"), the bundle $(fmt_version "$deps/usr/include"); the bundle's include folder goes first"
  fi
  if [ -n "$TORCH_CUDA" ]; then
    [ -n "$nvcc" ] || die "LibTorch is a CUDA $TORCH_CUDA build but no nvcc was found (set CUDACXX)"
    # NCCL: ProcessGroupNCCL.hpp includes nccl.h, which the nvidia-nccl wheel or CUDA holds.
    nccl="${EMBER_TORCH_NCCL:-}" nccl_h=""
    if [ -z "$nccl" ] && [ "$TORCH_NCCL" = 1 ]; then
      nccl_h="$(find "$(dirname "$TORCH_DIR")/nvidia" "$(dirname "$(dirname "$nvcc")")/include" -name nccl.h 2>/dev/null | head -1 || true)"
      if [ -n "$nccl_h" ]; then
        nccl=ON; std_includes+=("$(dirname "$nccl_h")")
      elif echo '#include <nccl.h>' | g++ -E -x c++ - >/dev/null 2>&1; then
        nccl=ON
      else
        nccl=OFF; say "NCCL: LibTorch has it but no nccl.h was found: EMBER_TORCH_NCCL=OFF (Gloo on host tensors)"
      fi
    fi
    args+=(-DEMBER_TORCH_NCCL="${nccl:-OFF}")
    say "NCCL all-reduce (EMBER_TORCH_NCCL): ${nccl:-OFF}${nccl_h:+ (nccl.h in $(dirname "$nccl_h"))}"
  fi
fi
if [ ${#std_includes[@]} -gt 0 ]; then args+=("-DCMAKE_CXX_STANDARD_INCLUDE_DIRECTORIES=$(IFS=';'; echo "${std_includes[*]}")"); fi

mkdir -p "$build"
cmake -S "$root" -B "$build" "${args[@]}" "${cmake_args[@]}" >"$build/configure.log" 2>&1 ||
  { cat "$build/configure.log"; die "cmake configure failed (log above, in $build/configure.log)"; }
grep -E "^-- ember:" "$build/configure.log" || true

# Every one of Ember's dependencies but LibTorch and CUDA must have resolved into the bundle.
cache="$build/CMakeCache.txt"
value() { sed -n "s/^$1:[A-Z]*=\(.*\)$/\1/p" "$cache" | head -1; }
bad=0
check() {  # VAR [optional]
  local v
  v="$(value "$1")"
  if [ -z "$v" ] || [[ "$v" == *NOTFOUND ]]; then
    [ "${2:-}" = optional ] && return 0
    say "  $1 is not set"; bad=1; return 0
  fi
  case "$(readlink -f "$v")" in
    "$deps"/*) say "  $1=$v (bundle)" ;;
    *) say "  $1=$v: NOT in the bundle"; bad=1 ;;
  esac
}
say "dependencies (CMakeCache.txt):"
for v in PKG_CONFIG_EXECUTABLE TBB_DIR Boost_DIR cppzmq_DIR ZeroMQ_INCLUDE_DIR ZeroMQ_LIBRARY CLI11_DIR fmt_DIR spdlog_DIR \
  nlohmann_json_DIR ZLIB_INCLUDE_DIR ZLIB_LIBRARY_RELEASE LIBDIVIDE_INCLUDE_DIR pkgcfg_lib_XXHASH_xxhash; do
  check "$v"
done
for v in pkgcfg_lib_IBVERBS_ibverbs pkgcfg_lib_IBVERBS_rdmacm GTest_DIR; do check "$v" optional; done
[ "$bad" = 0 ] || die "some dependencies did not resolve into $deps (above)"
[ "$with_torch" = 0 ] || say "  Torch_DIR=$(value Torch_DIR)"

printf '# Written by scripts/device_build.sh: the libraries of the bundle (and LibTorch) for Ember'"'"'s binaries and tests.\nexport LD_LIBRARY_PATH="%s${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"\n' \
  "$lib${torch_lib:+:$torch_lib}" >"$build/device-env.sh"
if [ "$configure_only" = 1 ]; then say "configured in $build; for the binaries and tests: . $build/device-env.sh"; exit 0; fi

# gtest_discover_tests runs every test binary at build time, and libzmq's own needs
# (libsodium) are found through no RUNPATH: the bundle's folder goes on the path first.
# shellcheck source=/dev/null
. "$build/device-env.sh"
cmake --build "$build" -j "$jobs"
missing="$(for f in "$build"/bin/*; do [ -x "$f" ] && [ -f "$f" ] && ldd "$f" 2>/dev/null | grep 'not found' | sed "s|^|$(basename "$f"): |"; done | sort -u || true)"
[ -z "$missing" ] || die "libraries not found at run time: $missing"
say "built into $build/bin; for the binaries and tests: . $build/device-env.sh"
grep '^export' "$build/device-env.sh"
if [ "$run_tests" = 1 ]; then
  ctest --test-dir "$build" -j "$jobs" --output-on-failure
fi
