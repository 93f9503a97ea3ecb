#!/usr/bin/env bash
# Fuzzes the ONNX importer with libFuzzer for N seconds (default 60):
#   scripts/fuzz.sh [SECONDS]
# Builds build-fuzz/ with the newest clang (-DMEMC_FUZZ=ON: ASan + UBSan + libFuzzer), starts from the
# committed seeds in tests/fuzz/corpus/ and keeps what it finds in fuzz-corpus/ (git-ignored).
# Crash reproducers land in build-fuzz/artifacts/; rerun one with build-fuzz/fuzz_import FILE.
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-60}
# The newest clang installed (clang 14 cannot capture structured bindings in lambdas, C++20).
cxx=""
for v in 19 18 17 16 15 14; do command -v "clang++-$v" >/dev/null && { cxx=clang++-$v; cc=clang-$v; break; }; done
[ -n "$cxx" ] || { command -v clang++ >/dev/null && cxx=clang++ && cc=clang; }
[ -n "$cxx" ] || { echo "fuzz.sh: clang not found (apt-get install -y clang-19 libclang-rt-19-dev)" >&2; exit 2; }
# A cache configured by another compiler cannot be switched in place.
if [ -f build-fuzz/CMakeCache.txt ] && ! grep -q "CMAKE_CXX_COMPILER:.*=$(command -v "$cxx")\$" build-fuzz/CMakeCache.txt; then
  rm -rf build-fuzz
fi
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
CC=$cc CXX=$cxx cmake -S . -B build-fuzz "${generator[@]}" -DMEMC_FUZZ=ON -DMEMC_BUILD_TESTS=OFF \
  -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
cmake --build build-fuzz --target fuzz_import -j"$(nproc)"
mkdir -p fuzz-corpus build-fuzz/artifacts
cp -n tests/fuzz/corpus/* fuzz-corpus/ 2>/dev/null || true
exec build-fuzz/fuzz_import -max_total_time="$seconds" -rss_limit_mb=4096 -timeout=20 \
  -artifact_prefix=build-fuzz/artifacts/ fuzz-corpus
