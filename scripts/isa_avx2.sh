#!/usr/bin/env bash
# The whole C++ suite as an AVX2-only CPU (AMD Zen 3, Intel Haswell) runs it, on any x86 machine:
# memc's own loops built without their AVX-512 clones (MEMC_VECTOR_ISA_CAP=x86-64-v3), oneDNN
# held to AVX2 and OpenBLAS to its Zen kernels. Builds into build-avx2 (about 10 minutes on
# 2 cores the first time); arguments go to ctest. Not part of scripts/test.sh: CI runs on
# whatever CPU it lands on, and this check is for a change to CPU kernels.
#   scripts/isa_avx2.sh                 # everything but the Python package and the docs site
#   scripts/isa_avx2.sh -R remat        # some tests
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh --deps-only
cmake -S . -B build-avx2 -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DMEMC_VECTOR_ISA_CAP=x86-64-v3 > /dev/null
cmake --build build-avx2 -j"$(nproc)"
export ONEDNN_MAX_CPU_ISA=AVX2 OPENBLAS_CORETYPE=Zen
echo "isa_avx2: $(lscpu | sed -n 's/^Model name: *//p'); vector loops and exp as an AVX2-only CPU, ONEDNN_MAX_CPU_ISA=$ONEDNN_MAX_CPU_ISA OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE"
build-avx2/memc --version
if (($#)); then
  ctest --test-dir build-avx2 -j"$(nproc)" --output-on-failure "$@"
else
  ctest --test-dir build-avx2 -j"$(nproc)" --output-on-failure -E '^(python\.|docs\.site)'
fi
