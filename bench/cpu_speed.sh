#!/usr/bin/env bash
# CPU speed, memc against PyTorch side by side in one run (bench/journal/2026.md §22).
#   PY=/work/venv-export/bin/python bench/cpu_speed.sh            # ≈10 min on 2 busy cores, ≈2× with bf16-mixed
#   REPS=3 STEPS=20 B16=0 bench/cpu_speed.sh                      # without ViT-B/16
#   PRECISIONS=fp32 bench/cpu_speed.sh                            # fp32 only, even on a bf16 CPU
# Prints: the CPU (lscpu model name; avx2/avx512f/avx512_bf16/amx flags), the GEMM libraries'
# kernel choice (oneDNN's ISA, OpenBLAS's core), the load average beside each figure; then
# (1) sgemm 1536³ GFLOP/s, oneDNN (memc's gemm) and OpenBLAS, at 1 and 2 threads
#     (build/memc-gemm-bench, which also counts the heap oneDNN mallocs outside its scratchpad);
# (2) training-step time, memc and torch at 1 and 2 threads (bench/train_step.py: same ONNX
#     weights, data, batch, AdamW, no dropout; memc run --threads T, torch.set_num_threads(T)):
#     vit_tiny b64 and vit_small32 b32 (REPS processes × STEPS steps), then ViT-B/16 b8
#     (B16_REPS × B16_STEPS; bench/random_weights.py fills the skeleton; B16=0 skips it).
#     Each in fp32 and, when the CPU has avx512_bf16 or amx_bf16 (native bf16 dot products),
#     also in bf16-mixed (`--precisions fp32,bf16-mixed`: memc compile --precision bf16-mixed;
#     torch: f32 parameters and AdamW state, forward + loss under CPU autocast to bf16); without
#     those flags fp32 only, and one line says why. PRECISIONS=fp32|fp32,bf16-mixed overrides.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-/work/venv-export/bin/python}
REPS=${REPS:-3}; STEPS=${STEPS:-20}; B16=${B16:-1}; B16_REPS=${B16_REPS:-1}; B16_STEPS=${B16_STEPS:-3}
load() { cut -d' ' -f1-3 /proc/loadavg; }

echo "date: $(date -u '+%Y-%m-%d %H:%M UTC'); memc commit $(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . || echo '+dirty')"
echo "cpu: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores for this process"
flags=$(grep -m1 '^flags' /proc/cpuinfo | tr ' ' '\n' | grep -xE 'avx2|fma|avx512f|avx512bw|avx512_bf16|avx512_fp16|amx_tile|amx_bf16' | tr '\n' ' ' || true)
echo "flags: ${flags:-none of avx2/avx512f/avx512_bf16/amx}"
echo "torch: $("$PY" -c 'import torch; print(torch.__version__, "threads", torch.get_num_threads(), torch.backends.cpu.get_cpu_capability())')"
echo "load (1/5/15 min): $(load)"
if [[ -z "${PRECISIONS:-}" ]]; then
  if grep -qwE 'avx512_bf16|amx_bf16' <<<"$flags"; then
    PRECISIONS=fp32,bf16-mixed
  else
    PRECISIONS=fp32
    echo "bf16-mixed rows skipped: this CPU has neither avx512_bf16 nor amx_bf16, so bf16 GEMMs would be emulated (fp32 only)"
  fi
fi
echo "precisions: $PRECISIONS"

echo; echo "## sgemm 1536³ (GFLOP/s, median of 5)"
for t in 1 2; do
  echo "threads $t: $(build/memc-gemm-bench 1536 "$t")  load $(load)"
done
echo; echo "## ViT-B/16 b8's GEMM shapes, 1 thread (GFLOP/s: oneDNN f32 as memc calls it, OpenBLAS f32, memc bf16)"
build/memc-gemm-bench vit_b16 1

echo; echo "## training step"
"$PY" bench/train_step.py --models vit_tiny,vit_small32 --threads 1,2 --precisions "$PRECISIONS" \
  --reps "$REPS" --steps "$STEPS" --warmup 3 --json /tmp/cpu_speed_small.json
if [[ "$B16" == 1 ]]; then
  "$PY" bench/train_step.py --models vit_b_16 --threads 1,2 --precisions "$PRECISIONS" \
    --reps "$B16_REPS" --steps "$B16_STEPS" --warmup 1 --json /tmp/cpu_speed_b16.json
fi
echo "memc's GEMMs: $("$PY" -c 'import json; c = json.load(open("/tmp/cpu_speed_small.json"))["cases"][0]["raw"]["memc"][0]["host"]; print(c.get("gemm_library"), "| vector math", c.get("vector_math"), "| vector loops", c.get("vector_loops"), "| OpenBLAS core", c.get("openblas_core"))')"
echo "load at end: $(load)"
