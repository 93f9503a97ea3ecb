#!/usr/bin/env bash
# memc's main job on the bundled model and data (the README's first command): installs and
# builds if needed, compiles the digits ViT (models/vit_tiny.onnx) into a training plan,
# trains it on data/digits_train.npz and prints its accuracy on data/digits_test.npz.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -x build/memc ] || scripts/setup.sh build >&2
out=${MEMC_DEMO_DIR:-$(mktemp -d)}
mkdir -p "$out"
# The demo's own outputs: replaced when it runs again in the same MEMC_DEMO_DIR (--force), and
# its checkpoint folder emptied so that the run trains afresh instead of resuming.
rm -rf "$out/checkpoint"
build/memc compile models/vit_tiny.onnx --batch 32 --optimizer adamw --lr 2e-3 \
  --schedule warmup-cosine --warmup-steps 100 --epochs 40 -o "$out/vit_tiny.plan" --force
build/memc run "$out/vit_tiny.plan" --data data/digits_train.npz --eval data/digits_test.npz \
  --checkpoint "$out/checkpoint" --json "$out/report.json" --force
build/memc export "$out/vit_tiny.plan" --weights "$out/checkpoint" -o "$out/vit_tiny_trained.onnx" --force
