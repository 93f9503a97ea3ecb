#!/usr/bin/env python3
"""PyTorch eager's training step on a GPU, the counterpart of memc's in bench/device_check.sh.

    python3 bench/torch_gpu_step.py --model vit_b_16 --onnx /tmp/vitb.onnx --data /tmp/vit224.npz \
        --batch 16 --precision bf16-mixed --remat blocks

The same model and settings as memc's run beside it: torchvision vit_b_16 or vit_l_16 with the
weights of the ONNX file memc trains (bench/random_weights.py: every initializer whose name and
shape match a parameter), the first `batch` rows of the same .npz (x, y), AdamW (lr 1e-3, weight
decay 0.01), dropout as exported, and
  fp32        f32 everywhere, TF32 off (memc's default)
  bf16-mixed  autocast to bf16 for the forward and the loss, f32 parameters and AdamW state
  --remat blocks  torch.utils.checkpoint around each encoder block (memc's --remat blocks)
Prints one JSON line: step_ms_median over --runs steps after --warmup, and
torch.cuda.max_memory_allocated (PyTorch's own count of its allocations; the CUDA context and
cuBLAS's workspace are outside it).
"""
import argparse
import contextlib
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from torch_train_step import torchvision_from_onnx  # noqa: E402  (the same weights as the CPU benchmarks)


def checkpoint_blocks(model):
    import torch.utils.checkpoint as cp
    for block in model.encoder.layers:
        forward = block.forward
        block.forward = lambda x, f=forward: cp.checkpoint(f, x, use_reentrant=False)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_b_16", choices=["vit_b_16", "vit_l_16"])
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16-mixed"])
    ap.add_argument("--remat", default="none", choices=["none", "blocks"])
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()

    import numpy as np
    import torch
    import torch.nn.functional as F
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    dev = torch.device("cuda")
    model, loaded, of = torchvision_from_onnx(args.model, args.onnx)
    if args.remat == "blocks":
        checkpoint_blocks(model)
    model.to(dev).train()
    d = np.load(args.data)
    x = torch.from_numpy(d["x"][: args.batch]).to(dev)
    y = torch.from_numpy(d["y"][: args.batch]).to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)

    def autocast():
        if args.precision == "bf16-mixed":
            return torch.autocast(device_type="cuda", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    for _ in range(args.warmup):
        step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        loss = step()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t0) * 1e3)
    print(json.dumps({
        "model": args.model, "batch": args.batch, "precision": args.precision, "remat": args.remat,
        "step_ms_median": statistics.median(times), "step_ms_all": [round(t, 3) for t in times],
        "max_memory_allocated_bytes": torch.cuda.max_memory_allocated(),
        "last_loss": float(loss), "tensors_from_onnx": loaded, "of": of,
        "torch": torch.__version__, "gpu": torch.cuda.get_device_name(0),
    }))


if __name__ == "__main__":
    main()
