#!/usr/bin/env python3
"""Fresh-init sweep: does memc train a *freshly initialized* model (default init, no make_unique_)
as PyTorch does? A slow study, not a test.

The other sweeps perturb every weight to be unique (export_all.make_unique_), which hides what
torch's exporters do to a fresh model: they merge equal-valued initializers (LayerNorm weights all 1,
zero biases, BatchNorm running statistics) and memc has to untie them. Here every model keeps its
default init (torch.manual_seed), eval(), dropout 0, and one SGD step is compared end to end.

    TIMM_PKGS=/tmp/timm_pkgs FRESH_OUT=/tmp/fresh_sweep MEMC=$PWD/build/memc \\
        build/python-test-venv/bin/python bench/export_sweep/fresh_sweep.py [--groups hf lm timm r3 r4 r5] \\
        [--only NAME ...] [--exporters dynamo ts] [--lr 0.5] [--timeout 180]
    ... fresh_sweep.py --table          # the table of $FRESH_OUT/results.jsonl

For every model and exporter (dynamo: torch.onnx.export(dynamo=True) defaults + dynamic shapes;
ts: dynamo=False, opset 17, default constant folding; both as export_all.py writes them):
  1. <m>_<exp>.onnx, <m>_<exp>.npz (graph inputs by name + y), as export_all.py / models_lm.py /
     models_timm.py make them (their model lists and batches are imported, not copied).
  2. memc compile --optimizer sgd --lr LR (memc's sgd: no momentum, weight decay 0, constant schedule),
     memc run --steps 1 --dump-grads --checkpoint, memc export --weights -> <m>_<exp>.after.onnx,
     memc infer on the export and on the after-step export.
  3. PyTorch: the same loss (cross-entropy, -100 ignored), backward, p -= lr * p.grad, then compares
       - the loss;
       - every gradient memc dumps under a PyTorch parameter name (rel. max error, floor 1e-4 of the
         largest reference grad, as run_sweep.py; key.bias / k_proj.bias left out of the worst);
       - the after-step logits, as the error of the change:
         |(memc_after - memc_before) - (torch_after - torch_before)|max / |torch_after - torch_before|max
         (memc_before/after from memc infer on the export / the after-step export);
       - every after-step initializer named as a PyTorch parameter against torch's updated parameter
         (the same change-relative error), for the diagnosis.
Each model+exporter runs in a subprocess with a timeout (default 180 s); one JSON line each in
$FRESH_OUT/results.jsonl. FINDING: after-step change error > 1e-3, loss rel. error > 1e-4, a named
grad > 1e-3, or memc refusing / crashing.
"""
import argparse
import json
import os
import re
import shlex
import subprocess
import sys
import time
import traceback
import warnings
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
OUT = os.environ.get("FRESH_OUT", os.path.abspath("fresh_sweep_out"))
MEMC = os.environ.get("MEMC", os.path.abspath("build/memc"))
TIMM_PKGS = os.environ.get("TIMM_PKGS", "")  # a --target folder holding timm, if it is not installed

# timm families (names of models_timm.SPECS): BatchNorm and LayerNorm ones
TIMM_PICK = ["resnet", "efficientnet", "mobilenetv3", "regnet", "regnety", "convnext", "convnextv2", "vit",
             "deit_distilled", "deit3", "swin", "swinv2", "beit_nofused", "eva02", "mixer", "poolformer",
             "pvt_v2", "levit", "xcit", "convmixer", "edgenext", "coat_lite", "ghostnet", "densenet",
             "efficientnet_ln", "caformer", "nfnet", "cait"]


# ----------------------------------------------------------------------------- model lists
def load_lists():
    """{name: dict(group, kind, label, ctor, img)}; export_all's own lists captured before
    models_lm / models_timm patch them in."""
    sys.path.insert(0, HERE)
    if os.path.isdir(TIMM_PKGS) and TIMM_PKGS not in sys.path:
        sys.path.append(TIMM_PKGS)
    import export_all as E
    orig = dict(text_models=E.text_models, image_models=E.image_models, text_batch=E.text_batch,
                image_batch=E.image_batch, export_ts=E.export_ts, do_one=E.do_one, torch_ref=E.torch_ref)
    jobs = {}
    for n, c in orig["text_models"]().items():
        jobs[n] = dict(group="hf", kind="text", label="seq", ctor=c, img=None)
    for n, c in orig["image_models"]().items():
        jobs[n] = dict(group="hf", kind="image", label="img", ctor=c, img=E.IMG)
    import models_lm as LM
    for n, (lab, c) in LM._lm_models().items():
        jobs[n] = dict(group="lm", kind="text", label=lab, ctor=c, img=None)
    try:
        import models_timm as MT
        for n in TIMM_PICK:
            c, s = MT.SPECS[n]
            jobs["timm_" + n] = dict(group="timm", kind="image", label="img",
                                     ctor=(lambda c=c: MT.TimmLogits(c())), img=s)
    except Exception as e:  # timm missing
        print(f"timm families skipped: {type(e).__name__}: {e}", flush=True)
    # the third, fourth and fifth rounds' configurations (models_round3.py, models_round4.py,
    # models_round5.py: each patches export_all's lists on import), under their own groups; a name
    # already listed keeps its job
    for mod, group in (("models_round3", "r3"), ("models_round4", "r4"), ("models_round5", "r5")):
        try:
            R = __import__(mod)
            for n, c in R.text_models().items():
                jobs.setdefault(n, dict(group=group, kind="text", label="seq", ctor=c, img=None))
            for n, c in R.image_models().items():
                jobs.setdefault(n, dict(group=group, kind="image", label="img", ctor=c, img=E.IMG))
        except Exception as e:
            print(f"{mod} skipped: {type(e).__name__}: {e}", flush=True)
    for k, v in orig.items():  # undo the patches
        setattr(E, k, v)
    return E, LM, jobs


# ----------------------------------------------------------------------------- helpers
def sh(cmd, timeout=150):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=OUT, capture_output=True, text=True, timeout=timeout,
                           env=dict(os.environ, LD_LIBRARY_PATH=os.path.dirname(MEMC)))
        rc, so, se = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired:
        rc, so, se = "TIMEOUT", "", ""
    return {"cmd": "cd " + OUT + " && LD_LIBRARY_PATH=" + os.path.dirname(MEMC) + " " + " ".join(shlex.quote(c) for c in cmd),
            "rc": rc, "seconds": round(time.time() - t0, 1),
            "errors": [l for l in se.splitlines() if l.strip() and not l.startswith("memc: warning:")][:10],
            "warnings": [l for l in se.splitlines() if l.startswith("memc: warning:")],
            "stdout": so}


def rel_change(memc_after, memc_before, t_after, t_before):
    import numpy as np
    d_t = t_after.astype(np.float64) - t_before
    d_m = memc_after.astype(np.float64) - memc_before
    den = float(np.abs(d_t).max())
    num = float(np.abs(d_m - d_t).max())
    return num / den if den > 0 else (0.0 if num == 0 else float("inf")), den


def build(E, LM, job, name, seed):
    import numpy as np
    import torch
    import torch.nn as nn
    E.seed_all(seed)
    inner = job["ctor"]()
    if hasattr(inner, "config") and hasattr(inner.config, "use_cache"):
        inner.config.use_cache = False
    for mod in inner.modules():
        if isinstance(mod, nn.modules.dropout._DropoutNd):
            mod.p = 0.0
    inner.eval()
    if job["kind"] == "text":
        model = E.TextLogits(inner)
        pad = inner.config.pad_token_id
        feeds, y = E.text_batch(pad, seed)
        if job["label"] != "seq":
            y = LM.token_labels(feeds["input_ids"], feeds["attention_mask"], job["label"], seed)
        names = ["input_ids", "attention_mask"]
    else:
        model = E.ImageLogits(inner)
        rng = np.random.default_rng(seed)
        s = job["img"]
        feeds = {"pixel_values": rng.standard_normal((E.B, 3, s, s)).astype(np.float32)}
        y = np.array([3, 1, 7, 0][:E.B], np.int64)
        names = ["pixel_values"]
    model.eval()
    return model, feeds, y, names


def export(E, model, feeds, names, kind, exporter, path):
    import torch
    args = tuple(torch.from_numpy(feeds[n]) for n in names)
    meta, errors = {}, []
    if exporter == "dynamo":
        Dim = torch.export.Dim
        if kind == "text":
            b, s = Dim("batch", min=1, max=1024), Dim("seq", min=2, max=64)
            tries = [("batch+seq", {n: {0: b, 1: s} for n in names}), ("batch", {n: {0: b} for n in names}),
                     ("static", None)]
        else:
            tries = [("batch", {n: {0: Dim("batch", min=1, max=1024)} for n in names}), ("static", None)]
        E.first_export(tries, lambda dd: E.export_dynamo(model, args, names, path, dd, optimize=True), meta, errors)
    else:
        E.first_export(E.ts_tries(kind), lambda dd: E.export_ts(model, args, names, path, dd, fold=True), meta, errors)
    return meta.get("dynamic"), errors


def clear_eval_caches(model):
    """Empty timm's eval-mode attention-bias caches (LeViT, EfficientFormer, TinyViT, ...).

    In eval() those modules reuse `attention_biases[:, idxs]` from the first forward. Filled under
    no_grad (the export's or the BatchNorm check's forward), the cache cuts attention_biases out of
    the backward, and after a step it still holds the old biases; training mode clears it."""
    for mod in model.modules():
        if isinstance(getattr(mod, "attention_bias_cache", None), dict):
            mod.attention_bias_cache = {}


def torch_step(model, feeds, y, names, lr):
    """loss, logits before, grads, logits after one plain SGD step, params before/after (numpy)."""
    import numpy as np
    import torch
    import torch.nn.functional as F
    args = tuple(torch.from_numpy(feeds[n]) for n in names)
    before = {n: p.detach().clone().numpy() for n, p in model.named_parameters()}
    model.zero_grad(set_to_none=True)
    clear_eval_caches(model)
    logits = model(*args)
    yt = torch.from_numpy(y)
    if logits.dim() == 3:
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), yt.reshape(-1), ignore_index=-100)
    else:
        loss = F.cross_entropy(logits, yt)
    loss.backward()
    grads = {n: (p.grad.detach().clone().numpy() if p.grad is not None else np.zeros(tuple(p.shape), np.float32))
             for n, p in model.named_parameters()}
    with torch.no_grad():
        for p in model.parameters():
            if p.grad is not None:
                p.sub_(lr * p.grad)
        clear_eval_caches(model)
        after_logits = model(*args).numpy()
    after = {n: p.detach().clone().numpy() for n, p in model.named_parameters()}
    return float(loss), logits.detach().numpy(), grads, after_logits, before, after


def bn_fused_copy(model, args, exporter):
    """The model as the exporter leaves it in eval(): each BatchNorm whose input is the direct output
    of a Conv (dynamo: or a Linear) folded into that layer (W*s, (b - mean)*s + beta, s = gamma/sqrt(var+eps))
    and replaced by identity (BatchNormAct: its activation alone). Returns (copy, pairs) or (None, [])
    when the model has no BatchNorm."""
    import copy
    import torch
    import torch.nn as nn
    bns = [n for n, m in model.named_modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)]
    if not bns:
        return None, []
    kinds = (nn.Conv1d, nn.Conv2d, nn.Linear) if exporter == "dynamo" else (nn.Conv1d, nn.Conv2d)
    prod, keep, pairs, hooks = {}, [], [], []
    for name, m in model.named_modules():
        if isinstance(m, kinds):
            def fh(mod, i, o, name=name):
                prod[id(o)] = name
                keep.append(o)
            hooks.append(m.register_forward_hook(fh))
    for name, m in model.named_modules():
        if isinstance(m, nn.modules.batchnorm._BatchNorm):
            hooks.append(m.register_forward_pre_hook(lambda mod, i, name=name: pairs.append((prod.get(id(i[0])), name))))
    with torch.no_grad():
        model(*args)
    for h in hooks:
        h.remove()
    used = {}
    for c, b in pairs:
        if c:
            used[c] = used.get(c, 0) + 1
    pairs = [(c, b) for c, b in dict((b, (c, b)) for c, b in pairs).values() if c and used[c] == 1]
    fm = copy.deepcopy(model)
    mods = dict(fm.named_modules())
    with torch.no_grad():
        for c, b in pairs:
            conv, bn = mods[c], mods[b]
            sc = bn.weight / torch.sqrt(bn.running_var + bn.eps)
            w = conv.weight * sc.reshape([-1] + [1] * (conv.weight.dim() - 1))
            b0 = conv.bias if conv.bias is not None else torch.zeros_like(bn.running_mean)
            conv.weight.copy_(w)
            conv.bias = nn.Parameter((b0 - bn.running_mean) * sc + bn.bias)
            if hasattr(bn, "act") and hasattr(bn, "drop"):
                bn.forward = (lambda x, bn=bn: bn.act(bn.drop(x)))
            else:
                bn.forward = (lambda x: x)
            bn.weight.requires_grad_(False)
            bn.bias.requires_grad_(False)
    return fm, pairs


def float_buffers(model):
    return {n: b.detach().clone().numpy() for n, b in model.named_buffers() if b.is_floating_point()}


# ----------------------------------------------------------------------------- one model + exporter
def run_one(name, exporter, lr):
    import numpy as np
    import onnx
    import torch
    from onnx import numpy_helper
    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    E, LM, jobs = load_lists()
    job = jobs[name]
    seed = 10 + zlib.crc32(name.encode()) % 1000
    base = f"{name}_{exporter}"
    res = {"model": name, "exporter": exporter, "group": job["group"], "label": job["label"], "seed": seed, "lr": lr}
    model, feeds, y, names = build(E, LM, job, name, seed)
    pnames = {n for n, _ in model.named_parameters()}
    path = os.path.join(OUT, base + ".onnx")
    t0 = time.time()
    dyn, errs = export(E, model, feeds, names, job["kind"], exporter, path)
    res["export_seconds"] = round(time.time() - t0, 1)
    res["dynamic"] = dyn
    if dyn is None:
        res["status"] = "export_failed"
        res["export_errors"] = errs
        return res
    data = base + ".npz"
    np.savez(os.path.join(OUT, data), y=y, **feeds)
    m = onnx.load(path)
    inits = {i.name: numpy_helper.to_array(i) for i in m.graph.initializer}
    # the exporter's view of the parameters: which keep their name in the file
    res["params_total"] = len(pnames)
    res["params_missing_by_name"] = sorted(pnames - set(inits))
    # value merges: initializers whose value equals several parameters' (fresh init: ones / zeros)
    params0 = {n: p.detach().clone().numpy() for n, p in model.named_parameters()}
    bufs = float_buffers(model)

    def equal_to(a, pool):
        return [n for n, p in pool.items() if p.shape == a.shape and np.array_equal(p, a)]
    merged = {}
    for k, a in inits.items():
        if a.dtype != np.float32:
            continue
        hits = equal_to(a, params0) + ["buffer:" + b for b in equal_to(a, bufs)]
        if len(hits) > 1:
            merged[k] = hits
    res["n_value_shared_initializers"] = len(merged)
    res["value_shared_examples"] = dict(list(merged.items())[:6])

    # ---- torch (for a model with BatchNorm: also the fused form the eval() export holds)
    import torch as _t
    clear_eval_caches(model)  # the export's trace filled them with tensors deepcopy refuses (HF LeViT)
    fm, pairs = bn_fused_copy(model, tuple(_t.from_numpy(feeds[n]) for n in names), exporter)
    loss_t, logits_t, grads_t, after_logits_t, p_before, p_after = torch_step(model, feeds, y, names, lr)
    res["torch_loss"] = loss_t
    res["reference"] = "module"
    if fm is not None:
        n_bn_nodes = sum(1 for n in m.graph.node if n.op_type == "BatchNormalization")
        n_bn = sum(1 for _, mm in model.named_modules() if isinstance(mm, _t.nn.modules.batchnorm._BatchNorm))
        res["bn_modules"], res["bn_fused_pairs"], res["bn_nodes_in_onnx"] = n_bn, len(pairs), n_bn_nodes
        res["bn_fusion_consistent"] = (n_bn - len(pairs) == n_bn_nodes)
        if pairs:
            res["unfused_ref"] = {"loss": loss_t}
            unf = (logits_t, after_logits_t)
            loss_t, logits_t, grads_t, after_logits_t, p_before, p_after = torch_step(fm, feeds, y, names, lr)
            pnames = {n for n, p in fm.named_parameters() if p.requires_grad}
            grads_t = {k: v for k, v in grads_t.items() if k in pnames}
            res["torch_loss"] = loss_t
            res["reference"] = f"bn-fused ({len(pairs)} of {n_bn} BatchNorms)"

    # ---- memc
    shape = ["--batch", str(E.B)] + (["--seq", str(E.T)] if job["kind"] == "text" else [])
    ins = sh([MEMC, "inspect", base + ".onnx"] + shape + ["--json"])
    trainable = []
    try:
        trainable = json.loads(ins["stdout"])["trainable_params"]
    except Exception:
        pass
    res["memc_trainable"] = len(trainable)
    # freeze what memc would train that is a float buffer's value and no parameter's (run_sweep.py's rule,
    # restricted so that a ones/zeros tensor a parameter could be is never frozen)
    freeze = [n for n in trainable if n in inits and equal_to(inits[n], bufs) and not equal_to(inits[n], params0)
              and not (inits[n].ndim == 2 and equal_to(inits[n].T, params0))]
    res["freeze"] = freeze
    plan = base + ".plan"
    cmd = [MEMC, "compile", base + ".onnx"] + shape + ["--optimizer", "sgd", "--lr", repr(lr), "-o", plan,
                                                        "--force", "--threads", "1"]
    if freeze:
        cmd += ["--freeze", ",".join(freeze)]
    comp = sh(cmd)
    res["compile"] = {k: comp[k] for k in ("cmd", "rc", "errors", "seconds")}
    res["param_findings"] = [f for f in (json.loads(ins["stdout"]).get("param_findings", []) if ins["rc"] == 0 else [])][:20]
    res["warnings_all"] = comp["warnings"][:40]
    res["tie_warnings"] = [w for w in comp["warnings"] if re.search(r"shared|tied|tie|merged|untie", w, re.I)]
    if comp["rc"] != 0:
        res["status"] = "compile_failed"
        return res
    gfile, ck, jf = base + ".g.npz", base + ".ck", base + ".run.json"
    import shutil
    shutil.rmtree(os.path.join(OUT, ck), ignore_errors=True)
    run = sh([MEMC, "run", plan, "--data", data, "--steps", "1", "--dump-grads", gfile, "--checkpoint", ck,
              "--json", jf, "--force", "--quiet", "--threads", "1"])
    res["run"] = {k: run[k] for k in ("cmd", "rc", "errors", "seconds")}
    if run["rc"] != 0:
        res["status"] = "run_failed"
        return res
    after = base + ".after.onnx"
    ex = sh([MEMC, "export", plan, "--weights", ck, "-o", after, "--force"])
    res["export"] = {k: ex[k] for k in ("cmd", "rc", "errors", "seconds")}
    inf0 = sh([MEMC, "infer", base + ".onnx", "--input", data, "-o", base + ".before.out.npz", "--force"])
    res["infer_before"] = {k: inf0[k] for k in ("cmd", "rc", "errors")}
    inf1 = sh([MEMC, "infer", after, "--input", data, "-o", base + ".after.out.npz", "--force"]) if ex["rc"] == 0 else {"rc": "skipped"}
    res["infer_after"] = {k: inf1.get(k) for k in ("cmd", "rc", "errors")}

    g = np.load(os.path.join(OUT, gfile))
    rep = json.load(open(os.path.join(OUT, jf)))
    loss_m = float(g["loss"]) if "loss" in g.files else (rep.get("losses") or [float("nan")])[0]
    res["memc_loss"] = loss_m
    res["loss_rel"] = abs(loss_m - loss_t) / max(abs(loss_t), 1e-12)

    # named grads
    gmax = max((float(np.abs(v).max()) for v in grads_t.values()), default=0.0)
    per, shape_mm = {}, {}
    for k in g.files:
        if k not in pnames:
            continue
        if g[k].shape != grads_t[k].shape:
            shape_mm[k] = f"{g[k].shape} vs {grads_t[k].shape}"
            continue
        r = grads_t[k]
        per[k] = float(np.abs(g[k] - r).max() / max(float(np.abs(r).max()), 1e-4 * gmax, 1e-30))
    res["grad_n_compared"] = len(per)
    res["grad_dumped_total"] = len([k for k in g.files if k != "loss"])
    res["grad_dumped_not_param_names"] = [k for k in g.files if k != "loss" and k not in pnames][:30]
    res["grad_shape_mismatch"] = shape_mm
    skip = lambda k: "key.bias" in k or "k_proj.bias" in k
    ranked = {k: v for k, v in per.items() if not skip(k)}
    if ranked:
        w = max(ranked, key=ranked.get)
        res["grad_worst"] = [w, ranked[w]]
    res["grad_over_1e-3"] = {k: v for k, v in sorted(ranked.items(), key=lambda kv: -kv[1]) if v > 1e-3}

    # after-step logits
    if inf0["rc"] == 0 and inf1.get("rc") == 0:
        mb = np.load(os.path.join(OUT, base + ".before.out.npz"))["logits"]
        ma = np.load(os.path.join(OUT, base + ".after.out.npz"))["logits"]
        res["memc_before_vs_torch"] = float(np.abs(mb - logits_t).max() / max(float(np.abs(logits_t).max()), 1e-12))
        res["after_change_rel"], res["torch_change_max"] = rel_change(ma, mb, after_logits_t, logits_t)
        res["after_change_rel_vs_torch_before"], _ = rel_change(ma, logits_t, after_logits_t, logits_t)
        if res.get("unfused_ref"):
            res["unfused_ref"]["after_change_rel"], _ = rel_change(ma, mb, unf[1], unf[0])
    # after-step initializers by parameter name
    if ex["rc"] == 0:
        ma_m = onnx.load(os.path.join(OUT, after))
        a_inits = {i.name: numpy_helper.to_array(i) for i in ma_m.graph.initializer}
        perp = {}
        # a parameter torch barely moves (a key bias) is measured against 1e-4 of the largest move
        floor = 1e-4 * max(float(np.abs(p_after[k].astype(np.float64) - p_before[k]).max()) for k in p_after)
        for k, v in a_inits.items():
            if k in p_after and v.shape == p_after[k].shape:
                d_t = p_after[k].astype(np.float64) - p_before[k]
                d_m = v.astype(np.float64) - p_before[k]
                perp[k] = float(np.abs(d_m - d_t).max()) / max(float(np.abs(d_t).max()), floor, 1e-30)
        res["param_after_n"] = len(perp)
        res["param_after_over_1e-3"] = dict(sorted(((k, v) for k, v in perp.items() if v > 1e-3), key=lambda kv: -kv[1])[:15])
        # initializers memc changed that carry no parameter name
        changed_other = []
        for k, v in a_inits.items():
            if k not in pnames and k in inits and v.dtype.kind == "f" and v.shape == inits[k].shape \
                    and not np.array_equal(v, inits[k]):
                changed_other.append(k)
        res["changed_non_param_initializers"] = changed_other[:30]
        # a parameter name the after-step file lacks
        res["after_missing_param_names"] = sorted(pnames - set(a_inits))[:30]
        # each parameter the after-step file lacks by name: zero at init?, its share of the largest
        # grad, and whether a node's FX metadata still names it (the exporter dropped / folded it)
        fx = " ".join(p.value for n in m.graph.node for p in n.metadata_props if p.key == "pkg.torch.onnx.fx_node")
        diag = []
        for k in sorted(pnames - set(a_inits)):
            gm = float(np.abs(grads_t[k]).max()) if k in grads_t else 0.0
            ph = "%p_" + k.replace(".", "_")
            diag.append([k, bool(not np.any(p_before[k])), round(gm / max(gmax, 1e-30), 4),
                         bool(re.search(re.escape(ph) + r"[,)\]]", fx))])
        res["missing_params_diag"] = diag[:40]
    res["status"] = "ok"
    return res


def is_finding(r):
    if r.get("status") != "ok":
        return r.get("status") != "export_failed"
    if r.get("after_change_rel") is None or r["after_change_rel"] > 1e-3:
        return True
    if r.get("loss_rel", 1) > 1e-4:
        return True
    if r.get("grad_worst") and r["grad_worst"][1] > 1e-3:
        return True
    if r.get("grad_shape_mismatch"):
        return True
    return False


def table(path):
    rows = [json.loads(l) for l in open(path)]
    last = {}
    for r in rows:
        last[(r["model"], r["exporter"])] = r
    print("| model | exp | compile rc | loss rel | worst named grad (err) | n grads | after-step change err | tie warnings | verdict |")
    print("|---|---|---|---|---|---|---|---|---|")
    counts = {}
    for (m, ex), r in last.items():
        f = "export failed" if r.get("status") == "export_failed" else ("FINDING" if is_finding(r) else "pass")
        counts.setdefault(ex, {}).setdefault(f, 0)
        counts[ex][f] += 1
        gw = r.get("grad_worst")
        ac = r.get("after_change_rel")
        print(f"| {m} | {ex} | {r.get('compile', {}).get('rc', '-')} | "
              f"{r['loss_rel']:.1e} | " if "loss_rel" in r else f"| {m} | {ex} | {r.get('compile', {}).get('rc', '-')} | - | ", end="")
        print(f"{(gw[0] + f' ({gw[1]:.1e})') if gw else '-'} | {r.get('grad_n_compared', '-')} | "
              f"{(f'{ac:.1e}') if ac is not None else '-'} | {len(r.get('tie_warnings', []))} | {f}"
              f"{(' ' + r.get('status')) if r.get('status') not in ('ok', None) else ''} |")
    print()
    for ex, c in counts.items():
        print(ex, c)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--groups", nargs="*", default=["hf", "lm", "timm"])  # also: r3, r4, r5 (rounds 3, 4 and 5)
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--skip", nargs="*", default=[])
    ap.add_argument("--exporters", nargs="*", default=["dynamo", "ts"])
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--timeout", type=int, default=180)
    ap.add_argument("--one", nargs=2)
    ap.add_argument("--table", action="store_true")
    a = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    results = os.path.join(OUT, "results.jsonl")
    if a.table:
        table(results)
        return
    if a.one:
        name, exp = a.one
        try:
            res = run_one(name, exp, a.lr)
        except Exception as e:
            res = {"model": name, "exporter": exp, "status": "script_error",
                   "error": f"{type(e).__name__}: {str(e)[:500]}", "trace": traceback.format_exc()[-2500:]}
        print("RESULT " + json.dumps(res, default=str), flush=True)
        return
    _, _, jobs = load_lists()
    names = [n for n, j in jobs.items() if j["group"] in a.groups and (not a.only or n in a.only) and n not in a.skip]
    for n in names:
        for exp in a.exporters:
            t0 = time.time()
            cmd = [sys.executable, os.path.abspath(__file__), "--one", n, exp, "--lr", repr(a.lr)]
            try:
                p = subprocess.run(cmd, capture_output=True, text=True, timeout=a.timeout)
                line = [l for l in p.stdout.splitlines() if l.startswith("RESULT ")]
                res = json.loads(line[-1][7:]) if line else {
                    "model": n, "exporter": exp, "status": "script_error", "error": (p.stderr or "")[-1500:]}
            except subprocess.TimeoutExpired:
                res = {"model": n, "exporter": exp, "status": "timeout", "error": f"over {a.timeout} s"}
            res["seconds"] = round(time.time() - t0, 1)
            res["finding"] = is_finding(res)
            with open(results, "a") as f:
                f.write(json.dumps(res, default=str) + "\n")
            gw = res.get("grad_worst")
            print(f"{n:20s} {exp:6s} {res.get('status'):14s} comp={res.get('compile', {}).get('rc')} "
                  f"loss={res.get('loss_rel', float('nan')):.1e} grad={gw[0] + f' {gw[1]:.1e}' if gw else '-'} "
                  f"n={res.get('grad_n_compared')} after={res.get('after_change_rel')} "
                  f"ties={len(res.get('tie_warnings', []))} {'FINDING' if res['finding'] else ''} "
                  f"{res['seconds']:.0f}s {res.get('error', '')[:200] if res.get('status') != 'ok' else ''}", flush=True)


if __name__ == "__main__":
    main()
