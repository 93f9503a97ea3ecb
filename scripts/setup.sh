#!/usr/bin/env bash
# Installs memc's system dependencies from Debian's registry (idempotent), then configures and builds.
# Usage: scripts/setup.sh [--deps-only] [BUILD_DIR]
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(cmake g++ make ninja-build pkg-config
          libprotobuf-dev protobuf-compiler libonnx-dev libonnx-testdata
          libopenblas-dev libdnnl-dev libgtest-dev libgmock-dev libzip-dev zlib1g-dev
          libcli11-dev nlohmann-json3-dev
          libopenmpi-dev openmpi-bin  # backends/comm: CPU ranks under mpirun
          python3-pip  # scripts/cudnn_frontend.sh: the cuDNN frontend's headers from PyPI
          python3-venv python3-dev  # the Python package's test venv and its extension (tests/python/run.sh)
          chromium)  # headless: the timeline page's DOM test

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""; [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

[[ "${1:-}" == "--deps-only" ]] && exit 0
BUILD_DIR="${1:-build}"
# cuDNN attention (backends/cuda/cudnn_sdpa.cc) needs the cuDNN frontend's headers, from PyPI;
# without them the build goes on and leaves it out.
if command -v nvcc >/dev/null || [[ -x /usr/local/cuda/bin/nvcc ]]; then
  scripts/cudnn_frontend.sh || echo "setup: no cuDNN frontend headers; cuDNN attention is not built" >&2
fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build "$BUILD_DIR" -j"$(nproc)"
