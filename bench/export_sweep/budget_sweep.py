#!/usr/bin/env python3
"""Budget-search sweep over the exports in $SWEEP_OUT (made by models_lm.py or export_all.py).

    SWEEP_OUT=/tmp/bsweep_lm MEMC=$PWD/build/memc build/python-test-venv/bin/python \
        bench/export_sweep/budget_sweep.py [--only NAME ...] [--shard I/N] [--fractions 0.6 0.35 0.15 0.08] [--fp32-pin 0.35 0.15]
    SWEEP_OUT=/tmp/bsweep_lm build/python-test-venv/bin/python bench/export_sweep/budget_sweep.py --torch-bf16
    SWEEP_OUT=/tmp/bsweep_lm build/python-test-venv/bin/python bench/export_sweep/budget_sweep.py --table

Does memc's main job hold on today's exports: pick a plan under --budget, train it correctly, and
measure the peak it planned? For every export:
  - the shape: --batch 8 --seq 64 where the export's batch and seq are dynamic (--batch 8 --seq 16
    where only the batch is, run_sweep.py's 4 x 16 where neither is); the batch is built as
    export_all.py / models_lm.py build theirs (text_batch + token_labels, rows of different lengths,
    so micro-batches hold different numbers of labelled positions), and PyTorch's loss and gradients
    are recomputed on it from the same seeds (the export's own 4 x 16 loss is checked first, so
    the rebuilt model is the exported one);
  - `compile` without a budget (--json: the planned peak P) and `run` (the baseline, fraction 1.0);
  - `compile --budget f*P` for each fraction (the search), and with --precision fp32 pinned at some
    (fp32 micro-batches, remat and offload must stay exact); each plan is run for
    2 steps with --dump-grads and --json: measured peak == planned peak, first-step loss and every
    gradient against PyTorch (run_sweep.py's measure; tolerance 1e-4 loss / 1e-3 grads in fp32,
    the documented 1e-3 / 2e-2 under bf16/fp16-mixed; --torch-bf16 then adds PyTorch autocast-bf16's own
    error on the same batch, since bf16 rounding alone exceeds 2e-2 on these tiny random models);
  - exit 3 must be one line naming the smallest reachable peak (above the budget) or a reason.
Writes <base>.budget.json per export and, with --table, budget_results.json and a table.
"""
import argparse
import glob
import json
import os
import re
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import run_sweep as R  # noqa: E402  (sh, rel, bad_contract, MEMC, OUT)
import models_lm as ML  # noqa: E402  (patches export_all: the LM heads, token labels)
import export_all as E  # noqa: E402

import torch  # noqa: E402

OUT = R.OUT
MEMC = R.MEMC
TIMEOUT = 300
TOL = {"fp32": (1e-4, 1e-3), "bf16-mixed": (1e-3, 2e-2), "fp16-mixed": (1e-3, 2e-2)}
LENS = {64: (64, 52, 44, 60, 64, 49, 37, 57), 48: (48, 39, 33, 45, 48, 37, 28, 43), 16: (16, 13, 11, 15, 16, 12, 9, 14)}


def sh(cmd):
    return R.sh(cmd, timeout=TIMEOUT)


# ----------------------------------------------------------------------------- the PyTorch reference
def model_index():
    names = list(ML._lm_models())
    ML.text_models()  # fills LABEL_KIND
    return {n: i for i, n in enumerate(names)}


def rebuild(name, seed):
    """The model do_one exported: same seeds, make_unique_, dropout p = 0, eval()."""
    ctor = ML.text_models()[name]
    E.seed_all(seed)
    inner = ctor()
    E.make_unique_(inner, seed + 1000)
    inner.eval()
    model = E.TextLogits(inner)
    model.eval()
    return inner, model


def torch_loss_grads(model, feeds, y):
    model.zero_grad(set_to_none=True)
    logits = model(torch.from_numpy(feeds["input_ids"]), torch.from_numpy(feeds["attention_mask"]))
    loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).reshape(-1),
                                             ignore_index=ML.IGNORE)
    loss.backward()
    grads = {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
             for n, p in model.named_parameters()}
    return float(loss), grads


def make_reference(meta, b, t, seed):
    """Writes <base>.b{b}t{t}.data.npz and .ref.npz (grad/<initializer> as export_all.do_one maps them,
    param_grad/<parameter> for every parameter). Returns (data file, ref file, info)."""
    import onnx
    name, base = meta["model"], f"{meta['model']}_{meta['exporter']}"
    inner, model = rebuild(name, seed)
    info = {}
    # the export's own batch first: the rebuilt model must be the exported one
    d0 = np.load(os.path.join(OUT, base + ".data.npz"))
    l0, _ = torch_loss_grads(model, {k: d0[k] for k in ("input_ids", "attention_mask")}, d0["y"])
    info["rebuild_loss_rel"] = abs(l0 - meta["torch_loss"]) / abs(meta["torch_loss"])
    pad = inner.config.pad_token_id
    feeds, _ = ML._orig_text_batch(pad, seed + 300, b=b, t=t, lens=LENS[t][:b])
    y = ML.token_labels(feeds["input_ids"], feeds["attention_mask"], ML.LABEL_KIND[name], seed + 300)
    info["labelled_positions_per_row"] = [int(v) for v in (y != ML.IGNORE).sum(1)]
    loss, grads = torch_loss_grads(model, feeds, y)
    m = onnx.load(os.path.join(OUT, base + ".onnx"))
    mapping, _, _ = E.match(m, model)
    ref = {"loss": np.array(loss, np.float32), "labels": y}
    for init, g in E.initializer_grads(m, mapping, grads).items():
        ref["grad/" + init] = g.astype(np.float32)
    for p, g in grads.items():
        ref["param_grad/" + p] = g.numpy().astype(np.float32)
    info["n_mapped"] = len(mapping)
    info["map"] = {k: [f"{p}{'^T' if tr == 'T' else ('(reshaped)' if tr == 'R' else '')}" for p, tr in h]
                   for k, h in mapping.items()}
    tag = f"b{b}t{t}"
    dfile, rfile = f"{base}.{tag}.data.npz", f"{base}.{tag}.ref.npz"
    np.savez(os.path.join(OUT, dfile), y=y, **feeds)
    np.savez(os.path.join(OUT, rfile), **ref)
    return dfile, rfile, info, loss


# ----------------------------------------------------------------------------- comparing a run
def compare(gfile, rfile, compile_warnings, mp):
    """run_sweep.py's measure: |memc - torch|max / max(|torch|max, 1e-4 * the largest |torch|max).
    Missing grads that are the tied/shared copy of a tensor memc trains (models_lm --table's rule) are
    'merged', not failures; tensors memc trains that ref lacks (folded from one parameter, named by
    memc's compile warning) are compared against that parameter's gradient."""
    g = np.load(os.path.join(OUT, gfile))
    ref = np.load(os.path.join(OUT, rfile))
    out = {}
    per, shape_mm, missing = R.grad_pairs(g, ref)
    strip = lambda p: p[:-2] if p.endswith("^T") else p.replace("(reshaped)", "")
    dumped = set(mp) - set(missing)
    merged = [x for x in missing if mp.get(x) and all(any(strip(p) in map(strip, mp[k]) for k in dumped) for p in mp[x])]
    src = {}
    for w in compile_warnings:
        mm = re.search(r"initializer '([^']+)' \[[^]]*\] is a value the exporter folded from parameter '([^']+)' alone", w)
        if mm:
            src[mm.group(1)] = mm.group(2)
    extra, unknown = [x for x in g.files if "grad/" + x not in ref.files and x != "loss"], []
    for x in extra:
        k = "param_grad/" + src.get(x, "?")
        if k in ref.files and ref[k].size == g[x].size:
            per["folded:" + x] = (g[x], ref[k].reshape(g[x].shape))
        else:
            unknown.append(x)
    if per:
        gmax = max(float(np.abs(r).max()) for _, r in per.values())
        errs = {k: float(np.abs(a - r).max() / max(float(np.abs(r).max()), 1e-4 * gmax)) for k, (a, r) in per.items()}
        w = max(errs, key=errs.get)
        out["grad_worst"] = [w, errs[w]]
        out["grad_n_compared"] = len(errs)
        out["grad_errs_top"] = dict(sorted(errs.items(), key=lambda kv: -kv[1])[:5])
    out["grad_missing"] = [x for x in missing if x not in merged]
    out["grad_merged"] = merged
    out["grad_shape_mismatch"] = shape_mm
    out["grad_extra_unknown"] = unknown
    return out


# ----------------------------------------------------------------------------- one export
def run_case(res_case, plan, dfile, rfile, tl, mp, compile_json, compile_warnings):
    base = plan[:-5]
    gfile, jfile = base + ".grads.npz", base + ".run.json"
    r = sh([MEMC, "run", plan, "--data", dfile, "--epochs", "2", "--threads", "1",
            "--dump-grads", gfile, "--json", jfile, "--force", "--quiet"])
    res_case["run"] = r
    if r["rc"] != 0:
        return
    rep = json.load(open(os.path.join(OUT, jfile)))
    res_case["losses"] = rep.get("losses")
    res_case["run_status"] = rep.get("status")
    res_case["measured_peak"] = rep.get("measured_peak_bytes")
    res_case["run_predicted_peak"] = rep.get("predicted_peak_bytes")
    res_case["skipped_steps"] = rep.get("skipped_steps")
    res_case["run_decisions"] = rep.get("decisions")
    L = rep.get("losses") or [float("nan")]
    res_case["loss_rel"] = abs(L[0] - tl) / abs(tl)
    res_case.update(compare(gfile, rfile, compile_warnings, mp))


def verdict(c, budget):
    """PASS / REFUSED / FAIL with the reasons."""
    why = []
    comp = c["compile"]
    flags = R.bad_contract(comp)
    if comp["rc"] == 3:
        msg = c.get("refusal", "")
        m = re.search(r"smallest peak[^:]*: [0-9.]+ [KMGT]?i?B \((\d+) bytes\)", msg)
        if flags:
            why += flags
        if m:
            c["refusal_floor"] = int(m.group(1))
            if budget is not None and c["refusal_floor"] <= budget:
                why.append(f"refused, yet its floor {c['refusal_floor']} <= budget {budget}")
        elif "budget" not in msg:
            why.append("exit 3 names no peak or reason")
        return ("FAIL" if why else "REFUSED"), why
    if comp["rc"] != 0:
        return "FAIL", [f"compile rc {comp['rc']}: {(comp['stderr_errors'] or ['(no stderr line)'])[0][:300]}"] + flags
    cj = c.get("compile_json") or {}
    planned = cj.get("predicted_peak_bytes")
    if budget is not None and (planned is None or planned > budget):
        why.append(f"planned {planned} > budget {budget}")
    run = c.get("run")
    if run is None:
        return "FAIL", why + ["not run"]
    if run["rc"] != 0:
        return "FAIL", why + [f"run rc {run['rc']}: {(run['stderr_errors'] or ['(no stderr line)'])[0][:300]}"] + R.bad_contract(run)
    if c.get("measured_peak") != planned:
        why.append(f"measured {c.get('measured_peak')} != planned {planned}")
    if c.get("run_predicted_peak") != planned:
        why.append(f"run's predicted {c.get('run_predicted_peak')} != compile's {planned}")
    prec = (cj.get("decisions") or {}).get("precision", "fp32")
    lt, gt = TOL.get(prec, (1e-4, 1e-3))
    if not (c.get("loss_rel", 1) <= lt):
        why.append(f"loss rel {c.get('loss_rel')} > {lt} ({prec})")
    gw = c.get("grad_worst")
    if gw is None or not (gw[1] <= gt):
        why.append(f"grad worst {gw} > {gt} ({prec})")
    for k in ("grad_missing", "grad_shape_mismatch", "grad_extra_unknown"):
        if c.get(k):
            why.append(f"{k} {list(c[k])[:3]}")
    if c.get("skipped_steps"):
        why.append(f"skipped_steps {c['skipped_steps']}")
    return ("FAIL" if why else "PASS"), why


def compile_case(onnx_f, shape, freeze, plan, extra):
    cmd = [MEMC, "compile", onnx_f] + shape + ["-o", plan, "--force", "--threads", "1", "--json"] + extra
    if freeze:
        cmd += ["--freeze", ",".join(freeze)]
    c = {"compile": sh(cmd)}
    # R.sh keeps stdout's last 1500 characters of the --json summary: read the plan's facts with inspect --json
    if c["compile"]["rc"] == 0:
        import subprocess
        try:
            p = subprocess.run([MEMC, "inspect", plan, "--json"], cwd=OUT, capture_output=True, text=True, timeout=TIMEOUT)
            c["inspect_plan_rc"] = p.returncode
            c["compile_json"] = json.loads(p.stdout)
            c["compile_json"].pop("trainable_params", None)
        except Exception as e:
            c["compile_json_error"] = f"{type(e).__name__}: {e}"
    elif c["compile"]["rc"] == 3:
        c["refusal"] = (c["compile"]["stderr_errors"] or [""])[0]
    return c


def dec_str(d):
    if not d:
        return ""
    return (f"{d.get('precision')}, mb {d.get('micro_batches')}, remat {d.get('remat')}, "
            f"lc {d.get('loss_chunks')}, off {d.get('offload')}, att {d.get('attention')}")


def one(meta, seed, fractions, fp32_pin):
    """fp32_pin: the fractions also compiled with --precision fp32 pinned."""
    base = f"{meta['model']}_{meta['exporter']}"
    onnx_f = base + ".onnx"
    res = {"model": meta["model"], "exporter": meta["exporter"], "dynamic": meta.get("dynamic"),
           "label_kind": meta.get("label_kind"), "cases": []}
    dyn = meta.get("dynamic")
    # 8 x 64 where PyTorch takes it (RoBERTa's positions start at pad + 1: at most 62 tokens), else 8 x 48
    shapes = {"batch+seq": [(8, 64), (8, 48), (4, 16)], "batch": [(8, 16), (4, 16)]}.get(dyn, [(4, 16)])
    ref = None
    for b, t in shapes:
        shape = ["--batch", str(b), "--seq", str(t)]
        ins = sh([MEMC, "inspect", onnx_f] + shape + ["--json"])
        trainable = []
        if ins["rc"] == 0:
            import subprocess
            trainable = json.loads(subprocess.run([MEMC, "inspect", onnx_f] + shape + ["--json"], cwd=OUT,
                                                  capture_output=True, text=True).stdout)["trainable_params"]
        freeze = [n for n in trainable if n in set(meta.get("buffer_initializers", []))]
        c = compile_case(onnx_f, shape, freeze, f"{base}.b{b}t{t}.f100.plan", [])
        tr = {"shape": [b, t], "inspect_rc": ins["rc"], "compile_rc": c["compile"]["rc"],
              "error": (c["compile"]["stderr_errors"] or [None])[0]}
        res.setdefault("shape_tries", []).append(tr)
        if c["compile"]["rc"] != 0:
            continue
        try:
            ref = make_reference(meta, b, t, seed)
            break
        except Exception as e:
            tr["torch_error"] = f"{type(e).__name__}: {str(e)[:300]}"
    res["shape"] = [b, t]
    res["freeze"] = freeze
    c["fraction"], c["budget"], c["pin"] = 1.0, None, ""
    res["cases"].append(c)
    if c["compile"]["rc"] != 0 or ref is None:
        c["verdict"], c["why"] = verdict(c, None) if c["compile"]["rc"] != 0 else ("FAIL", ["no PyTorch reference: " + str(tr)])
        return res
    P = c["compile_json"]["predicted_peak_bytes"]
    res["P"] = P
    dfile, rfile, info, tl = ref
    res["ref_info"] = {k: v for k, v in info.items() if k != "map"}
    res["torch_loss"] = tl
    mp = info["map"]
    run_case(c, f"{base}.b{b}t{t}.f100.plan", dfile, rfile, tl, mp, c["compile_json"], c["compile"]["warnings"])
    c["verdict"], c["why"] = verdict(c, None)
    todo = [(f, []) for f in fractions]
    todo += [(f, ["--precision", "fp32"]) for f in fp32_pin]
    for f, pin in todo:
        budget = int(f * P)
        tag = f"f{int(round(f * 100)):03d}" + ("_fp32" if pin else "")
        plan = f"{base}.b{b}t{t}.{tag}.plan"
        c = compile_case(onnx_f, res_shape(b, t), freeze, plan, ["--budget", str(budget)] + pin)
        c["fraction"], c["budget"], c["pin"] = f, budget, " ".join(pin)
        if c["compile"]["rc"] == 0 and "compile_json" in c:
            run_case(c, plan, dfile, rfile, tl, mp, c["compile_json"], c["compile"]["warnings"])
        c["verdict"], c["why"] = verdict(c, budget)
        res["cases"].append(c)
    return res


def res_shape(b, t):
    return ["--batch", str(b), "--seq", str(t)]


# ----------------------------------------------------------------------------- bf16: PyTorch's own error
def torch_bf16(res):
    """PyTorch's autocast-bf16 step on the same model and batch, measured against the fp32 reference as memc's
    grads are: the error bf16 itself makes here. Adds res["torch_bf16"] and, per bf16-mixed case,
    "bf16_ratio" (memc's worst error over PyTorch's worst) and "bf16_tensor_ratio" (the largest per-tensor ratio)."""
    import onnx
    b, t = res["shape"]
    base = f"{res['model']}_{res['exporter']}"
    seed = 10 + model_index()[res["model"]]
    inner, model = rebuild(res["model"], seed)
    d = np.load(os.path.join(OUT, f"{base}.b{b}t{t}.data.npz"))
    ref = np.load(os.path.join(OUT, f"{base}.b{b}t{t}.ref.npz"))
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(torch.from_numpy(d["input_ids"]), torch.from_numpy(d["attention_mask"]))
    loss = torch.nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]),
                                             torch.from_numpy(d["y"]).reshape(-1), ignore_index=ML.IGNORE)
    loss.backward()
    grads = {n: (p.grad.detach().float().clone() if p.grad is not None else torch.zeros_like(p)) for n, p in model.named_parameters()}
    m = onnx.load(os.path.join(OUT, base + ".onnx"))
    E.seed_all(0)
    _, model32 = rebuild(res["model"], seed)  # the fp32 weights for the value-based map
    mapping, _, _ = E.match(m, model32)
    mine = E.initializer_grads(m, mapping, grads)
    keys = [k[5:] for k in ref.files if k.startswith("grad/") and k[5:] in mine]
    gmax = max(float(np.abs(ref["grad/" + k]).max()) for k in keys)
    errs = {k: float(np.abs(mine[k] - ref["grad/" + k]).max() / max(float(np.abs(ref["grad/" + k]).max()), 1e-4 * gmax))
            for k in keys}
    w = max(errs, key=errs.get)
    tl = float(ref["loss"])
    res["torch_bf16"] = {"loss": float(loss), "loss_rel": abs(float(loss) - tl) / abs(tl), "grad_worst": [w, errs[w]],
                         "finite": bool(np.isfinite(float(loss)))}
    for c in res["cases"]:
        prec = ((c.get("compile_json") or {}).get("decisions") or {}).get("precision")
        if prec != "bf16-mixed" or not c.get("grad_worst"):
            continue
        c["bf16_ratio"] = c["grad_worst"][1] / max(errs[w], 1e-12)
        # per tensor: memc's error over PyTorch's on the same tensor (its top tensors only are stored)
        gfile = c["run"]["cmd"].split("--dump-grads ")[1].split()[0]
        g = np.load(os.path.join(OUT, gfile))
        per = {}
        for k in keys:
            if k in g.files and g[k].shape == ref["grad/" + k].shape:
                e = float(np.abs(g[k] - ref["grad/" + k]).max() / max(float(np.abs(ref["grad/" + k]).max()), 1e-4 * gmax))
                per[k] = (e, errs[k], e / max(errs[k], 1e-12))
        wk = max(per, key=lambda k: per[k][2])
        c["bf16_tensor_ratio"] = [wk] + list(per[wk])
    return res


# ----------------------------------------------------------------------------- table
def table():
    allres = []
    for f in sorted(glob.glob(os.path.join(OUT, "*.budget.json"))):
        r = json.load(open(f))
        allres.append(r)
    hdr = (f"{'model':17s} {'exporter':12s} {'shape':6s} {'frac':9s} {'decisions':58s} {'budget':>9s} {'planned':>9s} "
           f"{'measured':>9s} {'loss err':>8s} {'grad err':>8s} {'/torchbf16':>10s} verdict")
    print(hdr)
    print("-" * len(hdr))
    counts = {}
    for r in allres:
        if r.get("export_failed"):
            print(f"{r['model']:17s} {r['exporter']:12s} export failed: {str(r['export_failed'])[:100]}")
            continue
        for c in r["cases"]:
            cj = c.get("compile_json") or {}
            fr = f"{c['fraction']:.2f}" + ("/fp32" if c.get("pin") else "")
            v = c.get("verdict")
            # bf16-mixed over the documented 2e-2 only: within PyTorch autocast-bf16's own error on this batch?
            if (v == "FAIL" and c.get("why") and all(w.startswith("grad worst") and "(bf16-mixed)" in w for w in c["why"])
                    and c.get("bf16_ratio") is not None and c["bf16_ratio"] <= 1.5 and c["bf16_tensor_ratio"][3] <= 3.0):
                v = "PASS~bf16"
                c["verdict_vs_torch_bf16"] = v
            key = ("baseline " if c["fraction"] == 1.0 else "budget ") + v
            counts[key] = counts.get(key, 0) + 1
            le = c.get("loss_rel")
            gw = c.get("grad_worst")
            br = f"{c['bf16_ratio']:.2f}x" if c.get("bf16_ratio") else "-"
            dec = dec_str(cj.get("decisions")) if c["compile"]["rc"] == 0 else (c.get("refusal") or "")[:58]
            print(f"{r['model']:17s} {r['exporter']:12s} {'x'.join(map(str, r.get('shape', []))):6s} {fr:9s} {dec[:58]:58s} "
                  f"{str(c.get('budget') or '-'):>9s} {str(cj.get('predicted_peak_bytes', '-')):>9s} "
                  f"{str(c.get('measured_peak', '-')):>9s} {(f'{le:.1e}' if le is not None else '-'):>8s} "
                  f"{(f'{gw[1]:.1e}' if gw else '-'):>8s} {br:>10s} {v}{(': ' + '; '.join(c['why'])) if c.get('why') else ''}")
    print()
    print("counts:", json.dumps(counts, sort_keys=True))
    json.dump(allres, open(os.path.join(OUT, "budget_results.json"), "w"), indent=1, default=str)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--shard", default="0/1")
    ap.add_argument("--fractions", nargs="*", type=float, default=[0.6, 0.35, 0.15, 0.08])
    ap.add_argument("--fp32-pin", nargs="*", type=float, default=[0.35, 0.15],
                    help="fractions also compiled with --precision fp32 pinned (fp32 micro-batches/remat/offload stay exact)")
    ap.add_argument("--table", action="store_true")
    ap.add_argument("--torch-bf16", action="store_true", help="add PyTorch autocast-bf16's own error to each <base>.budget.json")
    a = ap.parse_args()
    if a.table:
        table()
        return
    if a.torch_bf16:
        for f in sorted(glob.glob(os.path.join(OUT, "*.budget.json"))):
            res = json.load(open(f))
            if a.only and res["model"] not in a.only:
                continue
            if res.get("P") is None:
                continue
            try:
                torch_bf16(res)
            except Exception as e:
                res["torch_bf16"] = {"error": f"{type(e).__name__}: {e}"}
            json.dump(res, open(f, "w"), indent=1, default=str)
            tb = res["torch_bf16"]
            print(f"{res['model']:17s} {res['exporter']:12s} torch-bf16 {tb.get('grad_worst')} loss {tb.get('loss_rel')} "
                  + " ".join(f"{c['fraction']}:{c.get('bf16_ratio', 0):.2f}x {c.get('bf16_tensor_ratio')}" for c in res['cases']
                             if 'bf16_ratio' in c), flush=True)
        return
    idx = model_index()
    si, sn = map(int, a.shard.split("/"))
    metas = sorted(glob.glob(os.path.join(OUT, "*.meta.json")))
    for k, mf in enumerate(metas):
        if k % sn != si:
            continue
        meta = json.load(open(mf))
        base = f"{meta['model']}_{meta['exporter']}"
        if a.only and meta["model"] not in a.only and base not in a.only:
            continue
        t0 = time.time()
        if meta.get("status") != "exported":
            res = {"model": meta["model"], "exporter": meta["exporter"],
                   "export_failed": meta.get("export_errors") or meta.get("error"), "cases": []}
        else:
            try:
                res = one(meta, 10 + idx[meta["model"]], a.fractions, a.fp32_pin)
            except Exception as e:
                import traceback
                res = {"model": meta["model"], "exporter": meta["exporter"], "cases": [],
                       "script_error": f"{type(e).__name__}: {e}", "trace": traceback.format_exc()[-2000:]}
        res["seconds"] = round(time.time() - t0, 1)
        json.dump(res, open(os.path.join(OUT, base + ".budget.json"), "w"), indent=1, default=str)
        line = [f"{base:28s} {res.get('shape')} P={res.get('P')} {res['seconds']}s"]
        if res.get("script_error"):
            line.append("SCRIPT ERROR " + res["script_error"][:200])
        for c in res["cases"]:
            cj = c.get("compile_json") or {}
            line.append(f"  f={c['fraction']}{'/' + c['pin'] if c.get('pin') else ''} rc={c['compile']['rc']} "
                        f"[{dec_str(cj.get('decisions'))}] planned={cj.get('predicted_peak_bytes')} "
                        f"measured={c.get('measured_peak')} loss={c.get('loss_rel')} grad={c.get('grad_worst')} "
                        f"{c['verdict']} {c.get('why') or ''} {c.get('refusal') or ''}")
        print("\n".join(line), flush=True)


if __name__ == "__main__":
    main()
