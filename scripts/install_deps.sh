#!/usr/bin/env bash
# Installs Ember's build and runtime dependencies from Debian 12 packages.
# Idempotent: when every package is already present it returns in well under a second.
# Usage: install_deps.sh [--ops]
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git clang-format
  libzmq3-dev cppzmq-dev
  libtbb-dev
  libboost-dev
  libibverbs-dev librdmacm-dev
  libgtest-dev libgmock-dev
  libcli11-dev libspdlog-dev libfmt-dev nlohmann-json3-dev
  libabsl-dev libxxhash-dev libzstd-dev zlib1g-dev libdivide-dev
  libtorch-dev libgloo-dev
  # LibTorch's dense layers call libblas.so.3: without OpenBLAS, Debian's reference BLAS
  # (2x slower on DLRM, 6x on DCNv2; docs/benchmarks.md). The OpenMP build follows
  # LibTorch's thread count (--torch-threads).
  libopenblas0-openmp
  prometheus-cpp-dev
  librdkafka-dev
  python3-matplotlib
)
# With --ops (the test command): what the operations tests run for real, a Prometheus
# server, a one-node Slurm cluster (scripts/slurm_local.sh), the sshd of each host of
# scripts/cluster_local.sh and PyTorch loading an ember-export. Without them those tests
# skip, saying why.
if [ "${1:-}" = "--ops" ]; then
  PACKAGES+=(prometheus slurm-wlm munge openssh-server python3-torch)
elif [ $# -gt 0 ]; then
  echo "install_deps: unknown argument '$1' (--ops or none)" >&2
  exit 2
fi

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if [ ${#missing[@]} -eq 0 ]; then
  echo "install_deps: all ${#PACKAGES[@]} packages already installed"
  exit 0
fi

echo "install_deps: installing ${#missing[@]} package(s): ${missing[*]}"
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
# Refresh the package lists only when they are missing or older than a day.
if [ -z "$(find /var/lib/apt/lists -maxdepth 1 -name '*Packages*' -mtime -1 2>/dev/null | head -1)" ]; then
  $SUDO apt-get update -q
fi
$SUDO apt-get install -y -q --no-install-recommends "${missing[@]}"
echo "install_deps: done"
