#!/usr/bin/env python3
"""Times one PyTorch training step (forward + cross-entropy + backward + AdamW step) on CPU.

    /work/venv/bin/python bench/torch_train_step.py --model vit_tiny --batch 64 --threads 1
    /work/venv/bin/python bench/torch_train_step.py --model vit_small32 --batch 64 --threads 4 --runs 20
    /work/venv/bin/python bench/torch_train_step.py --model vit_tiny --batch 64 --precision bf16-mixed
    /work/venv/bin/python bench/torch_train_step.py --write-data /tmp/small32.npz --n 2048   # data for memc

Prints one JSON line:
  {model, batch, threads, precision, step_ms_median, step_ms_all, peak_rss_bytes,
   baseline_peak_rss_bytes, torch_version, ...}
peak_rss_bytes is resource.getrusage(RUSAGE_SELF).ru_maxrss (KiB on Linux, x1024):
the process high-water mark, so it includes the Python interpreter, torch and
(for vit_tiny) onnx; baseline_peak_rss_bytes is the same measured right before
the model is built, so the difference approximates the training footprint.

Models (the same weights as the ONNX files memc trains):
  vit_tiny     models/vit_tiny.onnx (torchvision ViT 8x8, patch 2, 2 layers, hidden 32,
               1 channel); input: the first `batch` rows of data/digits_train.npz
  vit_small32  models/vit_small32.onnx (ViT 32x32, patch 4, 4 layers, hidden 128,
               mlp 512, 4 heads, 10 classes, 3 channels, 809k parameters);
               input: fixed N(0,1) images, random labels
  vit_b_16     torchvision vit_b_16 (86.6M parameters) with the weights of --onnx (the
               skeleton filled by bench/random_weights.py) wherever an initializer has a
               parameter's name and shape (the rest keep torch's init: step time does not
               depend on the values); input: the first `batch` rows of --data
Dropout stays as exported (p = 0.1, module in train()) unless --no-dropout
(all p = 0, matching `memc compile --no-dropout`).

Precision (--precision, the counterpart of `memc compile --precision`):
  fp32        everything in f32 (default)
  bf16-mixed  PyTorch's usual CPU mixed-precision recipe: parameters, gradients and the
              AdamW state stay f32; the forward and the loss run under
              torch.autocast(device_type="cpu", dtype=torch.bfloat16) (GEMMs, attention in
              bf16, autocast's f32 list in f32), backward outside autocast; no GradScaler
              (bf16 has f32's exponent range)
"""
import contextlib
import argparse
import json
import os
import resource
import statistics
import sys
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "models"))
warnings.filterwarnings("ignore")


def peak_rss_bytes():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def build(name, batch):
    import numpy as np
    import torch
    if name == "vit_tiny":
        import export_models as E
        model = E.build_vit_tiny()
        E.make_unique_(model, seed=100)
        d = np.load(os.path.join(ROOT, "data", "digits_train.npz"))
        n = d["x"].shape[0]
        idx = np.arange(batch) % n
        x = torch.from_numpy(d["x"][idx])
        y = torch.from_numpy(d["y"][idx])
    elif name == "vit_small32":
        import export_vit_small32 as S
        model = S.build_vit_small32()
        x, y = S.synthetic_inputs(batch, seed=0)
    elif name == "vit_b_16":
        model = vit_b_16_from_onnx(ONNX_PATH)
        d = np.load(DATA_PATH)
        x, y = torch.from_numpy(d["x"][:batch]), torch.from_numpy(d["y"][:batch])
    else:
        raise SystemExit(f"unknown model {name}")
    return model, x, y


ONNX_PATH = "/tmp/vit_b_16_random.onnx"
DATA_PATH = "/tmp/vit_b_16_data.npz"


def torchvision_from_onnx(name, path):
    """torchvision's `name` with the weights of the ONNX file memc trains: every initializer
    whose name and shape match a parameter (the rest keep torch's init). Returns
    (model, loaded, of)."""
    import onnx
    import torch
    import torchvision
    from onnx import numpy_helper
    model = getattr(torchvision.models, name)()
    inits = {i.name: i for i in onnx.load(path).graph.initializer}
    state = model.state_dict()
    loaded = 0
    for key, value in state.items():
        if key in inits and tuple(inits[key].dims) == tuple(value.shape):
            state[key] = torch.from_numpy(numpy_helper.to_array(inits[key]).copy())
            loaded += 1
    model.load_state_dict(state)
    return model, loaded, len(state)


def vit_b_16_from_onnx(path):
    model, loaded, of = torchvision_from_onnx("vit_b_16", path)
    print(json.dumps({"vit_b_16_tensors_from_onnx": loaded, "of": of}), file=sys.stderr)
    return model


def write_data(path, n, seed):
    import numpy as np
    import export_vit_small32 as S
    x, y = S.synthetic_inputs(n, seed=seed)
    np.savez(path, x=x.numpy(), y=y.numpy())
    print(json.dumps({"wrote": path, "x": list(x.shape), "y": list(y.shape)}))


def main():
    global ONNX_PATH, DATA_PATH
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_tiny", choices=["vit_tiny", "vit_small32", "vit_b_16"])
    ap.add_argument("--onnx", default=ONNX_PATH, help="vit_b_16: the weights (bench/random_weights.py)")
    ap.add_argument("--data", default=DATA_PATH, help="vit_b_16: the data (.npz with x, y)")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="torch.set_num_threads")
    ap.add_argument("--warmup", type=int, default=3, help="untimed steps first")
    ap.add_argument("--runs", type=int, default=10, help="timed steps (K); the median is reported")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--weight-decay", type=float, default=0.01)
    ap.add_argument("--no-dropout", action="store_true", help="set every dropout p to 0")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16-mixed"],
                    help="bf16-mixed: forward + loss under CPU autocast to bf16, f32 parameters and AdamW state")
    ap.add_argument("--write-data", metavar="NPZ", help="only write a synthetic vit_small32 data set "
                    "(x f32 N x 3 x 32 x 32, y i64 N) for memc and exit")
    ap.add_argument("--n", type=int, default=2048, help="samples for --write-data")
    ap.add_argument("--seed", type=int, default=0, help="seed for --write-data")
    args = ap.parse_args()
    ONNX_PATH, DATA_PATH = args.onnx, args.data

    if args.write_data:
        write_data(args.write_data, args.n, args.seed)
        return

    import torch
    import torch.nn.functional as F
    # (importing export_models sets 2 threads and deterministic algorithms; undo
    # both after building the model so the requested thread count holds)
    baseline = peak_rss_bytes()
    model, x, y = build(args.model, args.batch)
    if args.no_dropout:
        import export_models as E
        E.set_dropout(model, 0.0)
    torch.use_deterministic_algorithms(False)
    torch.set_num_threads(args.threads)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.999), eps=1e-8,
                            weight_decay=args.weight_decay)

    def autocast():
        if args.precision == "bf16-mixed":
            return torch.autocast(device_type="cpu", dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast():
            loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return float(loss)

    for _ in range(args.warmup):
        step()
    times = []
    loss = None
    for _ in range(args.runs):
        t0 = time.perf_counter()
        loss = step()
        times.append((time.perf_counter() - t0) * 1e3)
    out = {
        "model": args.model, "batch": args.batch, "threads": args.threads, "precision": args.precision,
        "step_ms_median": statistics.median(times),
        "step_ms_all": [round(t, 3) for t in times],
        "peak_rss_bytes": peak_rss_bytes(),
        "baseline_peak_rss_bytes": baseline,
        "torch_version": torch.__version__,
        "torch_num_threads": torch.get_num_threads(),
        "warmup": args.warmup, "runs": args.runs, "optimizer": "adamw",
        "dropout": 0.0 if args.no_dropout else "as exported (0.1)",
        "params": sum(p.numel() for p in model.parameters()),
        "param_dtypes": sorted({str(p.dtype).replace("torch.", "") for p in model.parameters()}),
        "last_loss": loss,
        "cpu_count": os.cpu_count(),
        "loadavg_1min": os.getloadavg()[0],
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
