#!/usr/bin/env bash
# The demo's process footprint, memc against PyTorch eager, side by side (issue 32): peak RSS
# (the kernel's VmHWM / ru_maxrss) of memc training the digits ViT as scripts/demo.sh does, and of
# PyTorch training the same torchvision ViT with the same weights, batch 32, AdamW, 2 threads
# (bench/torch_train_step.py; its baseline is the process after importing torch, before the model).
#   PY=venv/bin/python bash bench/footprint_vs_torch.sh     (PY needs torch, torchvision, onnx)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-python3}
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | xargs), $(nproc) cores; memc $(git rev-parse --short HEAD)"
build/memc compile models/vit_tiny.onnx --batch 32 --optimizer adamw --lr 2e-3 --schedule warmup-cosine --warmup-steps 100 \
  --epochs 40 -o "$tmp/p.plan" >/dev/null
build/memc run "$tmp/p.plan" --data data/digits_train.npz --eval data/digits_test.npz --quiet --json "$tmp/r.json" >/dev/null
python3 - "$tmp/r.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f"memc    {r['steps']} steps, {r['step_ms']:.2f} ms/step, accuracy {100 * r['accuracy']:.2f} %: peak RSS {r['process_peak_rss_bytes'] / 2**20:.1f} MiB "
      f"(planned device peak {r['predicted_peak_bytes'] / 2**20:.1f} MiB)")
PY
PYTHONPATH=models "$PY" bench/torch_train_step.py --model vit_tiny --batch 32 --threads 2 --runs 20 2>/dev/null | tail -1 >"$tmp/t.json"
python3 - "$tmp/t.json" <<'PY'
import json, sys
t = json.load(open(sys.argv[1]))
print(f"PyTorch {t['torch_version']} eager, {t['runs']} timed steps, {t['step_ms_median']:.2f} ms/step: peak RSS {t['peak_rss_bytes'] / 2**20:.1f} MiB "
      f"(after import torch, before the model: {t['baseline_peak_rss_bytes'] / 2**20:.1f} MiB)")
PY
