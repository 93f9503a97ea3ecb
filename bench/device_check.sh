#!/usr/bin/env bash
# The CUDA backend's device check (issue 7), for a lent GPU machine: one call, a few minutes.
#
# That machine has the CUDA toolkit but no package registry and none of memc's other
# dependencies, so this builds only what the CUDA backend needs (backends/cuda, its test, the
# host sources they use) with nvcc directly, against GoogleTest unpacked from Debian's
# package that scripts/device_deps.sh downloads here into .devdeps/ (carried to the machine).
#
# Here:    scripts/device_deps.sh
# Device:  run(command="bash bench/device_check.sh", carry=[".devdeps"], timeout_s=480)
# Output:  $OUT/device_check.txt (nvidia-smi, the build, the test run) and $OUT/cuda_backend_test.xml
set -euo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-/tmp/memc-device-check}
mkdir -p "$out"
log="$out/device_check.txt"
exec > >(tee "$log") 2>&1
echo "== $(date -u) $(git rev-parse --short HEAD 2>/dev/null || echo no-git)"
nvidia-smi --query-gpu=name,memory.total,driver_version,compute_cap --format=csv || true
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
"$NVCC" --version | tail -1
root=/tmp/memc-devroot
rm -rf "$root" && mkdir -p "$root"
if ! ls .devdeps/*.deb >/dev/null 2>&1; then
  echo "no .devdeps/*.deb: run scripts/device_deps.sh where apt works and carry .devdeps"
  exit 2
fi
for deb in .devdeps/*.deb; do dpkg -x "$deb" "$root"; done
gtest_inc="$root/usr/include"
gtest_lib="$root/usr/lib/x86_64-linux-gnu"
arch=${MEMC_CUDA_ARCH:-sm_90}
echo "== build for $arch"
time "$NVCC" -std=c++20 -O2 -arch="$arch" -I. -I"$gtest_inc" backends/cuda/cuda_backend.cu \
  backends/cuda/gemm.cu tests/cuda/backend_test.cc backends/cuda/workspace.cc ir/dtype.cc ir/tensor.cc ir/attr.cc support/status.cc \
  -L"$gtest_lib" -lgtest_main -lgtest -lcublasLt -lpthread -o "$out/cuda_backend_test"
echo "== run"
export LD_LIBRARY_PATH="$(dirname "$(dirname "$NVCC")")/lib64:${LD_LIBRARY_PATH:-}"  # libcublasLt
"$out/cuda_backend_test" --gtest_output="xml:$out/cuda_backend_test.xml"
rm -f "$out/cuda_backend_test"  # only the log and the XML come back
