#!/usr/bin/env python3
"""Peak memory of one training step: memc's planned arena vs PyTorch on the CPU.

    /work/venv/bin/python bench/peak_vs_torch.py                 # the 8 cases of bench/journal/2026.md §4, markdown table
    /work/venv/bin/python bench/peak_vs_torch.py --json out.json  # also every number, as JSON
    /work/venv/bin/python bench/peak_vs_torch.py --only vit_tiny --optimizers adamw
    /work/venv/bin/python bench/peak_vs_torch.py --frag-table    # only memc: planned peak vs lower bound,
                                                                 # 2 batches x 4 optimizers per model

Cases: vit_tiny b64, vit_small32 b32, text_encoder b32 seq 32, bigbird_full b32 seq 32,
each with AdamW (lr 1e-3, wd 0.01, betas 0.9/0.999, eps 1e-8) and plain SGD (lr 1e-3, no
momentum, no weight decay), dropout p = 0 on both sides (memc `--no-dropout`).

PyTorch side (method)
---------------------
The torch model is built exactly as models/export_models.py / models/export_vit_small32.py
build the exported one (same builder functions, seeds and make_unique_), every dropout
p = 0 (export_models.set_dropout), module in train(), 1 intra-op thread. One step is
    loss = cross_entropy(model(*inputs), y); loss.backward(); opt.step()
One warm-up step runs first so the optimizer states exist (AdamW: exp_avg, exp_avg_sq and
the 0-d `step` tensor per parameter), then `opt.zero_grad(set_to_none=True)` frees the
gradients, as a training loop does between steps, and gc runs. Live at step start are then:
parameters, buffers, optimizer states and the input batch; their storage bytes (distinct
storages, `untyped_storage().nbytes()`) are `torch_start_bytes`.
The step is run under torch.profiler (CPU, profile_memory=True). Every allocation and
free of PyTorch's CPU allocator (c10::CPUAllocator, i.e. every tensor storage) is a
`[memory]` event with +/- nbytes; sorted by time, their running sum is the live-bytes
delta since step start, and
    torch_peak = torch_start_bytes + max(running sum)
is the high-water mark of live tensor storage during forward + backward + step().
Sanity check: the running sum at the end of the step equals the gradient bytes (the
.grad tensors stay alive after step()) up to a few bytes of scalars (loss).
Second view: torch.profiler's memory profiler (record_shapes + with_stack, the code behind
`export_memory_timeline`) classifies every tensor (parameter, optimizer state, input,
activation, gradient, temporary, autograd detail); the breakdown at its peak is reported
(`torch_categories_at_peak`). Its total counts pre-existing tensors only when an op touches
them, and coalesces events per microsecond, so it can differ slightly from torch_peak.

What this counts and does not: requested bytes of every tensor storage from the CPU
allocator (PyTorch does not round them; glibc adds 16 B headers and 64-B alignment
padding: not counted, nor is memc's 64-B alignment counted separately - it is inside
memc's arena bytes). Not counted: the Python interpreter and objects, autograd graph
nodes and their metadata (C++ heap, not tensor storage), oneDNN/OpenBLAS internal packing
buffers and thread stacks, the profiler's own buffers. It is therefore a lower estimate of
PyTorch's step footprint (process RSS is reported too, for scale: it includes ~380 MB of
interpreter and libraries). PyTorch's CPU allocator does not cache: a freed storage goes
back to malloc, so "live bytes" is what it holds, with no allocator fragmentation counted.

memc side
---------
`memc compile MODEL --batch B [--seq 32] --optimizer adamw|sgd --no-dropout --json -o PLAN`
prints predicted_peak_bytes (the arena: the offsets' high-water mark after the heap
simulator), lower_bound_bytes (max over the schedule of the bytes live at once, i.e. the
no-fragmentation bound) and the breakdown at the peak; `memc run PLAN --data D --steps 2
--json R` reports measured_peak_bytes from the device accountant (arena + workspace,
allocated once). fragmentation = planned / lower_bound - 1.
"""
import argparse
import gc
import json
import os
import resource
import subprocess
import sys
import tempfile
import warnings

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "models"))
warnings.filterwarnings("ignore")
MEMC = os.path.join(ROOT, "build", "memc")

CASES = [  # model, batch, seq (None = image model), data for memc run
    ("vit_tiny", 64, None, "data/digits_train.npz"),
    ("vit_small32", 32, None, None),           # written by torch_train_step.py --write-data
    ("text_encoder", 32, 32, "data/text_train.npz"),
    ("bigbird_full", 32, 32, "data/text_train.npz"),
    ("gpt2_lm_ts_t215", 32, 32, "data/lm_test.npz"),  # a language model: a label per position, tied embedding
]
FRAG_BATCHES = {"vit_tiny": (32, 64), "vit_small32": (32, 64), "text_encoder": (32, 64),
                "bigbird_full": (32, 64), "bigbird_sparse": (4,),
                "vit_b_16_skeleton": (1, 8)}


# ----------------------------------------------------------------------------- torch

def build_torch(name, batch, seq):
    import numpy as np
    import torch
    import export_models as E
    if name == "vit_tiny":
        model = E.build_vit_tiny()
        E.make_unique_(model, seed=100)
        d = np.load(os.path.join(ROOT, "data", "digits_train.npz"))
        idx = np.arange(batch) % d["x"].shape[0]
        inputs = (torch.from_numpy(d["x"][idx]),)
        y = torch.from_numpy(d["y"][idx])
    elif name == "vit_small32":
        import export_vit_small32 as S
        model = S.build_vit_small32()
        x, y = S.synthetic_inputs(batch, seed=0)
        inputs = (x,)
    elif name in ("text_encoder", "bigbird_full"):
        d = np.load(os.path.join(ROOT, "data", "text_train.npz"))
        n_classes = int(d["y"].max()) + 1
        if name == "text_encoder":
            E.seed_all(1)
            model = E.TextEncoder(n_classes=n_classes)
            E.make_unique_(model, seed=101)
        else:
            model = E.build_bigbird("original_full", n_classes)
            E.make_unique_(model, seed=102)
        idx = np.arange(batch) % d["y"].shape[0]
        inputs = (torch.from_numpy(d["input_ids"][idx, :seq].copy()),
                  torch.from_numpy(d["attention_mask"][idx, :seq].copy()))
        y = torch.from_numpy(d["y"][idx])
    elif name == "gpt2_lm_ts_t215":
        import export_lm_t215 as L
        model = L.build_gpt2_lm()
        E.make_unique_(model, seed=107)            # the exported weights (models/export_lm_t215.py)
        model = L.E.Logits(model)
        d = np.load(os.path.join(ROOT, "data", "lm_test.npz"))
        idx = np.arange(batch) % d["y"].shape[0]
        inputs = (torch.from_numpy(d["input_ids"][idx, :seq].copy()),
                  torch.from_numpy(d["attention_mask"][idx, :seq].copy()))
        y = torch.from_numpy(d["y"][idx, :seq].copy())
    else:
        raise SystemExit(f"unknown model {name}")
    E.set_dropout(model, 0.0)
    model.train()
    return model, inputs, y


def storage_bytes(tensors):
    seen, total = set(), 0
    for t in tensors:
        s = t.untyped_storage()
        if s.data_ptr() in seen:
            continue
        seen.add(s.data_ptr())
        total += s.nbytes()
    return total


def torch_peak(name, batch, seq, optimizer):
    return torch_peak_of(*build_torch(name, batch, seq), optimizer)


def torch_peak_of(model, inputs, y, optimizer):
    """PyTorch's step peak (the method above) for a built model, its inputs and labels."""
    import torch
    import torch.nn.functional as F
    from torch.profiler import ProfilerActivity, profile
    torch.use_deterministic_algorithms(False)
    torch.set_num_threads(1)
    if optimizer == "adamw":
        opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=0.01)
    elif optimizer == "sgd":
        opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    else:
        raise SystemExit(optimizer)

    def logits_of(out):
        return out[0] if isinstance(out, (tuple, list)) else out

    from torch.profiler import record_function

    def step():
        with record_function("phase:forward"):
            logits = logits_of(model(*inputs))   # a language model's [N, T, C]: PyTorch's per-position loss
            loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), ignore_index=-100)
        with record_function("phase:backward"):
            loss.backward()
        with record_function("phase:optimizer"):
            opt.step()
        return loss

    step()                                   # warm-up: optimizer states now exist
    opt.zero_grad(set_to_none=True)
    gc.collect()
    params = list(model.parameters())
    states = [v for st in opt.state.values() for v in st.values() if torch.is_tensor(v)]
    start_parts = {
        "params": storage_bytes(params),
        "buffers": storage_bytes(list(model.buffers())),
        "optimizer_state": storage_bytes(states),
        "inputs": storage_bytes(list(inputs) + [y]),
    }
    start = storage_bytes(params + list(model.buffers()) + states + list(inputs) + [y])
    grad_bytes = sum(p.numel() * p.element_size() for p in params)

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True, record_shapes=True,
                 with_stack=True) as prof:
        loss = step()
    evs = [(e.start_ns(), i, e.nbytes()) for i, e in enumerate(prof.profiler.kineto_results.events())
           if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU]
    evs.sort()
    phases = sorted((e.start_ns(), e.end_ns(), e.name()[6:]) for e in prof.profiler.kineto_results.events()
                    if e.name().startswith("phase:"))

    def phase_of(t):
        return next((n for a, b, n in phases if a <= t <= b), "between")
    run, peak_delta, n_alloc, alloc_bytes, peak_phase = 0, 0, 0, 0, None
    phase_peak = {}
    for t, _, nb in evs:
        run += nb
        ph = phase_of(t)
        phase_peak[ph] = max(phase_peak.get(ph, 0), start + run)
        if run > peak_delta:
            peak_delta, peak_phase = run, ph
        if nb > 0:
            n_alloc += 1
            alloc_bytes += nb
    end_delta = run
    live_grads = sum(p.grad.numel() * p.grad.element_size() for p in params if p.grad is not None)

    cats = None
    try:
        from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline
        times, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline("cpu")
        totals = [sum(s) for s in sizes]
        k = max(range(len(totals)), key=totals.__getitem__)
        cats = {"total": totals[k]}
        for c, i in _CATEGORY_TO_INDEX.items():
            cats[(c.name.lower() if c is not None else "unknown")] = sizes[k][i + 1]
    except Exception as e:  # private API; report and carry on
        cats = {"error": repr(e)[:200]}
    return {
        "torch_peak_bytes": start + peak_delta,
        "torch_start_bytes": start,
        "torch_peak_phase": peak_phase,
        "torch_peak_by_phase": phase_peak,
        "torch_start_parts": start_parts,
        "torch_peak_delta_bytes": peak_delta,
        "torch_end_delta_bytes": end_delta,
        "torch_grad_bytes": grad_bytes,
        "torch_live_grad_bytes_after_step": live_grads,
        "torch_allocations_in_step": n_alloc,
        "torch_allocated_bytes_in_step": alloc_bytes,
        "torch_categories_at_peak": cats,
        "torch_loss": float(loss),
        "rss_peak_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "torch_version": torch.__version__,
        "torch_params": sum(p.numel() for p in params),
        "torch_foreach": opt.defaults.get("foreach"),
    }


# ----------------------------------------------------------------------------- memc

def memc_compile(model, batch, seq, optimizer, plan):
    cmd = [MEMC, "compile", os.path.join(ROOT, "models", model + ".onnx"), "--batch", str(batch),
           "--optimizer", optimizer, "--no-dropout", "--json", "-o", plan]
    if seq:
        cmd += ["--seq", str(seq)]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT).stdout
    return json.loads(out), " ".join(["build/memc"] + cmd[1:]).replace(ROOT + "/", "")


def memc_run(plan, data, report):
    cmd = [MEMC, "run", plan, "--data", data, "--steps", "2", "--quiet", "--json", report]
    subprocess.run(cmd, check=True, capture_output=True, text=True, cwd=ROOT)
    with open(report) as f:
        return json.load(f)


def vit_small32_data(tmp):
    p = os.path.join(tmp, "small32.npz")
    if not os.path.exists(p):
        subprocess.run([sys.executable, os.path.join(ROOT, "bench", "torch_train_step.py"),
                        "--write-data", p, "--n", "256"], check=True, capture_output=True, cwd=ROOT)
    return p


def mib(b):
    return f"{b / 2**20:.2f} MiB"


def compare(args, tmp):
    rows = []
    for model, batch, seq, data in CASES:
        if args.only and model not in args.only:
            continue
        data = data and os.path.join(ROOT, data) or vit_small32_data(tmp)
        for opt in args.optimizers:
            plan = os.path.join(tmp, f"{model}_{batch}_{opt}.plan")
            c, ccmd = memc_compile(model, batch, seq, opt, plan)
            r = memc_run(plan, data, os.path.join(tmp, f"{model}_{batch}_{opt}.json"))
            t = torch_peak(model, batch, seq, opt)
            row = dict(model=model, batch=batch, seq=seq, optimizer=opt, memc_compile_cmd=ccmd,
                       memc_predicted_peak_bytes=c["predicted_peak_bytes"],
                       memc_lower_bound_bytes=c["lower_bound_bytes"],
                       memc_breakdown=c["breakdown"], memc_param_count=c["param_count"],
                       memc_measured_peak_bytes=r["measured_peak_bytes"],
                       memc_run_predicted_peak_bytes=r["predicted_peak_bytes"], **t)
            rows.append(row)
            print(f"{model} b{batch} {opt}: torch {mib(t['torch_peak_bytes'])}, memc "
                  f"{mib(c['predicted_peak_bytes'])} (measured {mib(r['measured_peak_bytes'])})",
                  file=sys.stderr, flush=True)
    print("| model | batch | optimizer | PyTorch peak | memc planned peak | memc measured | "
          "PyTorch / memc | memc lower bound | fragmentation |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        b = f"{r['batch']}" + (f" (seq {r['seq']})" if r["seq"] else "")
        print(f"| {r['model']} | {b} | {r['optimizer']} | {mib(r['torch_peak_bytes'])} | "
              f"{mib(r['memc_predicted_peak_bytes'])} | {mib(r['memc_measured_peak_bytes'])} | "
              f"{r['torch_peak_bytes'] / r['memc_predicted_peak_bytes']:.2f}x | "
              f"{mib(r['memc_lower_bound_bytes'])} | "
              f"{100 * (r['memc_predicted_peak_bytes'] / r['memc_lower_bound_bytes'] - 1):.3f} % |")
    print()
    print("| model | optimizer | torch at step start (params+buffers / opt state / inputs) | "
          "torch peak increase in step | grads alive after step | torch categories at peak "
          "(activation / gradient / temporary / autograd_detail) | memc breakdown at peak "
          "(activations / grads / optimizer_state / params / workspace) | torch peak in phase "
          "(forward / backward / optimizer.step) |")
    print("|---|---|---|---:|---:|---|---|---|")
    for r in rows:
        sp, c, m = r["torch_start_parts"], r["torch_categories_at_peak"], r["memc_breakdown"]
        cs = ("n/a" if "error" in c else " / ".join(
            mib(c.get(k, 0)) for k in ("activation", "gradient", "temporary", "autograd_detail")))
        print(f"| {r['model']} | {r['optimizer']} | {mib(sp['params'] + sp['buffers'])} / "
              f"{mib(sp['optimizer_state'])} / {mib(sp['inputs'])} | {mib(r['torch_peak_delta_bytes'])} | "
              f"{mib(r['torch_end_delta_bytes'])} | {cs} | " + " / ".join(
                  mib(m[k]) for k in ("activations", "grads", "optimizer_state", "params", "workspace"))
              + " | " + " / ".join(mib(r["torch_peak_by_phase"][k]) if k in r["torch_peak_by_phase"]
                                   else "no alloc"
                                   for k in ("forward", "backward", "optimizer"))
              + f" (peak in {r['torch_peak_phase']}) |")
    return rows


def frag_table(tmp):
    rows = []
    for model, batches in FRAG_BATCHES.items():
        seq = {"text_encoder": 32, "bigbird_full": 32, "bigbird_sparse": 64}.get(model)
        for b in batches:
            for opt in ("sgd", "momentum", "adam", "adamw"):
                c, _ = memc_compile(model, b, seq, opt, os.path.join(tmp, "f.plan"))
                rows.append(dict(model=model, batch=b, seq=seq, optimizer=opt,
                                 predicted_peak_bytes=c["predicted_peak_bytes"],
                                 lower_bound_bytes=c["lower_bound_bytes"]))
    print("| model | batch | optimizer | planned peak | lower bound | planned - bound | fragmentation |")
    print("|---|---:|---|---:|---:|---:|---:|")
    for r in rows:
        b = f"{r['batch']}" + (f" (seq {r['seq']})" if r["seq"] else "")
        print(f"| {r['model']} | {b} | {r['optimizer']} | {mib(r['predicted_peak_bytes'])} | "
              f"{mib(r['lower_bound_bytes'])} | "
              f"{r['predicted_peak_bytes'] - r['lower_bound_bytes']:,} B | "
              f"{100 * (r['predicted_peak_bytes'] / r['lower_bound_bytes'] - 1):.3f} % |")
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", help="models to run (default: all four)")
    ap.add_argument("--optimizers", nargs="*", default=["adamw", "sgd"], choices=["adamw", "sgd"])
    ap.add_argument("--frag-table", action="store_true", help="only memc's planned peak vs lower bound")
    ap.add_argument("--json", help="write every number here")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rows = frag_table(tmp) if args.frag_table else compare(args, tmp)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
