#!/usr/bin/env python3
"""Runs $MEMC (default build/memc) over every export in $SWEEP_OUT (made by export_all.py):
inspect, compile (batch 4, seq 16), infer (logits vs PyTorch), run 5 steps with --dump-grads
(first-step loss and gradients vs PyTorch). Writes out/<name>.memc.json and results.json.
$MEMC_COMPILE_FLAGS (split on spaces) is added to the training compile, e.g. "--loss-chunks 3"."""
import glob
import json
import os
import shlex
import subprocess
import sys
import time

import numpy as np

MEMC = os.environ.get("MEMC", os.path.abspath("build/memc"))
OUT = os.environ.get("SWEEP_OUT", os.path.abspath("export_sweep_out"))
TIMEOUT = 240


def sh(cmd, timeout=TIMEOUT):
    t0 = time.time()
    try:
        p = subprocess.run(cmd, cwd=OUT, capture_output=True, text=True, timeout=timeout)
        rc, so, se = p.returncode, p.stdout, p.stderr
    except subprocess.TimeoutExpired as e:
        rc, so, se = "TIMEOUT", (e.stdout or b"").decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or ""), \
            (e.stderr or b"").decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")
    err_lines = [l for l in se.splitlines() if l.strip() and not l.startswith("memc: warning:")]
    return {"cmd": "cd " + OUT + " && " + " ".join(shlex.quote(c) for c in cmd), "rc": rc,
            "seconds": round(time.time() - t0, 1), "stdout_tail": so[-1500:], "stderr_errors": err_lines[:20],
            "n_error_lines": len(err_lines),
            "warnings": [l for l in se.splitlines() if l.startswith("memc: warning:")][:50]}


def grad_pairs(g, ref):
    """memc's dumped gradients `g` beside the reference's "grad/<initializer>" arrays: the pairs
    {name: (memc, reference)}, the shape mismatches {name: "shape … vs …"}, and the names memc did
    not dump."""
    pairs, shape_mm, missing = {}, {}, []
    for k in ref.files:
        if not k.startswith("grad/"):
            continue
        n = k[5:]
        if n not in g.files:
            missing.append(n)
        elif g[n].shape != ref[k].shape:
            shape_mm[n] = f"shape {g[n].shape} vs {ref[k].shape}"
        else:
            pairs[n] = (g[n], ref[k])
    return pairs, shape_mm, missing


def bad_contract(r):
    rc = r["rc"]
    flags = []
    if rc == "TIMEOUT":
        flags.append("hang/timeout")
    elif isinstance(rc, int) and (rc < 0 or rc not in (0, 1, 2, 3)):
        flags.append(f"crash rc={rc}")
    if rc not in (0, "TIMEOUT") and r["n_error_lines"] != 1:
        flags.append(f"{r['n_error_lines']} stderr error lines")
    return flags


def rel(a, b):
    return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-12))


def one(meta):
    base = f"{meta['model']}_{meta['exporter']}"
    res = {"model": meta["model"], "exporter": meta["exporter"], "dynamic": meta.get("dynamic")}
    onnx_f = base + ".onnx"
    shape = ["--batch", "4"] + (["--seq", "16"] if meta["kind"] == "text" else [])
    res["inspect_plain"] = sh([MEMC, "inspect", onnx_f])
    ins = sh([MEMC, "inspect", onnx_f] + shape + ["--json"])
    res["inspect"] = ins
    trainable = []
    if ins["rc"] == 0:
        try:
            trainable = json.loads(subprocess.run([MEMC, "inspect", onnx_f] + shape + ["--json"], cwd=OUT,
                                                  capture_output=True, text=True).stdout)["trainable_params"]
        except Exception as e:
            res["inspect_json_error"] = str(e)
    mapped = set(meta.get("map", {}))
    buffers = set(meta.get("buffer_initializers", []))
    freeze = [n for n in trainable if n in buffers]
    res["memc_trains_buffers"] = freeze
    res["memc_trains_unmapped_nonbuffer"] = [n for n in trainable if n not in mapped and n not in buffers]
    res["mapped_not_trained_by_memc"] = sorted(mapped - set(trainable)) if trainable else None
    plan = base + ".plan"
    cmd = [MEMC, "compile", onnx_f] + shape + ["-o", plan, "--force", "--threads", "1"] + os.environ.get("MEMC_COMPILE_FLAGS", "").split()
    if freeze:
        cmd += ["--freeze", ",".join(freeze)]
    res["compile"] = sh(cmd)
    res["infer"] = sh([MEMC, "infer", onnx_f, "--input", base + ".data.npz", "-o", base + ".infer.npz",
                       "--batch", "4", "--force"])
    ref = np.load(os.path.join(OUT, base + ".ref.npz"))
    if res["infer"]["rc"] == 0:
        o = np.load(os.path.join(OUT, base + ".infer.npz"))
        res["logits_rel"] = rel(o["logits"], ref["logits"]) if "logits" in o else f"keys {list(o.keys())}"
    shape2 = ["--batch", "3"] + (["--seq", "12"] if meta["kind"] == "text" else [])
    res["infer2"] = sh([MEMC, "infer", onnx_f, "--input", base + ".data2.npz", "-o", base + ".infer2.npz", "--force"] + shape2)
    if res["infer2"]["rc"] == 0:
        o = np.load(os.path.join(OUT, base + ".infer2.npz"))
        res["logits2_rel"] = rel(o["logits"], ref["logits2"]) if "logits" in o else f"keys {list(o.keys())}"
    res["compile2"] = sh([MEMC, "compile", onnx_f] + shape2 + ["-o", base + ".b3.plan", "--force", "--threads", "1"]
                         + (["--freeze", ",".join(freeze)] if freeze else []))
    if res["compile"]["rc"] == 0:
        gfile = base + ".grads.npz"
        jfile = base + ".run.json"
        res["run"] = sh([MEMC, "run", plan, "--data", base + ".data.npz", "--epochs", "5", "--threads", "1",
                         "--dump-grads", gfile, "--json", jfile, "--force", "--quiet"])
        if res["run"]["rc"] == 0:
            rep = json.load(open(os.path.join(OUT, jfile)))
            res["losses"] = rep.get("losses")
            res["run_status"] = rep.get("status")
            g = np.load(os.path.join(OUT, gfile))
            pairs, shape_mm, missing = grad_pairs(g, ref)
            per = {n: rel(a, r) for n, (a, r) in pairs.items()}
            per.update(shape_mm)
            nums = {k: v for k, v in per.items() if isinstance(v, float)}
            res["grad_missing"] = missing
            res["grad_extra"] = [n for n in g.files if "grad/" + n not in ref.files]
            res["grad_shape_mismatch"] = {k: v for k, v in per.items() if not isinstance(v, float)}
            if nums:
                # tensors whose reference gradient is ~0 (attention key biases: exactly 0 in exact
                # arithmetic) are measured against 1e-4 of the largest reference gradient instead
                gmax = max(float(np.abs(ref["grad/" + k]).max()) for k in nums)
                nums = {k: float(np.abs(g[k] - ref["grad/" + k]).max() / max(float(np.abs(ref["grad/" + k]).max()), 1e-4 * gmax))
                        for k in nums}
                worst = max(nums, key=nums.get)
                res["grad_worst"] = (worst, nums[worst])
                res["grad_n_compared"] = len(nums)
                res["grad_over_1e-3"] = {k: v for k, v in nums.items() if v > 1e-3}
    res["torch_loss"] = meta.get("torch_loss")
    return res


def main():
    only = sys.argv[1:]
    results = []
    for mf in sorted(glob.glob(os.path.join(OUT, "*.meta.json"))):
        meta = json.load(open(mf))
        base = f"{meta['model']}_{meta['exporter']}"
        if only and meta["model"] not in only and base not in only:
            continue
        if meta.get("status") != "exported":
            res = {"model": meta["model"], "exporter": meta["exporter"], "export_failed": meta.get("export_errors") or meta.get("error")}
        else:
            t0 = time.time()
            res = one(meta)
            res["seconds"] = round(time.time() - t0, 1)
        json.dump(res, open(os.path.join(OUT, base + ".memc.json"), "w"), indent=1, default=str)
        flags = []
        for step in ("inspect_plain", "inspect", "compile", "infer", "run", "infer2", "compile2"):
            if step in res:
                flags += [f"{step}:{f}" for f in bad_contract(res[step])]
        print(f"{base:24s} insp={res.get('inspect', {}).get('rc')} comp={res.get('compile', {}).get('rc')} "
              f"infer={res.get('infer', {}).get('rc')} run={res.get('run', {}).get('rc')} "
              f"inf2={res.get('infer2', {}).get('rc')} comp2={res.get('compile2', {}).get('rc')} logits2={res.get('logits2_rel')} "
              f"logits={res.get('logits_rel')} loss={res.get('losses', [None])[:1]} vs {res.get('torch_loss')} "
              f"grad={res.get('grad_worst')} miss={res.get('grad_missing')} flags={flags}", flush=True)
        for step in ("inspect", "compile", "infer", "run", "infer2", "compile2"):
            r = res.get(step)
            if r and r["rc"] != 0:
                print(f"   {step} rc={r['rc']}: {r['stderr_errors'][:3]}", flush=True)
        results.append(res)


if __name__ == "__main__":
    main()
