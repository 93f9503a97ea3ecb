"""DeepSpeed's own ZeRO-2/ZeRO-3 model-state estimators (bench/journal/2026.md §21) for ViT-L/16,
ViT-H/14 and GPT-3 6.7B's dimensions at 8, 64 and 512 GPUs (8 per node), beside memc's plans in
bench/scale_zero3.sh (docs/distributed.md). Prints DeepSpeed's own tables
(estimate_zero{2,3}_model_states_mem_needs_all_cold), then one JSON line per (model, GPUs) with the
per-GPU bytes DeepSpeed's functions return without offload, beside ZeRO's 16Ψ/N (Rajbhandari et al.
2020). Model states only: no activations, no buffers; DeepSpeed's "GB" are GiB.
Needs deepspeed from PyPI with torch, in a venv outside the repo (torch as tests/python/run.sh
installs it, then DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed; no GPU needed);
never part of the build or tests. Its log: bench/deepspeed_estimate_2026-12-05.log.
Usage: python bench/deepspeed_estimate.py [PARAMS LARGEST_LAYER]   (one model of your own)"""
import importlib.metadata
import json
import sys

import deepspeed
import torch
from deepspeed.runtime.zero.stage3 import (estimate_zero3_model_states_mem_needs,
                                           estimate_zero3_model_states_mem_needs_all_cold)
from deepspeed.runtime.zero.stage_1_and_2 import (estimate_zero2_model_states_mem_needs,
                                                  estimate_zero2_model_states_mem_needs_all_cold)

# (name, Ψ, largest layer's params); the counts are memc inspect's on the torchvision skeletons and
# models/export_gpt_skeleton.py's GPT (d 4096, 32 layers, vocab 50257, 2048 positions, tied embedding).
MODELS = [("ViT-L/16", 304326632, 1024 * 4096 + 4096),   # an MLP linear 1024x4096 with bias
          ("ViT-H/14", 632045800, 1280 * 5120 + 5120),   # an MLP linear 1280x5120 with bias
          ("GPT-3 6.7B", 6658404352, 50257 * 4096)]      # the token embedding
if len(sys.argv) > 2:
    MODELS = [("custom", int(sys.argv[1]), int(sys.argv[2]))]
GPUS_PER_NODE = 8
NODES = (1, 8, 64)  # 8, 64, 512 GPUs


def package_version(name):
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


try:
    nccl = ".".join(map(str, torch.cuda.nccl.version()))
except Exception as e:  # no GPU or no NCCL: say what is installed
    nccl = f"unavailable ({type(e).__name__}: {e})"
print(f"deepspeed {deepspeed.__version__}, torch {torch.__version__}, torch.cuda.nccl.version() {nccl}, "
      f"nvidia-nccl-cu13 {package_version('nvidia-nccl-cu13')}, cuda available {torch.cuda.is_available()}")

rows = []
for name, params, largest in MODELS:
    for nodes in NODES:
        n = GPUS_PER_NODE * nodes
        print(f"=== {name}: {params:,} params, largest layer {largest:,}; {n} GPUs ({nodes} x {GPUS_PER_NODE})")
        estimate_zero2_model_states_mem_needs_all_cold(params, num_gpus_per_node=GPUS_PER_NODE, num_nodes=nodes)
        estimate_zero3_model_states_mem_needs_all_cold(params, largest, num_gpus_per_node=GPUS_PER_NODE,
                                                       num_nodes=nodes)
        # No offload; zero_init changes only the CPU figure, so both are kept to show it.
        z2_cpu, z2_gpu = estimate_zero2_model_states_mem_needs(params, GPUS_PER_NODE, nodes, cpu_offload=False)
        z3 = {zi: estimate_zero3_model_states_mem_needs(params, largest, GPUS_PER_NODE, nodes, cpu_offload=False,
                                                        cpu_offload_params=False, zero_init=zi)
              for zi in (True, False)}
        (z3_cpu, z3_gpu, z3_layer), (z3_cpu_noinit, z3_gpu_noinit, _) = z3[True], z3[False]
        rows.append({"model": name, "params": params, "largest_layer_params": largest, "gpus": n,
                     "gpus_per_node": GPUS_PER_NODE, "nodes": nodes,
                     "zero2_gpu_bytes": z2_gpu, "zero2_cpu_bytes": z2_cpu,
                     "zero3_gpu_bytes": z3_gpu, "zero3_cpu_bytes": z3_cpu, "zero3_largest_layer_bytes": z3_layer,
                     "zero3_gpu_bytes_zero_init0": z3_gpu_noinit, "zero3_cpu_bytes_zero_init0": z3_cpu_noinit,
                     "paper_16psi_over_n_bytes": 16 * params // n,
                     # the formulas read from DeepSpeed's source (no offload), checked against its returns
                     "zero2_is_2psi_plus_18psi_over_n": z2_gpu == 2 * params + int(18 * params / n),
                     "zero3_is_4L_plus_18psi_over_n": z3_gpu == 4 * largest + int(18 * params / n)})

print("=== per-GPU model states without offload (bytes; JSON lines, then GB = 1e9 bytes)")
for r in rows:
    print(json.dumps(r))
print(f"{'model':<11} {'N':>4} {'zero2 GB':>9} {'zero3 GB':>9} {'16Ψ/N GB':>9}")
for r in rows:
    print(f"{r['model']:<11} {r['gpus']:>4} {r['zero2_gpu_bytes'] / 1e9:>9.3f} {r['zero3_gpu_bytes'] / 1e9:>9.3f} "
          f"{r['paper_16psi_over_n_bytes'] / 1e9:>9.3f}")
