#!/usr/bin/env python3
"""A language model's head in chunks (`--loss-chunks`): peak and step time against the whole
loss and against PyTorch, side by side on the same weights, data and optimizer, on the CPU.

    python bench/lm_head_chunks.py                       # GPT-2 (2 layers, width 256, V 50257), b4 x T256
    python bench/lm_head_chunks.py --layers 2 --embd 256 --batch 4 --seq 256 --json out.json
    python bench/lm_head_chunks.py --plans                # GPT-2 small's dims, b8 x 1024, planned for an H200

The python needs torch and transformers (e.g. the python.package test's venv, or a venv made as
tests/python/run.sh makes it). The model is transformers' GPT2LMHeadModel with GPT-2's
vocabulary (50,257 tokens; lm_head tied to wte), every dropout p = 0, random weights (seed 0),
wrapped to return the logits, exported by torch.onnx.export's default (dynamo) exporter at a
fixed batch and length (its constant weights, the layer norms' 1s and 0s, perturbed by
models/export_models.py's make_unique_ so the exporter keeps each its own). The data are random token ids with GPT-2's shifted labels
(y[:, t] = ids[:, t + 1], -100 at the last position).

memc: `memc compile MODEL --batch B --seq T --optimizer adamw --no-dropout --loss-chunks none|auto`,
then `memc run PLAN --epochs 8` (one batch an epoch: measured peak, loop time per step) and
`--dump-grads` (the first step's gradients). PyTorch: the same module in train(), AdamW with the
same settings, F.cross_entropy(..., ignore_index=-100); its peak by bench/peak_vs_torch.py's
method (every CPU allocator event of one step, after a warm-up step), its median step of 2-8,
and its first step's gradients, to which memc's are compared (max over parameters of
‖g − g_torch‖ / ‖g_torch‖). One intra-op thread on both sides.
"""
import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "bench"))
sys.path.insert(0, os.path.join(ROOT, "models"))
warnings.filterwarnings("ignore")
MEMC = os.path.join(ROOT, "build", "memc")
STEPS = 8  # timed: memc's loop time per step after the first; PyTorch's median of steps 2-8



def build(args):
    import torch
    import transformers as T

    class Wrapped(torch.nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.inner = inner

        def forward(self, input_ids):
            return self.inner(input_ids=input_ids, return_dict=False)[0]

    import export_models as E
    torch.manual_seed(0)
    cfg = T.GPT2Config(vocab_size=args.vocab, n_positions=args.seq, n_embd=args.embd, n_layer=args.layers, n_head=args.heads,
                       resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, use_cache=False)
    model = T.GPT2LMHeadModel(cfg)
    with torch.no_grad():
        E.make_unique_(model, seed=0)  # layer norms start at 1 and 0: the exporter would merge equal initializers
    return Wrapped(model)


def data(args, path):
    import numpy as np
    rng = np.random.default_rng(0)
    ids = rng.integers(0, args.vocab, size=(args.batch, args.seq), dtype=np.int64)  # one batch: every step's
    y = np.full_like(ids, -100)
    y[:, :-1] = ids[:, 1:]
    np.savez(path, input_ids=ids, y=y)
    return ids, y


def memc(args, model, npz, tmp, chunks):
    import numpy as np
    plan = os.path.join(tmp, f"lm_{chunks}.plan")
    cmd = [MEMC, "compile", model, "--batch", str(args.batch), "--seq", str(args.seq), "--optimizer", "adamw", "--lr", "1e-3",
           "--no-dropout", "--loss-chunks", chunks, "--json", "-o", plan, "--force"]
    c = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
    report, grads = os.path.join(tmp, f"lm_{chunks}.json"), os.path.join(tmp, f"lm_{chunks}.grads.npz")
    subprocess.run([MEMC, "run", plan, "--data", npz, "--epochs", str(STEPS), "--quiet", "--threads", "1", "--json", report,
                    "--dump-grads", grads, "--force"], check=True, capture_output=True, text=True)
    with open(report) as f:
        r = json.load(f)
    g = dict(np.load(grads))
    return {"command": " ".join(["build/memc"] + cmd[1:]).replace(tmp + "/", ""), "planned_peak_bytes": c["predicted_peak_bytes"],
            "measured_peak_bytes": r["measured_peak_bytes"], "loss_chunks": c["decisions"].get("loss_chunks", 1),
            "breakdown": c["breakdown"], "step_ms": r.get("loop_step_ms", r["step_ms"]), "losses": r["losses"],
            "kernels": {k: r["host_memory"].get(k) for k in ("gemm_library", "vector_math", "vector_loops")}}, g


def torch_side(args, model, ids, y):
    import copy
    import torch
    import torch.nn.functional as F
    import peak_vs_torch as P
    torch.set_num_threads(1)
    inputs = (torch.from_numpy(ids[:args.batch]),)
    labels = torch.from_numpy(y[:args.batch])
    ref = copy.deepcopy(model)
    logits = ref(*inputs)
    F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100).backward()
    grads = {n: p.grad.detach().numpy().copy() for n, p in ref.named_parameters()}
    timed = copy.deepcopy(model)
    opt = torch.optim.AdamW(timed.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)
    times = []
    for _ in range(STEPS):
        start = time.perf_counter()
        logits = timed(*inputs)
        F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(1e3 * (time.perf_counter() - start))
    peak = P.torch_peak_of(copy.deepcopy(model), inputs, labels, "adamw")
    return {"peak_bytes": peak["torch_peak_bytes"], "peak_phase": peak["torch_peak_phase"], "step_ms": sorted(times[1:])[len(times[1:]) // 2],
            "version": torch.__version__}, grads


def worst_relative(memc_grads, torch_grads):
    import numpy as np
    worst, name = 0.0, ""
    for n, g in torch_grads.items():
        if n not in memc_grads:
            continue
        m = memc_grads[n].reshape(g.shape) if memc_grads[n].size == g.size else memc_grads[n]
        d = float(np.linalg.norm(m - g) / max(np.linalg.norm(g), 1e-30))
        if d > worst:
            worst, name = d, n
    return worst, name


def plans(args):
    """GPT-2 small's dimensions (models/export_gpt_skeleton.py's graph: 12 layers, width 768, 12
    heads, V 50257, 124M parameters) at batch 8 x 1,024 planned for an H200: the peak and the cost
    model's step with the whole loss and with the chunks, and what the budget search picks."""
    import export_gpt_skeleton as G
    import onnx
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        model, count = G.build(layers=12, d=768, heads=12, mlp=3072, vocab=50257, positions=1024)
        path = os.path.join(tmp, "gpt2_small_skeleton.onnx")
        onnx.save_model(model, path)
        for precision in ("fp32", "bf16-mixed"):
            for remat, chunks in itertools.product(("none", "blocks"), ("none", "auto")):
                cmd = [MEMC, "compile", path, "--batch", "8", "--seq", "1024", "--target", "h200", "--precision", precision,
                       "--remat", remat, "--loss-chunks", chunks, "--json", "-o", os.path.join(tmp, "p.plan"), "--force"]
                c = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
                rows.append({"precision": precision, "remat": remat, "loss_chunks": c["decisions"].get("loss_chunks", 1),
                             "planned_peak_bytes": c["predicted_peak_bytes"], "estimated_step_ms": c["estimated_step_ms"],
                             "breakdown": c["breakdown"], "command": " ".join(["build/memc"] + cmd[1:]).replace(tmp + "/", "")})
        whole = next(r for r in rows if r["precision"] == "bf16-mixed" and r["remat"] == "none" and r["loss_chunks"] == 1)
        budget = whole["planned_peak_bytes"] - 2 * 10**9
        searched = {}
        for pin in ([], ["--loss-chunks", "none"]):
            cmd = [MEMC, "compile", path, "--batch", "8", "--seq", "1024", "--target", "h200", "--budget", str(budget), "--json",
                   "-o", os.path.join(tmp, "s.plan"), "--force"] + pin
            c = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
            searched["pinned none" if pin else "free"] = {"decisions": c["decisions"], "planned_peak_bytes": c["predicted_peak_bytes"],
                                                          "estimated_step_ms": c["estimated_step_ms"]}
    print(f"\nGPT-2 small dims ({count:,} parameters), batch 8 x 1,024, AdamW, planned for an H200 (--target h200)\n")
    print("| precision | remat | loss | planned peak | activations at the peak | estimated step |")
    print("|---|---|---|---:|---:|---:|")
    for r in rows:
        loss = "whole" if r["loss_chunks"] == 1 else f"{r['loss_chunks']} chunks"
        print(f"| {r['precision']} | {r['remat']} | {loss} | {r['planned_peak_bytes'] / 1e9:.2f} GB | {r['breakdown'].get('activations', 0) / 1e9:.2f} GB "
              f"| {r['estimated_step_ms']:.1f} ms |")
    print(f"\n--budget {budget} (2 GB under the whole bf16-mixed plan):")
    for k, v in searched.items():
        d = v["decisions"]
        print(f"  {k}: {d['precision']}, {d['micro_batches']} micro-batch(es), remat {d['remat']}, loss chunks {d.get('loss_chunks', 1)}: "
              f"{v['planned_peak_bytes'] / 1e9:.2f} GB, {v['estimated_step_ms']:.1f} ms")
    return {"plans": rows, "budget": budget, "searched": searched}


def mib(b):
    return f"{b / 2**20:.1f} MiB"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embd", type=int, default=256)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--vocab", type=int, default=50257)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--json", help="write every number here")
    ap.add_argument("--plans", action="store_true", help="only GPT-2 small's plans for an H200 (no run, no torch)")
    args = ap.parse_args()
    if args.plans:
        out = plans(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(out, f, indent=1)
        return
    import torch
    with tempfile.TemporaryDirectory() as tmp:
        model = build(args)
        model.eval()
        onnx_path = os.path.join(tmp, "gpt2_lm.onnx")
        ids, y = data(args, os.path.join(tmp, "lm.npz"))
        torch.onnx.export(model, (torch.from_numpy(ids[:args.batch]),), onnx_path, input_names=["input_ids"])
        model.train()
        rows = {}
        for chunks in ("none", "auto"):
            rows[chunks], grads = memc(args, onnx_path, os.path.join(tmp, "lm.npz"), tmp, chunks)
            rows[chunks]["grads"] = grads
        t, torch_grads = torch_side(args, model, ids, y)
    for chunks, r in rows.items():
        r["grad_rel_vs_torch"], r["worst_param"] = worst_relative(r.pop("grads"), torch_grads)
    from cpu_info import cpu_model
    kernels = rows["none"]["kernels"]
    print(f"\nGPT-2 LM ({args.layers} layers, width {args.embd}, vocabulary {args.vocab}), batch {args.batch} x {args.seq} positions, "
          f"AdamW, one thread, {cpu_model()}; memc's kernels: {kernels['gemm_library']}, exp {kernels['vector_math']}, "
          f"loops {kernels['vector_loops']}; torch {t['version']}\n")
    print("| | planned peak | measured peak | step (ms) | first-step gradients vs PyTorch |")
    print("|---|---:|---:|---:|---:|")
    for chunks, r in rows.items():
        label = "memc, whole loss" if chunks == "none" else f"memc, --loss-chunks auto ({r['loss_chunks']} chunks)"
        print(f"| {label} | {mib(r['planned_peak_bytes'])} | {mib(r['measured_peak_bytes'])} | {r['step_ms']:.0f} | "
              f"{r['grad_rel_vs_torch']:.1e} ({r['worst_param']}) |")
    print(f"| PyTorch {t['version']} eager | {mib(t['peak_bytes'])} (in {t['peak_phase']}) | | {t['step_ms']:.0f} | |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "memc": rows, "torch": t}, f, indent=1)


if __name__ == "__main__":
    main()
