#!/usr/bin/env bash
# Installs dependencies, builds, and runs the whole test suite (the README's test command).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh build
ctest --test-dir build -j"$(nproc)" --output-on-failure "$@"
