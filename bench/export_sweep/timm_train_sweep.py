"""timm families (models_timm.SPECS) exported in train() mode and run through memc, one model at a time.

    /tmp/timm-venv/bin/python bench/export_sweep/timm_train_sweep.py [--only NAME ...]
    /tmp/timm-venv/bin/python bench/export_sweep/timm_train_sweep.py --table   # markdown table of results.jsonl
    env: TRAIN_OUT (default /tmp/timm_sweep_train), MEMC (default build/memc)

Two exports per model and exporter (dynamo with optimize=False, as memc's Python package makes it;
TorchScript opset 17 with training=TrainingMode.TRAINING, do_constant_folding=False and the initializers
kept as inputs, the buffers restored after the trace, as memc's package does):
  drop:   drop_rate=0.1 and drop_path_rate=0.1 where the constructor takes them; memc compile + 3 steps (epochs of one batch),
          losses finite (dropout / drop-path draws differ from PyTorch's, so no comparison).
  nodrop: every drop rate 0; memc compile + 1 step with --dump-grads; the first loss and every gradient
          against PyTorch's train() forward/backward on the same weights and batch (BatchNorm batch stats).
Float buffers that memc would train are passed to --freeze (what memc.compile does). One JSON line a
run is appended to $TRAIN_OUT/results.jsonl as it finishes."""
import argparse
import copy
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models_timm as MT  # noqa: E402
import export_all as E  # noqa: E402

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
OUT = os.environ.get("TRAIN_OUT", "/tmp/timm_sweep_train")
MEMC = os.environ.get("MEMC", os.path.abspath("build/memc"))
TIMEOUT = 300
RANDOM_OPS = ("Dropout", "Bernoulli", "RandomUniform", "RandomUniformLike", "RandomNormal", "RandomNormalLike", "Multinomial")


class TrainLogits(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.m = inner

    def forward(self, pixel_values):
        out = self.m(pixel_values)
        return out[0] if isinstance(out, (tuple, list)) else out


def build(name, drop):
    ctor, img = MT.SPECS[name]
    torch.manual_seed(0)
    tried = []
    r = 0.1 if drop else 0.0  # nodrop passes 0 explicitly: swin/swinv2 default to drop_path_rate=0.1, nest to 0.5
    kws = [dict(drop_rate=r, drop_path_rate=r), dict(drop_rate=r), {}]
    for kw in kws:
        try:
            m = ctor(**kw)
            break
        except TypeError as e:
            tried.append(f"{kw}: {str(e)[:120]}")
    else:
        raise RuntimeError("no constructor call worked: " + "; ".join(tried))
    if not drop:  # any dropout / drop-path left active by a default the ctor does not expose: off
        from timm.layers import DropPath
        for mod in m.modules():
            if isinstance(mod, nn.modules.dropout._DropoutNd) and mod.p > 0:
                tried.append(f"{type(mod).__name__} p={mod.p} set to 0")
                mod.p = 0.0
            elif isinstance(mod, DropPath) and mod.drop_prob > 0:
                tried.append(f"DropPath {mod.drop_prob} set to 0")
                mod.drop_prob = 0.0
    E.make_unique_(m, 1234)
    model = TrainLogits(m)
    kw = dict(kw, forced_off=len([t for t in tried if "set to 0" in t]))
    model.train()
    return model, img, kw


def batch(img, seed=10):
    rng = np.random.default_rng(seed)
    return rng.standard_normal((4, 3, img, img)).astype(np.float32), np.array([3, 1, 7, 0], np.int64)


def export(model, x, path, exporter):
    xt = torch.from_numpy(x)
    if exporter == "dynamo_noopt":
        with tempfile.TemporaryDirectory() as td:
            tmp = os.path.join(td, "m.onnx")
            torch.onnx.export(model, (xt,), tmp, input_names=["pixel_values"], output_names=["logits"], dynamo=True,
                              optimize=False, dynamic_shapes=({0: torch.export.Dim.AUTO},))
            m = onnx.load(tmp, load_external_data=True)
        onnx.save_model(m, path)
    else:
        bufs = {n: b.detach().clone() for n, b in model.named_buffers()}
        try:
            torch.onnx.export(model, (xt,), path, input_names=["pixel_values"], output_names=["logits"], opset_version=17,
                              dynamo=False, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                              keep_initializers_as_inputs=True, dynamic_axes={"pixel_values": {0: "batch"}})
        finally:
            with torch.no_grad():
                for n, b in model.named_buffers():
                    b.copy_(bufs[n])
        m = onnx.load(path)
        changed = False
        for init in m.graph.initializer:
            if init.name in bufs and not np.array_equal(numpy_helper.to_array(init), bufs[init.name].numpy()):
                init.CopyFrom(numpy_helper.from_array(bufs[init.name].numpy().astype(numpy_helper.to_array(init).dtype), init.name))
                changed = True
        if changed:
            onnx.save(m, path)


def sh(cmd):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=OUT, capture_output=True, text=True, timeout=TIMEOUT)
        rc, se = p.returncode, p.stderr
        so = p.stdout
    except subprocess.TimeoutExpired:
        rc, se, so = "TIMEOUT", "", ""
    errs = [l for l in se.splitlines() if l.strip() and not l.startswith("memc: warning:")]
    return {"cmd": "cd " + OUT + " && " + " ".join(shlex.quote(c) for c in cmd), "rc": rc, "seconds": round(time.time() - t0, 1),
            "errors": errs[:10], "stdout": so}


def torch_train_step(model, x, y, dtype=torch.float32):
    ref = copy.deepcopy(model).to(dtype)
    ref.train()
    ref.zero_grad(set_to_none=True)
    loss = F.cross_entropy(ref(torch.from_numpy(x).to(dtype)), torch.from_numpy(y))
    loss.backward()
    grads = {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p)) for n, p in ref.named_parameters()}
    return float(loss), grads


def one(name, exporter, variant):
    drop = variant == "drop"
    row = {"model": name, "exporter": exporter, "variant": variant}
    base = f"{name}_{exporter}_{variant}"
    model, img, kw = build(name, drop)
    row["ctor_kwargs"] = kw
    x, y = batch(img)
    ref_loss, ref_grads = (None, None) if drop else torch_train_step(model, x, y)
    # float64 PyTorch: the control of what float32 rounding alone does (gradients ~0 in exact arithmetic)
    f64_loss, f64_grads = (None, None) if drop else torch_train_step(model, x, y, torch.float64)
    path = os.path.join(OUT, base + ".onnx")
    t0 = time.time()
    try:
        export(model, x, path, exporter)
    except Exception as e:
        row["status"] = "export_failed"
        row["error"] = f"{type(e).__name__}: {' '.join(str(e).split())[:400]}"
        return row
    row["export_seconds"] = round(time.time() - t0, 1)
    m = onnx.load(path)
    hist = {}
    for n in m.graph.node:
        hist[n.op_type] = hist.get(n.op_type, 0) + 1
    row["random_ops"] = {k: v for k, v in hist.items() if k in RANDOM_OPS}
    row["bn_ops"] = hist.get("BatchNormalization", 0)
    np.savez(os.path.join(OUT, base + ".data.npz"), pixel_values=x, y=y)
    ins = sh([MEMC, "inspect", base + ".onnx", "--batch", "4", "--json"])
    if ins["rc"] != 0:
        row.update(status="inspect_failed", error=ins["errors"][:2], cmd=ins["cmd"])
        return row
    trainable = json.loads(ins["stdout"]).get("trainable_params", [])
    params = {n for n, _ in model.named_parameters()}
    fbufs = {n for n, b in model.named_buffers() if b.is_floating_point()}
    freeze = sorted(fbufs & set(trainable))
    row["freeze"] = len(freeze)
    row["memc_trains_nonparam"] = sorted(set(trainable) - params - fbufs)[:10]
    row["params_not_trained_by_memc"] = sorted(params - set(trainable))[:10]
    plan = base + ".plan"
    cmd = [MEMC, "compile", base + ".onnx", "--batch", "4", "-o", plan, "--force", "--threads", "1"]
    if freeze:
        cmd += ["--freeze", ",".join(freeze)]
    c = sh(cmd)
    if c["rc"] != 0:
        row.update(status="compile_failed", error=c["errors"][:2], cmd=c["cmd"])
        return row
    epochs = "3" if drop else "1"  # one batch of 4 an epoch
    r = sh([MEMC, "run", plan, "--data", base + ".data.npz", "--epochs", epochs, "--threads", "1", "--dump-grads",
            base + ".grads.npz", "--json", base + ".run.json", "--force", "--quiet"])
    if r["rc"] != 0:
        row.update(status="run_failed", error=r["errors"][:2], cmd=r["cmd"])
        return row
    rep = json.load(open(os.path.join(OUT, base + ".run.json")))
    losses = rep.get("losses") or []
    row["losses"] = losses
    row["run_status"] = rep.get("status")
    if not losses or not all(np.isfinite(losses)):
        row["status"] = "loss_not_finite"
        return row
    if drop:
        row["status"] = "ok"
        return row
    row["torch_loss"] = ref_loss
    row["loss_rel"] = abs(losses[0] - ref_loss) / abs(ref_loss)
    g = np.load(os.path.join(OUT, base + ".grads.npz"))
    # initializer -> parameter: by name, else by value (export_all.match)
    mapping = {k: [(k, "id")] for k in g.files if k in params}
    rest = [k for k in g.files if k not in params and k != "loss"]
    if rest:
        vm, _, _ = E.match(m, model)
        for k in rest:
            if k in vm:
                mapping[k] = vm[k]
    row["grads_unmapped"] = [k for k in g.files if k not in mapping and k != "loss"][:10]
    row["params_without_memc_grad"] = sorted(params - {p for hs in mapping.values() for p, _ in hs})[:10]
    row["grad_worst"], row["grad_n"], row["grad_over_1e-4"] = grad_errs(g, mapping, ref_grads, params)
    # against float64 PyTorch: memc's error and PyTorch float32's, tensor by tensor
    row["f64_loss_rel"] = {"memc": abs(losses[0] - f64_loss) / abs(f64_loss), "torch_f32": abs(ref_loss - f64_loss) / abs(f64_loss)}
    w64, _, o64 = grad_errs(g, mapping, f64_grads, params)
    t32 = {k: ref_grads[k].numpy() for k in params}
    wt, _, ot = grad_errs(t32, {k: [(k, "id")] for k in params}, f64_grads, params)
    row["grad_worst_vs_f64"] = w64
    row["torch_f32_worst_vs_f64"] = wt
    row["memc_worse_than_torch_f32_vs_f64"] = {k: [v, ot.get(k, 0.0)] for k, v in o64.items()
                                               if v > 1e-4 and v > 10 * ot.get(k, 0.0)}
    row["status"] = "ok"
    return row


def grad_errs(g, mapping, ref_grads, params):
    """run_sweep's metric per tensor: max|diff| / max(max|ref|, 1e-4 * the largest reference gradient)."""
    errs = {}
    gmax = max(float(ref_grads[p].abs().max()) for p in params)
    for k, hits in mapping.items():
        acc = None
        for p, tr in hits:
            rg = ref_grads[p]
            if tr == "T":
                rg = rg.t()
            elif tr == "R":
                rg = rg.reshape(g[k].shape)
            elif tr.startswith("S"):
                off = int(tr[1:])
                rg = rg.reshape(-1)[off:off + g[k].size].reshape(g[k].shape)
            acc = rg.clone() if acc is None else acc + rg
        a = acc.double().numpy()
        if a.shape != g[k].shape:
            errs[k] = float("inf")
            continue
        # run_sweep's metric: max|diff| / max(max|ref|, 1e-4 * the largest reference gradient)
        errs[k] = float(np.abs(np.asarray(g[k], np.float64) - a).max() / max(float(np.abs(a).max()), 1e-4 * gmax))
    if not errs:
        return None, 0, {}
    w = max(errs, key=errs.get)
    return [w, errs[w]], len(errs), {k: v for k, v in sorted(errs.items(), key=lambda kv: -kv[1]) if v > 1e-4}


def table():
    """Markdown table of $TRAIN_OUT/results.jsonl (the last row of each model/exporter/variant)."""
    rows = {}
    for l in open(os.path.join(OUT, "results.jsonl")):
        r = json.loads(l)
        rows[(r["model"], r["exporter"], r["variant"])] = r
    print("| model | exporter | nodrop: 1st loss memc / torch (rel) | worst grad rel. err (tensor) | vs float64: memc / torch f32 "
          "| drop 0.1: memc losses (3 steps) | random ops in the drop export |\n|---|---|---|---|---|---|---|")
    for name in MT.SPECS:
        for exp in ("dynamo_noopt", "ts_train"):
            a, b = rows.get((name, exp, "nodrop")), rows.get((name, exp, "drop"))
            if a is None and b is None:
                continue
            def fail(r):
                e = r.get("error")
                e = e[0] if isinstance(e, list) and e else e
                return f"**{r['status']}**: {str(e)[:160]}"
            if a and a.get("status") == "ok":
                c1 = f"{a['losses'][0]:.6f} / {a['torch_loss']:.6f} ({a['loss_rel']:.1e})"
                gw = a.get("grad_worst") or ["-", 0.0]
                c2 = f"{gw[1]:.1e} ({gw[0]})" if gw[1] <= 1e-4 else f"**{gw[1]:.1e}** ({gw[0]})"
                w64, t64 = a.get("grad_worst_vs_f64") or ["-", 0.0], a.get("torch_f32_worst_vs_f64") or ["-", 0.0]
                c3 = f"{w64[1]:.1e} / {t64[1]:.1e}" + (" **memc worse**" if a.get("memc_worse_than_torch_f32_vs_f64") else "")
            else:
                c1, c2, c3 = (fail(a) if a else "-"), "", ""
            if b and b.get("status") == "ok":
                c4 = " → ".join(f"{v:.3f}" for v in b["losses"])
                c5 = ", ".join(f"{k} {v}" for k, v in b["random_ops"].items())
            else:
                c4, c5 = (fail(b) if b else "-"), ""
            print(f"| {name} | {exp} | {c1} | {c2} | {c3} | {c4} | {c5} |")


def main():
    if "--table" in sys.argv:
        return table()
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--exporters", nargs="*", default=["dynamo_noopt", "ts_train"])
    ap.add_argument("--variants", nargs="*", default=["nodrop", "drop"])
    a = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    import timm
    print("versions torch", torch.__version__, "timm", timm.__version__, flush=True)
    with open(os.path.join(OUT, "results.jsonl"), "a") as f:
        for name in MT.SPECS:
            if a.only and name not in a.only:
                continue
            for exp in a.exporters:
                for var in a.variants:
                    t0 = time.time()
                    try:
                        row = one(name, exp, var)
                    except Exception as e:
                        row = {"model": name, "exporter": exp, "variant": var, "status": "script_error",
                               "error": f"{type(e).__name__}: {str(e)[:400]}", "trace": traceback.format_exc()[-1500:]}
                    row["seconds"] = round(time.time() - t0, 1)
                    f.write(json.dumps(row, default=str) + "\n")
                    f.flush()
                    print(json.dumps({k: row.get(k) for k in ("model", "exporter", "variant", "status", "loss_rel", "grad_worst",
                                                              "losses", "random_ops", "error", "seconds")}, default=str), flush=True)


if __name__ == "__main__":
    main()
