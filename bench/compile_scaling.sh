#!/usr/bin/env bash
# Compile time where the step is large: many micro-batches (each one a copy of the forward and
# backward in the step), and the budget searches and refusals that compile many such plans.
# One run each; prints the CPU, wall and CPU seconds, and the planned peak or the refusal's
# floor. bench/journal/2026.md §63.
#   bench/compile_scaling.sh [MEMC]            (default build/memc)
set -uo pipefail
cd "$(dirname "$0")/.."
MEMC=${1:-build/memc}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores; memc: $("$MEMC" --version | head -1)"
run() {
  local name=$1
  shift
  rm -f "$out/p.plan"
  /usr/bin/time -f "%e %U" -o "$out/time" "$MEMC" compile "$@" -o "$out/p.plan" > "$out/log" 2>&1
  local rc=$?
  read -r wall cpu < <(tail -1 "$out/time")  # after "Command exited with non-zero status" on a refusal
  local what
  what=$(grep -o 'planned peak [^)]*)' "$out/log" | head -1)
  [ "$rc" = 3 ] && what="refused: $(grep -o 'smallest peak[^;]*' "$out/log" | head -1)"
  printf '%-40s exit %s  %6.2f s wall  %6.2f s cpu  %s\n' "$name" "$rc" "$wall" "$cpu" "$what"
}
run "vit_tiny b64, 64 micro-batches" models/vit_tiny.onnx --batch 64 --micro-batches 64 --remat blocks --offload params --precision bf16-mixed
run "vit_l_16 b16 h200, 16 micro-batches" models/vit_l_16_skeleton.onnx --batch 16 --target h200 --micro-batches 16 --precision fp32
run "vit_l_16 b16 h200, --budget 1GB" models/vit_l_16_skeleton.onnx --batch 16 --target h200 --budget 1GB
run "vit_l_16 b16 h200, --budget 500MB" models/vit_l_16_skeleton.onnx --batch 16 --target h200 --budget 500MB
run "vit_tiny b64, --budget 100KB" models/vit_tiny.onnx --batch 64 --budget 100KB
run "vit_small32 b32, --budget 3MB" models/vit_small32.onnx --batch 32 --budget 3MB
