"""Accuracy parity of BatchNorm trained in train() (bench/journal/2026.md §49): models/export_t215.py's
BnNet (BatchNorm2d ×2, BatchNorm1d) in train(), trained by memc (memc.compile, both exporters) and
by PyTorch side by side: the same initial weights and running statistics, the same batches in
the same order, SGD with momentum. Prints each epoch's mean loss, then the test accuracy of each
(eval(): running statistics) and how far memc's weights and running statistics ended from PyTorch's.

    build/python-test-venv/bin/python bench/bn_train_parity.py [--epochs 10]
"""
import argparse
import copy
import os
import sys
import time

import numpy as np
import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "models"))
sys.path.insert(0, os.path.join(ROOT, "bench"))
import memc  # noqa: E402
from cpu_info import cpu_model  # noqa: E402
from export_t215 import BnNet  # noqa: E402


def relative(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--batch", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(2)
    train, test = (np.load(os.path.join(ROOT, "data", f"digits_{s}.npz")) for s in ("train", "test"))
    x, y = torch.from_numpy(train["x"]), torch.from_numpy(train["y"])
    tx, ty = torch.from_numpy(test["x"]), torch.from_numpy(test["y"])
    steps_per_epoch = len(x) // args.batch
    print(f"cpu: {cpu_model()}; torch {torch.__version__}; memc {memc.__version__}; BnNet in train(), batch {args.batch}, "
          f"SGD lr 0.05 momentum 0.9, {args.epochs} epochs of {steps_per_epoch} steps")
    for exporter in ("dynamo", "torchscript"):
        torch.manual_seed(0)
        model = BnNet().train()
        reference = copy.deepcopy(model)
        plan = memc.compile(model, (x[:args.batch],), optimizer="momentum", lr=0.05, momentum=0.9, exporter=exporter,
                            epochs=args.epochs)
        sgd = torch.optim.SGD(reference.parameters(), lr=0.05, momentum=0.9)
        g = torch.Generator().manual_seed(1)
        start = time.time()
        for epoch in range(args.epochs):
            order = torch.randperm(len(x), generator=g)
            losses = []
            for s in range(steps_per_epoch):
                rows = order[s * args.batch:(s + 1) * args.batch]
                sgd.zero_grad()
                torch_loss = torch.nn.functional.cross_entropy(reference(x[rows]), y[rows])
                torch_loss.backward()
                sgd.step()
                losses.append((plan.step(x[rows], y[rows]), torch_loss.item()))
            m = np.mean(losses, axis=0)
            print(f"  {exporter} epoch {epoch + 1}: mean loss memc {m[0]:.5f}, PyTorch {m[1]:.5f}")
        state, ref_state = plan.state_dict(), reference.state_dict()
        n = len(tx) - len(tx) % args.batch  # the plan predicts whole batches
        reference.eval()
        with torch.no_grad():
            torch_acc = (reference(tx[:n]).argmax(1) == ty[:n]).float().mean().item()
        memc_acc = np.mean([np.argmax(plan.predict(tx[i:i + args.batch]), 1) == ty[i:i + args.batch].numpy()
                            for i in range(0, n, args.batch)])
        stats = max(relative(state[n], t) for n, t in ref_state.items() if "running" in n)
        weights = max(relative(state[n], t) for n, t in ref_state.items() if "running" not in n and "num_batches" not in n)
        counted = {int(state[n]) for n in ref_state if "num_batches" in n}
        print(f"{exporter}: test accuracy on {n} samples memc {memc_acc:.2%}, PyTorch {torch_acc:.2%}; running statistics within {stats:.2e}, "
              f"weights within {weights:.2e}; num_batches_tracked {sorted(counted)}; {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
