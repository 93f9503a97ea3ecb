"""DeepSpeed's own model-state estimator for ViT-L/16 (bench/journal/2026.md §21), beside memc's plans.
Needs deepspeed from PyPI (DS_BUILD_OPS=0 pip install --no-build-isolation deepspeed, with torch);
never part of the build or tests. Usage: python bench/deepspeed_estimate.py [PARAMS] [LARGEST_LAYER]"""
import sys

import deepspeed
from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_cold
from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_cold

params = int(sys.argv[1]) if len(sys.argv) > 1 else 304326632          # ViT-L/16 (memc inspect)
largest = int(sys.argv[2]) if len(sys.argv) > 2 else 4096 * 1024 + 4096  # an MLP linear with bias
print(f"deepspeed {deepspeed.__version__}: {params:,} params, largest layer {largest:,}")
for n in (1, 2, 4, 8):
    print(f"--- {n} GPU(s) per node, 1 node")
    estimate_zero2_model_states_mem_needs_all_cold(params, num_gpus_per_node=n, num_nodes=1)
    estimate_zero3_model_states_mem_needs_all_cold(params, largest, num_gpus_per_node=n, num_nodes=1)
