#!/usr/bin/env bash
# Planned per-device memory of ViT-L/16 at global batch 16, AdamW, bf16-mixed, target h200,
# for N = 1, 2, 4, 8 devices and zero1/zero2/zero3 (passes/shard.h), beside the ZeRO paper's
# model-state formulas for mixed precision with Adam (Ψ parameters): zero1 4Ψ+12Ψ/N,
# zero2 2Ψ+14Ψ/N, zero3 16Ψ/N. memc's bf16-mixed keeps the f32 parameters themselves as the
# masters (no bf16 copy is stored: the casts are forward nodes), so its model states are f32
# parameters, f32 gradients and f32 m, v: zero1 8Ψ+8Ψ/N, zero2 4Ψ+12Ψ/N (+ one unit's full
# gradient in flight), zero3 16Ψ/N (+ the gathered units).
# Usage: bench/shard_memory.sh [build/memc]   (compile only: no GPU, no data)
set -euo pipefail
memc=${1:-build/memc}
model=models/vit_l_16_skeleton.onnx
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# $(date -u +%F) $(lscpu | sed -n 's/^Model name: *//p'); $model, batch 16, adamw, bf16-mixed, --target h200"
"$memc" compile "$model" --batch 16 --target h200 -o "$tmp/p.plan" --force --json > "$tmp/s.json"
psi=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["param_count"])' "$tmp/s.json")
echo "Ψ = $psi parameters"
echo
echo "| N | stage | params | grads (peak) | optimizer states | model states | ZeRO formula | activations | planned peak | compile s |"
echo "|---|---|---|---|---|---|---|---|---|---|"
for n in 1 2 4 8; do
  for stage in zero1 zero2 zero3; do
    [ "$n" = 1 ] && [ "$stage" != zero1 ] && continue
    args=(--batch 16 --optimizer adamw --precision bf16-mixed --target h200)
    [ "$n" -gt 1 ] && args+=(--devices "$n" --shard "$stage")
    start=$(date +%s.%N)
    "$memc" compile "$model" "${args[@]}" -o "$tmp/p.plan" --force --json > "$tmp/s.json"
    secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
    python3 - "$tmp/s.json" "$n" "$([ "$n" = 1 ] && echo none || echo "$stage")" "$secs" "$psi" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1])); n = int(sys.argv[2]); stage = sys.argv[3]
psi = int(sys.argv[5])
c = s["category_peak_bytes"]
params, grads, opt = c["params"], c["grads"], c["optimizer_state"] + c["master_weights"]
P = psi
formula = {"none": 16 * P, "zero1": 4 * P + 12 * P / n, "zero2": 2 * P + 14 * P / n, "zero3": 16 * P / n}[stage]
gb = lambda b: "%.2f GB" % (b / 1e9)
print("| %d | %s | %s | %s | %s | %s | %s | %s | %s | %s |" % (n, stage, gb(params), gb(grads), gb(opt), gb(params + grads + opt),
      gb(formula), gb(c["activations"]), gb(s["predicted_peak_bytes"]), sys.argv[4]))
EOF
  done
done

# At the edge: per-block remat with the optimizer state, or the parameters too, in host memory
# (device bytes; the host arena beside them).
echo
echo "| N | settings | device peak | host arena | compile s |"
echo "|---|---|---|---|---|"
edge() {
  local n=$1; shift
  local args=(--batch 16 --optimizer adamw --precision bf16-mixed --target h200 "$@")
  [ "$n" -gt 1 ] && args+=(--devices "$n")
  local start secs
  start=$(date +%s.%N)
  "$memc" compile "$model" "${args[@]}" -o "$tmp/p.plan" --force --json > "$tmp/s.json"
  secs=$(awk -v a="$start" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1f", b - a }')
  python3 - "$tmp/s.json" "$n" "$*" "$secs" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
host = s.get("host_bytes") or 0
print("| %s | %s | %s B (%.2f GB) | %.2f GB | %s |" % (sys.argv[2], sys.argv[3], format(s["predicted_peak_bytes"], ","), s["predicted_peak_bytes"] / 1e9,
      host / 1e9, sys.argv[4]))
PY
}
edge 1 --remat blocks --offload optimizer
edge 1 --remat blocks --offload params
edge 4 --shard zero3 --remat blocks --offload optimizer
edge 4 --shard zero3 --remat blocks --offload params
