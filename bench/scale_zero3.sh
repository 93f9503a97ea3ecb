#!/usr/bin/env bash
# Scale on paper: memc's per-rank prediction for ZeRO-3 at 8, 64 and 512 H200s, over NVLink nodes
# (8 GPUs per node, one 400 Gb/s InfiniBand NIC per GPU between nodes) and over InfiniBand alone
# (every rank on its own NIC), for ViT-L/16, ViT-H/14 (torchvision skeletons) and a transformer
# with GPT-3 6.7B's dimensions (models/export_gpt_skeleton.py). bf16-mixed, AdamW, a fixed batch
# per rank (8 images, or 1 sequence of 2048 tokens), no budget: the plan as asked.
# Beside each row: ZeRO's model states 16Ψ/N (Rajbhandari et al. 2020) and DeepSpeed's own
# estimate_zero3_model_states_mem_needs without offload, 4·(largest layer) + 18Ψ/N
# (bench/deepspeed_estimate.py runs DeepSpeed's function itself; its log is
# bench/deepspeed_estimate_2026-12-05.log). Step and communication times are the cost model's
# (planner/cost_model.h: NCCL's ring/tree model), not measurements.
# Usage: bench/scale_zero3.sh [build/memc] > table.md   (compile only: no GPU, no data; ~1 min)
set -euo pipefail
memc=${1:-build/memc}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "# $(date -u +%F) $(lscpu | sed -n 's/^Model name: *//p'), memc $(git rev-parse --short HEAD 2>/dev/null || echo '?'); --target h200, bf16-mixed, adamw, --shard zero3"
echo
echo "| model | Ψ | N | interconnect | model states per rank | 16Ψ/N | DeepSpeed 4L + 18Ψ/N | planned peak per rank | step (est.) | collectives (est.) | not hidden (est.) |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
# name, file, per-rank batch, extra flags, largest layer (DeepSpeed's L)
while read -r name file rank_batch extra largest; do
  for n in 8 64 512; do
    for ic in nvlink ib; do
      args=(--batch $((rank_batch * n)) --optimizer adamw --precision bf16-mixed --target h200 --devices "$n" --shard zero3 --interconnect "$ic")
      [ "$extra" != "-" ] && args+=($extra)
      "$memc" compile "models/$file" "${args[@]}" -o "$tmp/p.plan" --force --json 2> /dev/null > "$tmp/s.json"
      python3 - "$tmp/s.json" "$name" "$n" "$ic" "$largest" <<'EOF'
import json, sys
s = json.load(open(sys.argv[1]))
name, n, ic, largest = sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
psi = s["param_count"]
cat = s["category_peak_bytes"]
states = cat["params"] + cat["grads"] + cat["optimizer_state"] + cat["master_weights"]
gb = lambda b: f"{b / 1e9:,.2f} GB"
print(f"| {name} | {psi / 1e6:,.0f} M | {n} | {ic} | {gb(states)} | {gb(16 * psi / n)} | "
      f"{gb(4 * largest + 18 * psi / n)} | {gb(s['predicted_peak_bytes'])} | {s['estimated_step_ms']:,.1f} ms | "
      f"{s['estimated_comm_ms']:,.1f} ms | {s['estimated_comm_exposed_ms']:,.1f} ms |")
EOF
    done
  done
done <<'MODELS'
ViT-L/16 vit_l_16_skeleton.onnx 8 - 4198400
ViT-H/14 vit_h_14_skeleton.onnx 8 - 6558720
GPT-3-6.7B-dims gpt_6b7_skeleton.onnx 1 --seq=2048 205852672
MODELS
