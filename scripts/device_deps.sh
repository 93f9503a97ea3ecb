#!/usr/bin/env bash
# Downloads, from Debian's registry, the packages bench/device_check.sh unpacks on a lent GPU
# machine (which has no registry): GoogleTest's headers and static libraries. Into .devdeps/
# (git-ignored; the device tool carries it when named in `carry`).
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .devdeps
cd .devdeps
apt-get download libgtest-dev googletest >/dev/null
ls -1 *.deb
