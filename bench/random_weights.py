"""Fills a skeleton ONNX model (shapes, no data) with random weights so memc can run it:
N(0, 0.02²) everywhere, ones for LayerNorm scales. Seeded, so every benchmark that uses it
trains the same model. Usage: random_weights.py SKELETON.onnx OUT.onnx"""
import sys

import numpy as np
import onnx
from onnx import numpy_helper

m = onnx.load(sys.argv[1])
rng = np.random.default_rng(0)
for init in m.graph.initializer:
    shape = tuple(init.dims)
    is_ln_scale = init.name.endswith(".weight") and len(shape) == 1 and "ln" in init.name
    a = np.ones(shape, np.float32) if is_ln_scale else rng.standard_normal(shape, dtype=np.float32) * np.float32(0.02)
    init.CopyFrom(numpy_helper.from_array(a, init.name))
onnx.save_model(m, sys.argv[2])
print(f"wrote {sys.argv[2]}", file=sys.stderr)
