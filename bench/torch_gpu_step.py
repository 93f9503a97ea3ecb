#!/usr/bin/env python3
"""PyTorch's training step on a GPU (eager or torch.compile), the counterpart of memc's in
bench/device_check.sh and bench/gpu_speed.sh.

    python3 bench/torch_gpu_step.py --model vit_b_16 --onnx /tmp/vitb.onnx --data /tmp/vit224.npz \
        --batch 16 --precision bf16-mixed --remat blocks [--compile] [--device cpu]
    python3 bench/torch_gpu_step.py --model vit_l_16 --onnx /tmp/vitl.onnx --data /tmp/vit224_64.npz \
        --sweep 16:fp32:none,16:bf16-mixed:none,64:bf16-mixed:blocks      # one JSON line per config
    python3 bench/torch_gpu_step.py --model bigbird_long --onnx /tmp/bigbird.onnx --data /tmp/bb.npz \
        --batch 8 --precision bf16-mixed

The same model and settings as memc's run beside it:
  vit_b_16, vit_l_16  torchvision's, with the weights of the ONNX file memc trains
               (bench/random_weights.py: every initializer whose name and shape match a
               parameter); data: the first `batch` rows of the .npz (x, y)
  bigbird_long  transformers' BigBirdForSequenceClassification built by
               models/export_bigbird_long.py's build() (bigbird-roberta-base dimensions,
               attention_type original_full, 2 labels), the ONNX file's initializers matched by
               name and shape (201 of its 203 parameters: the pooler, unused by the
               classifier, is not in the export); data: input_ids, attention_mask, y (the
               sequence length is the data's)
AdamW (lr 1e-3, weight decay 0.01; PyTorch's default implementation), dropout as exported, and
  fp32        f32 everywhere, TF32 off (memc's default)
  bf16-mixed  autocast to bf16 for the forward and the loss, f32 parameters and AdamW state
  --remat blocks  torch.utils.checkpoint around each encoder block (memc's --remat blocks)
  --compile   torch.compile: --compile-scope model (default: the whole model) or blocks
              (each encoder block compiled on its own, PyTorch's "regional compilation": the
              identical blocks share one compiled graph, so it compiles in a fraction of the
              time); the optimizer step stays eager. A failure (or --compile-timeout) is
              reported as a JSON line {"error": ...} (then exit 1), not a crash; so is any
              configuration's failure in a --sweep (exit 0: the lines say which).
  --device cpu  the same on the CPU (a rehearsal of the pipeline; no CUDA memory figures)

Prints one JSON line per configuration (--sweep: several in one process, the model built once
and its initial weights restored before each): step_ms_median over --runs steps after --warmup,
torch.cuda.max_memory_allocated over the timed steps (PyTorch's own count of its allocations; the
CUDA context and cuBLAS's workspace are outside it), first_step_s (the first warm-up step, which
includes torch.compile's compilation).
"""
import argparse
import contextlib
import gc
import json
import os
import resource
import signal
import statistics
import sys
import time
import traceback
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
warnings.filterwarnings("ignore")


def onnx_initializers(path):
    import onnx
    from onnx import numpy_helper
    return {i.name: numpy_helper.to_array(i) for i in onnx.load(path).graph.initializer}


def load_matching(model, inits):
    """Every initializer whose name and shape match an entry of the state dict; the rest keep
    torch's init. Returns (parameters loaded, parameters, the names of those not loaded)."""
    import torch
    state = model.state_dict()
    for key, value in state.items():
        if key in inits and tuple(inits[key].shape) == tuple(value.shape):
            state[key] = torch.from_numpy(inits[key].copy())
    model.load_state_dict(state)
    names = [n for n, _ in model.named_parameters()]
    missing = [n for n, p in model.named_parameters() if n not in inits or tuple(inits[n].shape) != tuple(p.shape)]
    return len(names) - len(missing), len(names), missing


def build(name, onnx_path):
    """(model on the CPU, loaded, of, missing, blocks): blocks are the encoder blocks (remat,
    regional compile); missing, the parameters the ONNX file has no tensor for (bigbird_long: the
    pooler, which its classifier does not use and the export dropped)."""
    import torch
    inits = onnx_initializers(onnx_path)
    if name == "bigbird_long":
        threads = torch.get_num_threads()
        sys.path.insert(0, os.path.join(ROOT, "models"))
        import export_bigbird_long as B  # its config; export_models (imported by it) sets these two:
        torch.use_deterministic_algorithms(False)
        torch.set_num_threads(threads)
        model = B.build(12)
        model.config.return_dict = True  # transformers 5 reads .last_hidden_state inside, whatever return_dict says
        blocks = model.bert.encoder.layer
    else:
        import torchvision
        model = getattr(torchvision.models, name)()
        blocks = model.encoder.layers
    loaded, of, missing = load_matching(model, inits)
    del inits
    return model, loaded, of, missing, blocks


class Timeout(Exception):
    pass


def run_config(args, model, blocks, batch, precision, remat, compile_scope, data, dev):
    import torch
    import torch.nn.functional as F
    import torch.utils.checkpoint as cp
    cuda = dev.type == "cuda"
    forwards = {}
    if remat == "blocks":
        for i, block in enumerate(blocks):
            forwards[i] = block.forward
            block.forward = lambda *a, f=block.forward, **k: cp.checkpoint(f, *a, use_reentrant=False, **k)
    call = model
    if compile_scope == "model":
        call = torch.compile(model)
    elif compile_scope == "blocks":
        for block in blocks:
            block.compile()
    bigbird = args.model == "bigbird_long"
    if bigbird:
        ids = torch.from_numpy(data["input_ids"][:batch]).to(dev)
        mask = torch.from_numpy(data["attention_mask"][:batch]).to(dev)
    else:
        x = torch.from_numpy(data["x"][:batch]).to(dev)
    y = torch.from_numpy(data["y"][:batch]).to(dev)
    if len(y) < batch:
        raise SystemExit(f"{args.data}: {len(y)} rows, fewer than batch {batch}")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.01)

    def autocast():
        if precision == "bf16-mixed":
            return torch.autocast(device_type=dev.type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def step():
        opt.zero_grad(set_to_none=True)
        with autocast():
            logits = call(input_ids=ids, attention_mask=mask).logits if bigbird else call(x)
            loss = F.cross_entropy(logits, y)
        loss.backward()
        opt.step()
        return loss

    def sync():
        if cuda:
            torch.cuda.synchronize()

    allocated_at_start = torch.cuda.memory_allocated() if cuda else None
    first = None
    for i in range(args.warmup):
        t0 = time.perf_counter()
        step()
        sync()
        if i == 0:
            first = time.perf_counter() - t0
    if cuda:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(args.runs):
        t0 = time.perf_counter()
        loss = step()
        sync()
        times.append((time.perf_counter() - t0) * 1e3)
    out = {
        "step_ms_median": statistics.median(times), "step_ms_all": [round(t, 3) for t in times],
        "max_memory_allocated_bytes": torch.cuda.max_memory_allocated() if cuda else None,
        "allocated_at_start_bytes": allocated_at_start,
        "first_step_s": round(first, 3) if first is not None else None,
        "last_loss": float(loss),
    }
    if bigbird:
        out["seq"] = int(ids.shape[1])
    return out, opt, forwards


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="vit_b_16", choices=["vit_b_16", "vit_l_16", "bigbird_long"])
    ap.add_argument("--onnx", required=True)
    ap.add_argument("--data", required=True)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--precision", default="fp32", choices=["fp32", "bf16-mixed"])
    ap.add_argument("--remat", default="none", choices=["none", "blocks"])
    ap.add_argument("--sweep", default=None, help="BATCH:PRECISION:REMAT,... (replaces --batch/--precision/--remat)")
    ap.add_argument("--compile", action="store_true", help="torch.compile (see --compile-scope)")
    ap.add_argument("--compile-scope", default="model", choices=["model", "blocks"])
    ap.add_argument("--compile-timeout", type=float, default=0, help="seconds one configuration may take (0: none); then an error line")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    ap.add_argument("--threads", type=int, default=0, help="--device cpu: torch.set_num_threads (0: torch's default)")
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--runs", type=int, default=10)
    args = ap.parse_args()
    configs = []
    for c in (args.sweep.replace(",", " ").split() if args.sweep else [f"{args.batch}:{args.precision}:{args.remat}"]):
        b, p, r = c.split(":")
        assert p in ("fp32", "bf16-mixed") and r in ("none", "blocks"), c
        configs.append((int(b), p, r))

    import numpy as np
    import torch
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = torch.device(args.device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        print(json.dumps({"model": args.model, "error": "torch.cuda.is_available() is False"}), flush=True)
        return 1
    t0 = time.perf_counter()
    model, loaded, of, missing, blocks = build(args.model, args.onnx)
    initial = {k: v.detach().clone() for k, v in model.state_dict().items()} if len(configs) > 1 else None
    model.to(dev).train()
    setup_s = time.perf_counter() - t0
    data = dict(np.load(args.data))
    scope = args.compile_scope if args.compile else None

    alarmed = []

    def on_alarm(signum, frame):
        alarmed.append(True)
        raise Timeout()

    signal.signal(signal.SIGALRM, on_alarm)
    failed = 0
    for n, (batch, precision, remat) in enumerate(configs):
        head = {"model": args.model, "batch": batch, "precision": precision, "remat": remat,
                "compile": scope or False, "device": args.device, "warmup": args.warmup, "runs": args.runs}
        if args.model == "bigbird_long":
            head["seq"] = int(data["input_ids"].shape[1])
            head["attn_implementation"] = getattr(model.config, "_attn_implementation", None)
        if n and initial is not None:
            model.load_state_dict(initial)
        started = time.perf_counter()
        opt = forwards = None
        alarmed.clear()
        if args.compile_timeout > 0:
            signal.alarm(max(1, int(args.compile_timeout)))
        try:
            res, opt, forwards = run_config(args, model, blocks, batch, precision, remat, scope, data, dev)
            signal.alarm(0)
            line = {**head, **res, "tensors_from_onnx": loaded, "of": of, "not_from_onnx": missing, "setup_s": round(setup_s, 2),
                    "torch": torch.__version__,
                    "gpu": torch.cuda.get_device_name(0) if dev.type == "cuda" else "cpu",
                    "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}
        except BaseException as e:  # a compile failure, an out-of-memory, --compile-timeout: one error line, then the next config
            signal.alarm(0)
            if isinstance(e, KeyboardInterrupt) or not (args.compile or args.sweep):
                raise  # one eager run (bench/device_check.sh) fails as it always did
            failed += 1
            if alarmed:  # (inductor may wrap the Timeout in its own error)
                line = {**head, "error": f"timed out after {args.compile_timeout:.0f} s (--compile-timeout)"
                        + (" in torch.compile" if scope else "")}
            else:
                msg = f"{type(e).__name__}: {e}".strip().splitlines()
                line = {**head, "error": " ".join(msg[:1] + msg[-1:] if len(msg) > 1 else msg)[:500],
                        "traceback_tail": traceback.format_exc().strip().splitlines()[-3:]}
        line["config_s"] = round(time.perf_counter() - started, 2)
        print(json.dumps(line), flush=True)
        # undo the config: checkpointing, compiled blocks, optimizer state, gradients, compiled graphs
        signal.alarm(0)
        if remat == "blocks":
            for i, block in enumerate(blocks):
                block.__dict__.pop("forward", None)
        if scope == "blocks":
            for block in blocks:
                block._compiled_call_impl = None
        del opt, forwards
        model.zero_grad(set_to_none=True)
        if scope:
            torch._dynamo.reset()
        gc.collect()
        if dev.type == "cuda":
            torch.cuda.empty_cache()
    return 1 if failed and not args.sweep else 0  # a sweep's lines say which failed


if __name__ == "__main__":
    sys.exit(main())
