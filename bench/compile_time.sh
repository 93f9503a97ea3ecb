#!/usr/bin/env bash
# Compile (import + training step + schedule + memory plan) time of the torchvision vit_b_16
# and vit_l_16 skeletons at batch 16 with AdamW, median of 3 runs; prints the planned peak.
#   bench/compile_time.sh [build/memc]
set -euo pipefail
cd "$(dirname "$0")/.."
MEMC=${1:-build/memc}
out=$(mktemp -d)
for model in vit_b_16_skeleton vit_l_16_skeleton; do
  times=()
  for run in 1 2 3; do
    start=$(date +%s.%N)
    "$MEMC" compile "models/$model.onnx" --batch 16 --optimizer adamw --json --force -o "$out/$model.plan" >"$out/$model.json"
    end=$(date +%s.%N)
    times+=("$(echo "$end - $start" | bc)")
  done
  median=$(printf '%s\n' "${times[@]}" | sort -n | sed -n 2p)
  python3 -c '
import json, sys
d = json.load(open(sys.argv[1]))
peak, bound = d["predicted_peak_bytes"], d["lower_bound_bytes"]
grads, state = d["category_peak_bytes"]["grads"], d["breakdown"]["optimizer_state"]
print("%s: compile %.2f s (runs: %s), params %s, planned peak %s B, lower bound %s B, grads peak %s B, optimizer_state %s B" % (
    sys.argv[2], float(sys.argv[3]), sys.argv[4], format(d["param_count"], ","), format(peak, ","), format(bound, ","),
    format(grads, ","), format(state, ",")))
' "$out/$model.json" "$model" "$median" "${times[*]}"
done
rm -rf "$out"
