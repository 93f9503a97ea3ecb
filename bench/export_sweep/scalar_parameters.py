"""0-d parameters train as in PyTorch: one SGD step of timm's NF-ResNet with skipinit=True (each
block's `skipinit_gain` is a 0-d nn.Parameter, set to 0.3) through both exporters, memc against
PyTorch on the same weights and batch; prints each gain after the step and the worst relative
difference of every trained tensor. Before 2026-12-07 memc kept 0-d initializers constant.

    MEMC=build/memc TIMM_PKGS=/tmp/timm_pkgs python bench/export_sweep/scalar_parameters.py [--out DIR]
(torch 2.15, onnx, onnxscript and timm 1.0.31 in the Python that runs it)."""
import argparse
import copy
import os
import subprocess
import sys
import tempfile
import warnings

import numpy as np
import torch

warnings.filterwarnings("ignore")
sys.path.append(os.environ.get("TIMM_PKGS", "/tmp/timm_pkgs"))
from onnx import load, numpy_helper  # noqa: E402
from timm.models.nfnet import NfCfg, NormFreeNet  # noqa: E402

MEMC = os.environ.get("MEMC", "build/memc")
LR = 0.1


def memc(*args, cwd):
    p = subprocess.run([MEMC, *args], cwd=cwd, capture_output=True, text=True)
    if p.returncode != 0:
        sys.exit(f"memc {' '.join(args)}: exit {p.returncode}: {p.stderr.strip().splitlines()[-1:]}")
    return p.stdout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=None)
    out = ap.parse_args().out or tempfile.mkdtemp(prefix="scalar_params_")
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    cfg = NfCfg(depths=(1, 1, 1, 1), channels=(16, 32, 64, 128), stem_chs=16, group_size=8, skipinit=True, num_features=64)
    model = NormFreeNet(cfg, num_classes=3, in_chans=3).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("skipinit_gain"):
                p.fill_(0.3)  # timm starts them at 0, where the blocks' own gradients vanish
    x, y = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 1])
    np.savez(os.path.join(out, "batch.npz"), x=x.numpy(), y=y.numpy())
    reference = copy.deepcopy(model)
    torch.nn.functional.cross_entropy(reference(x), y).backward()
    after = {n: (p - LR * p.grad).detach() for n, p in reference.named_parameters()}
    print(f"torch {torch.__version__}; 0-d parameters: {[n for n, p in model.named_parameters() if p.dim() == 0]}")
    for exporter in ("dynamo", "torchscript"):
        path = os.path.join(out, f"nf_{exporter}.onnx")
        if exporter == "dynamo":  # optimize=False: the exporter keeps the weight standardisation's own parameters
            torch.onnx.export(model, (x,), path, dynamo=True, input_names=["x"], optimize=False)
        else:
            torch.onnx.export(model, (x,), path, dynamo=False, input_names=["x"], opset_version=17, do_constant_folding=False)
        memc("compile", path, "--batch", "4", "--optimizer", "sgd", "--lr", str(LR), "-o", "step.plan", "--force", cwd=out)
        ck = os.path.join(out, f"ck_{exporter}")
        subprocess.run(["rm", "-rf", ck])
        memc("run", "step.plan", "--data", "batch.npz", "--steps", "1", "--checkpoint", ck, cwd=out)
        memc("export", "step.plan", "--weights", ck, "-o", "after.onnx", "--force", cwd=out)
        trained = {i.name: numpy_helper.to_array(i) for i in load(os.path.join(out, "after.onnx")).graph.initializer}
        worst, gains = 0.0, []
        for name, theirs in after.items():
            ours = torch.from_numpy(np.array(trained[name])).reshape(theirs.shape)
            worst = max(worst, ((ours - theirs).abs().max() / theirs.abs().max().clamp_min(1e-12)).item())
            if theirs.dim() == 0:
                gains.append(f"{name} {ours.item():.7f} (torch {theirs.item():.7f})")
        print(f"{exporter}: worst relative difference after the step {worst:.1e}; " + "; ".join(gains))


if __name__ == "__main__":
    main()
