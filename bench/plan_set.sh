#!/usr/bin/env bash
# Compiles a fixed set of plans (every committed model family × the memory passes, the budget
# search included) into DIR and lists each plan file's sha256 in DIR/SHA256SUMS. Refactors that
# must not change behaviour (issue 16) compare two such lists, before and after:
#   bash bench/plan_set.sh build/memc /tmp/before; ...; bash bench/plan_set.sh build/memc /tmp/after
#   diff /tmp/before/SHA256SUMS /tmp/after/SHA256SUMS
# Plans store the model's path relative to the plan, so compare DIRs in one parent folder; the
# logs name DIR as "OUT".
set -euo pipefail
MEMC=$(realpath "$1"); OUT=$2
cd "$(dirname "$0")/.."
rm -rf "$OUT"; mkdir -p "$OUT"; OUT=$(realpath "$OUT")
n=0
plan() {  # plan NAME MODEL ARGS...
  local name=$1 model=$2; shift 2
  local rc=0
  "$MEMC" compile "models/$model" -o "$OUT/$name.plan" --threads 2 "$@" >"$OUT/$name.log" 2>&1 || rc=$?
  echo "exit $rc" >>"$OUT/$name.log"
  sed -i "s|$OUT|OUT|g" "$OUT/$name.log"
  n=$((n + 1))
}
for opt in sgd momentum adam adamw adam8bit adafactor; do
  plan "tiny_$opt" vit_tiny.onnx --batch 8 --optimizer $opt
done
plan tiny_clip vit_tiny.onnx --batch 8 --clip-grad-norm 1.0 --schedule warmup-cosine --warmup-steps 3 --epochs 2
for p in bf16-mixed fp16-mixed bf16-true fp16-true; do plan "tiny_$p" vit_tiny.onnx --batch 8 --precision $p; done
plan tiny_mb4 vit_tiny.onnx --batch 8 --micro-batches 4
plan tiny_mb3 vit_tiny.onnx --batch 8 --micro-batches 3 --precision fp16-mixed
plan tiny_remat_blocks vit_tiny.onnx --batch 8 --remat blocks --optimizer sgd
plan tiny_remat_limit vit_tiny.onnx --batch 8 --remat 100KB
plan tiny_remat_pins vit_tiny.onnx --batch 8 --remat blocks,save=x
plan tiny_offload vit_tiny.onnx --batch 8 --offload optimizer --precision bf16-mixed
plan tiny_naive vit_tiny.onnx --batch 8 --attention naive --no-dropout
plan tiny_mb_remat vit_tiny.onnx --batch 8 --micro-batches 2 --remat blocks
for s in zero1 zero2 zero3; do
  plan "tiny_2_$s" vit_tiny.onnx --batch 8 --devices 2 --shard $s
  plan "tiny_4_${s}_bf16" vit_tiny.onnx --batch 8 --devices 4 --shard $s --precision bf16-mixed --clip-grad-norm 1
done
plan tiny_budget vit_tiny.onnx --batch 8 --budget 400KB
plan small32 vit_small32.onnx --batch 4
plan small32_bf16_remat vit_small32.onnx --batch 4 --precision bf16-mixed --remat blocks
plan text text_encoder.onnx --batch 4 --seq 32
plan text_mb text_encoder.onnx --batch 4 --seq 32 --micro-batches 2 --offload optimizer
plan bigbird_sparse bigbird_sparse_t215.onnx --batch 4
plan bigbird_sparse_naive bigbird_sparse_t215.onnx --batch 4 --attention naive
plan bigbird_full bigbird_full_t215.onnx --batch 4 --precision bf16-mixed
plan distilbert distilbert_t215.onnx --batch 4
plan distilbert_ts distilbert_ts_t215.onnx --batch 4 --remat blocks
plan bert bert_t215.onnx --batch 4
plan roberta roberta_t215.onnx --batch 4 --optimizer adafactor
plan vitb_h200 vit_b_16_skeleton.onnx --batch 8 --target h200
plan vitb_bf16_h200 vit_b_16_skeleton.onnx --batch 8 --target h200 --precision bf16-mixed --remat blocks
plan vitl_6GB vit_l_16_skeleton.onnx --batch 16 --target h200 --budget 6GB
plan vitl_2GB vit_l_16_skeleton.onnx --batch 16 --target h200 --budget 2GB
plan vitl_4x1GB vit_l_16_skeleton.onnx --batch 16 --target h200 --devices 4 --budget 1GB
plan distil_base distilbert_base_t215_skeleton.onnx --batch 16 --seq 512 --target h200 --budget 1.3GB
(cd "$OUT" && sha256sum ./*.plan ./*.log > SHA256SUMS)
echo "$n plans in $OUT ($(wc -l < "$OUT/SHA256SUMS") written)"
