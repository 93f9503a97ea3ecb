#!/usr/bin/env python3
"""Exports models/vit_small32.onnx: a bigger ViT for benchmarks (bench/torch_train_step.py).

    /work/venv/bin/python models/export_vit_small32.py

torchvision VisionTransformer(image_size=32, patch_size=4, num_layers=4,
num_heads=4, hidden_dim=128, mlp_dim=512, num_classes=10, dropout=0.1,
attention_dropout=0.1), 3 input channels (torchvision's own conv_proj), 64
patches + class token = 65 tokens, 809,354 parameters (~3.2 MB fp32).
Weights: torch.manual_seed(0) + make_unique_(seed=103) as in export_models.py.
Exported like vit_tiny.onnx: TorchScript, TRAINING mode, opset 17, no constant
folding, dynamic batch (input `x` f32 [batch,3,32,32], output `logits` [batch,10]).
Initializer names are the torch parameter names.

Check: ORT (Dropout switched off) vs PyTorch (train(), all p = 0) logits at
batch 4 and 3 on fixed N(0,1) inputs; also writes models/vit_small32.ref.npz
(x [4,3,32,32], labels, logits, loss; no gradients) for a quick memc check.
"""
import os
import sys
import warnings

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
warnings.filterwarnings("ignore")

CONFIG = dict(image_size=32, patch_size=4, num_layers=4, num_heads=4, hidden_dim=128,
              mlp_dim=512, num_classes=10, dropout=0.1, attention_dropout=0.1)


def build_vit_small32(seed=0, unique=True):
    import torchvision
    import export_models as E
    E.seed_all(seed)
    m = torchvision.models.VisionTransformer(**CONFIG)
    if unique:
        E.make_unique_(m, seed=103)
    return m


def synthetic_inputs(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return x, y


def main():
    import onnx_ref_util as U
    import export_models as E
    torch.set_num_threads(2)
    model = build_vit_small32()
    model.train()
    p = os.path.join(HERE, "vit_small32.onnx")
    x4, y4 = synthetic_inputs(4, seed=1)
    E.export_ts(model, x4, p, ["x"], {"x": {0: "batch"}, "logits": {0: "batch"}})
    m = onnx.load(p)
    params = dict(model.named_parameters())
    names = {i.name for i in m.graph.initializer}
    assert names == set(params), (sorted(names ^ set(params)))
    n_elems = sum(v.numel() for v in params.values())

    E.set_dropout(model, 0.0)
    with torch.no_grad():
        l4 = model(x4)
        x3 = synthetic_inputs(3, seed=2)[0]
        l3 = model(x3)
    loss = F.cross_entropy(l4, y4)
    d4 = U.rel_diff(U.ort_logits(p, {"x": x4.numpy()}), l4.numpy())
    d3 = U.rel_diff(U.ort_logits(p, {"x": x3.numpy()}), l3.numpy())
    assert d4 <= 1e-5 and d3 <= 1e-5, (d4, d3)
    np.savez(os.path.join(HERE, "vit_small32.ref.npz"), x=x4.numpy(), labels=y4.numpy(),
             logits=l4.numpy().astype(np.float32), loss=np.array(float(loss), np.float32))
    size = os.path.getsize(p)
    assert size < 5 * 1024 * 1024, size
    print(f"wrote {p}: {size} bytes, {len(m.graph.initializer)} initializers, {n_elems} parameter "
          f"elements, {len(m.graph.node)} nodes; ORT vs torch rel diff b4 {d4:.1e} b3 {d3:.1e}; "
          f"ops {U.op_histogram(m)}")


if __name__ == "__main__":
    main()
