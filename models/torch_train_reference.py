#!/usr/bin/env python3
"""PyTorch training-loss references for memc's training loop (vit_tiny on digits).

    /work/venv/bin/python models/torch_train_reference.py            # writes both JSON files
    /work/venv/bin/python models/torch_train_reference.py --selfcheck  # only prints the data order

Reproduces, in PyTorch, what `memc train` does on models/vit_tiny.onnx with
dropout disabled (`memc compile --no-dropout`):
  * weights: the ONNX initializers of models/vit_tiny.onnx, loaded by name into
    the torchvision model built exactly as export_models.py builds it (every
    torch parameter must be matched by an initializer of the same name and
    shape, and vice versa; the values must also equal the seeded init);
  * data order: memc's stateless Fisher-Yates shuffle (runtime/dataset.cc,
    counter_random in backends/cpu/kernel_table.cc), re-implemented below in
    exact uint64 arithmetic; the last partial batch of an epoch is dropped;
  * loss: mean softmax cross-entropy; optimizer: torch.optim (step count from 1);
  * schedule: "constant" or "cosine" (horizon T = epochs x batches_per_epoch,
    lr_t = min_lr + 0.5 (lr - min_lr)(1 + cos(pi (t-1)/T)), 1-based t), set on
    the param group before each step (memc runtime/plan.cc learning_rate).

Outputs:
  models/vit_tiny.train_ref.json      AdamW lr 1e-3, wd 0.01, constant, 20 steps
  models/vit_tiny.train_ref_sgd.json  SGD momentum 0.9, lr 0.05, cosine over 3 epochs, 20 steps
Each holds the float32 losses (`losses`, what memc should reproduce) and, for
judging tolerances, the same run in float64 (`losses_f64`).
"""
import argparse
import json
import math
import os
import sys

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)

M64 = (1 << 64) - 1
SHUFFLE_STREAM = 0x5348554646  # "SHUFF", runtime/dataset.h kShuffleStream


# ----------------------------------------------------------------------------- memc data order

def counter_random(seed, stream, index):
    """uint32 SplitMix64 of memc (backends/cpu/kernel_table.cc); all arithmetic mod 2^64.
    C precedence: the two products are formed first, then XORed with each other and index."""
    z = ((seed * 0x9E3779B97F4A7C15) & M64) ^ (((stream + 0x632BE59BD9B4E019) & M64) * 0xBF58476D1CE4E5B9 & M64) ^ index
    z = (z + 0x9E3779B97F4A7C15) & M64
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & M64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & M64
    return ((z ^ (z >> 31)) >> 16) & 0xFFFFFFFF


def epoch_order(n, seed, epoch):
    order = list(range(n))
    for i in range(n - 1, 0, -1):
        j = counter_random(seed, SHUFFLE_STREAM + epoch, i) % (i + 1)
        order[i], order[j] = order[j], order[i]
    return order


def batches(n, batch, seed, epochs):
    """Yields (epoch, batch_index, sample indices) in memc's order (last partial batch dropped)."""
    for e in range(epochs):
        order = epoch_order(n, seed, e)
        for b in range(n // batch):
            yield e, b, order[b * batch:(b + 1) * batch]


def selfcheck():
    first = epoch_order(1437, 0, 0)[:10]
    print("counter_random(0, 0x5348554646, 1436) =", counter_random(0, SHUFFLE_STREAM, 1436))
    print("epoch 0 order, N=1437, seed 0, first 10:", first)
    print("epoch 1 order, N=1437, seed 0, first 10:", epoch_order(1437, 0, 1)[:10])
    o = epoch_order(1437, 0, 0)
    assert sorted(o) == list(range(1437))
    return first


# ----------------------------------------------------------------------------- schedule

def lr_at(kind, lr, t, total, warmup=0, min_lr=0.0):
    """memc runtime/plan.cc learning_rate, t 1-based."""
    if kind == "constant" or total <= 0:
        return lr
    w = warmup if kind == "warmup-cosine" else 0
    if w > 0 and t <= w:
        return lr * t / w
    progress = min(1.0, (t - 1 - w) / max(1.0, float(total - w)))
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


# ----------------------------------------------------------------------------- model

def load_vit_tiny(onnx_path, dtype=torch.float32):
    import export_models as E
    model = E.build_vit_tiny()
    changed = E.make_unique_(model, seed=100)      # same values as the export (checked below)
    E.set_dropout(model, 0.0)
    m = onnx.load(onnx_path)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    params = dict(model.named_parameters())
    missing = [n for n in params if n not in inits]
    extra = [n for n in inits if n not in params]
    assert not missing, f"torch parameters without an ONNX initializer: {missing}"
    assert not extra, f"ONNX initializers that are not torch parameters: {extra}"
    with torch.no_grad():
        for n, p in params.items():
            a = inits[n]
            assert tuple(a.shape) == tuple(p.shape), (n, a.shape, tuple(p.shape))
            assert np.array_equal(a, p.detach().numpy()), f"{n}: ONNX value differs from seeded init"
            p.copy_(torch.from_numpy(a.copy()))
    model = model.to(dtype)
    model.train()     # dropout p = 0 everywhere; train() == eval() for this model
    n_elems = sum(p.numel() for p in model.parameters())
    return model, {"matched_params": len(params), "param_elements": n_elems, "perturbed": changed}


def make_optimizer(params, spec):
    k = spec["kind"]
    if k == "adamw":
        return torch.optim.AdamW(params, lr=spec["lr"], betas=(spec["beta1"], spec["beta2"]),
                                 eps=spec["eps"], weight_decay=spec["weight_decay"])
    if k == "adam":
        return torch.optim.Adam(params, lr=spec["lr"], betas=(spec["beta1"], spec["beta2"]),
                                eps=spec["eps"], weight_decay=spec["weight_decay"])
    if k == "sgd":
        return torch.optim.SGD(params, lr=spec["lr"], momentum=spec["momentum"],
                               dampening=spec.get("dampening", 0.0), nesterov=spec.get("nesterov", False),
                               weight_decay=spec["weight_decay"])
    raise ValueError(k)


def train(cfg, dtype):
    d = np.load(os.path.join(ROOT, cfg["data"]))
    x_all = torch.from_numpy(d["x"]).to(dtype)
    y_all = torch.from_numpy(d["y"])
    n = x_all.shape[0]
    model, info = load_vit_tiny(os.path.join(ROOT, cfg["model"]), dtype)
    opt = make_optimizer(model.parameters(), dict(cfg["optimizer"], lr=cfg["lr"]))
    B = cfg["batch"]
    per_epoch = n // B
    total = cfg["epochs"] * per_epoch
    losses, lrs, first_batch = [], [], None
    for t, (e, b, idx) in enumerate(batches(n, B, cfg["seed"], cfg["epochs"]), start=1):
        if t > cfg["steps"]:
            break
        if first_batch is None:
            first_batch = idx[:10]
        lr = lr_at(cfg["schedule"], cfg["lr"], t, total, cfg.get("warmup_steps", 0))
        for g in opt.param_groups:
            g["lr"] = lr
        ii = torch.tensor(idx)
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x_all[ii]), y_all[ii])
        loss.backward()
        opt.step()
        losses.append(float(loss))
        lrs.append(lr)
    return losses, lrs, info, per_epoch, total, first_batch


def run(cfg, out_path):
    losses, lrs, info, per_epoch, total, first = train(cfg, torch.float32)
    losses64, _, _, _, _, _ = train(cfg, torch.float64)
    out = {
        "model": cfg["model"], "data": cfg["data"], "batch": cfg["batch"], "seed": cfg["seed"],
        "optimizer": cfg["optimizer"], "schedule": cfg["schedule"], "lr": cfg["lr"],
        "epochs": cfg["epochs"], "batches_per_epoch": per_epoch, "schedule_horizon": total,
        "steps": cfg["steps"], "dropout": "disabled (all p = 0; memc compile --no-dropout)",
        "loss": "mean softmax cross-entropy, logged before the step's update",
        "losses": losses,
        "losses_f64": losses64,
        "lrs": lrs,
        "epoch0_first10_indices": first,
        "weights": f"ONNX initializers of {cfg['model']} ({info['matched_params']} params, "
                   f"{info['param_elements']} elements, all matched by name)",
        "torch_version": torch.__version__,
        "torch_threads": torch.get_num_threads(),
        "generator": "models/torch_train_reference.py",
    }
    with open(out_path, "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")
    print(f"wrote {os.path.relpath(out_path, ROOT)}")
    for i, (a, b) in enumerate(zip(losses, losses64)):
        print(f"  step {i + 1:2d} lr {lrs[i]:.6g} loss {a:.7f}  (f64 {b:.7f}, diff {abs(a - b):.1e})")


CONFIGS = {
    "vit_tiny.train_ref.json": {
        "model": "models/vit_tiny.onnx", "data": "data/digits_train.npz", "batch": 64, "seed": 0,
        "optimizer": {"kind": "adamw", "beta1": 0.9, "beta2": 0.999, "eps": 1e-8, "weight_decay": 0.01},
        "schedule": "constant", "lr": 1e-3, "epochs": 1, "steps": 20,
    },
    "vit_tiny.train_ref_sgd.json": {
        "model": "models/vit_tiny.onnx", "data": "data/digits_train.npz", "batch": 64, "seed": 0,
        "optimizer": {"kind": "sgd", "momentum": 0.9, "dampening": 0.0, "nesterov": False,
                      "weight_decay": 0.0},
        "schedule": "cosine", "lr": 0.05, "epochs": 3, "steps": 20,
    },
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--selfcheck", action="store_true", help="print the data order only")
    args = ap.parse_args()
    selfcheck()
    if args.selfcheck:
        return
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)   # (export_models sets 2 on import); 1 is faster on a busy box
    for name, cfg in CONFIGS.items():
        run(cfg, os.path.join(HERE, name))


if __name__ == "__main__":
    main()
