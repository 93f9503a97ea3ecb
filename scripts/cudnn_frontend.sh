#!/usr/bin/env bash
# Fetches the cuDNN frontend's C++ headers (header-only; backends/cuda/cudnn_sdpa.cc builds its
# attention graphs with them) into third_party/cudnn_frontend/include (git-ignored). They ship in
# the PyPI wheel nvidia-cudnn-frontend: pip downloads one pinned wheel (the cp311 x86_64 build,
# whatever the local Python; its headers are the same in every build), its SHA-256 is checked,
# and only include/ and the licenses are unpacked. Idempotent: skips when this version is there.
# If it fails, the build still works: CMake leaves the cuDNN attention out and a test says so.
set -euo pipefail
cd "$(dirname "$0")/.."

VERSION=1.32.0
WHEEL=nvidia_cudnn_frontend-$VERSION-cp311-cp311-manylinux_2_27_x86_64.manylinux_2_28_x86_64.whl
SHA256=c6006556017a4d1c914c52a556c71b1267f2d6a0500f742e7b4edef539878df0
DEST=third_party/cudnn_frontend

if [[ -f $DEST/include/cudnn_frontend.h && "$(cat "$DEST/VERSION" 2>/dev/null)" == "$VERSION" ]]; then
  exit 0
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download --quiet --no-deps --only-binary=:all: --implementation cp --python-version 3.11 \
  --abi cp311 --platform manylinux_2_28_x86_64 "nvidia-cudnn-frontend==$VERSION" -d "$tmp"
echo "$SHA256  $tmp/$WHEEL" | sha256sum --check --quiet
# A wheel is a zip; Python's zipfile needs no unzip binary. Unpacked beside DEST, then moved in,
# so an interrupted run never leaves a half-filled include/ that the check above would accept.
python3 - "$tmp/$WHEEL" "$tmp/out" <<'EOF'
import sys, zipfile
wheel, out = sys.argv[1], sys.argv[2]
with zipfile.ZipFile(wheel) as z:
    names = [n for n in z.namelist() if n.startswith("include/") or "/licenses/" in n]
    z.extractall(out, [n for n in names if not n.endswith("/")])
EOF
mkdir -p "$tmp/out/licenses"
mv "$tmp"/out/*.dist-info/licenses/* "$tmp/out/licenses/"
rm -rf "$tmp"/out/*.dist-info
echo "$VERSION" > "$tmp/out/VERSION"
rm -rf "$DEST"
mkdir -p "$(dirname "$DEST")"
mv "$tmp/out" "$DEST"
echo "cudnn_frontend.sh: cuDNN frontend $VERSION headers in $DEST/include"
