#!/usr/bin/env python3
"""Re-checks the committed models against their reference files with onnxruntime.

For documentation only (not part of the C++ build or its tests):
    /work/venv/bin/python models/check_models.py              # check everything
    /work/venv/bin/python models/check_models.py --markdown   # also print op histograms

For every models/<name>.onnx that has models/<name>.ref.npz:
  * ORT logits (Dropout nodes switched to inference) vs `logits`, batch 4, and
    vs models/<name>.ref_b3.npz when present: max|diff| / max|ref| <= 1e-5;
  * the mean cross-entropy of the ORT logits vs `loss`;
  * every `grad/<name>` key names an initializer of the same shape.
For the *_skeleton.onnx files: no initializer carries data, and the element
count over all initializers equals the torchvision parameter count.
"""
import argparse
import glob
import os
import sys

import numpy as np
import onnx

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import onnx_ref_util as U  # noqa: E402

SKELETON_PARAMS = {"vit_b_16_skeleton": 86_567_656, "vit_l_16_skeleton": 304_326_632,
                   "vit_h_14_skeleton": 632_045_800, "gpt_6b7_skeleton": 6_658_404_352}
TOL = 1e-5


def check_model(name):
    path = os.path.join(U.HERE, name + ".onnx")
    ref = np.load(os.path.join(U.HERE, name + ".ref.npz"))
    m = onnx.load(path, load_external_data=True)
    inputs = U.graph_input_names(m)
    feeds = {k: ref[k] for k in inputs}
    logits = U.ort_logits(path, feeds)
    d4 = U.rel_diff(logits, ref["logits"])
    loss = U.softmax_xent(logits, ref["labels"])
    dl = abs(loss - float(ref["loss"]))
    inits = {i.name: tuple(i.dims) for i in m.graph.initializer}
    grads = [k[5:] for k in ref.files if k.startswith("grad/")]
    bad = [g for g in grads if g not in inits or inits[g] != ref["grad/" + g].shape]
    msg = f"{name:28s} b4 rel diff {d4:.1e}  loss {loss:.6f} (|d| {dl:.1e})  {len(grads)} grads"
    ok = d4 <= TOL and dl <= 1e-5 and not bad
    b3 = os.path.join(U.HERE, name + ".ref_b3.npz")
    if os.path.exists(b3):
        r3 = np.load(b3)
        d3 = U.rel_diff(U.ort_logits(path, {k: r3[k] for k in inputs}), r3["logits"])
        msg += f"  b3 rel diff {d3:.1e}"
        ok = ok and d3 <= TOL
    if bad:
        msg += f"  BAD GRAD KEYS {bad}"
    return ok, msg


def check_skeleton(name):
    m = onnx.load(os.path.join(U.HERE, name + ".onnx"), load_external_data=False)
    n = sum(int(np.prod(i.dims)) for i in m.graph.initializer)
    has_data = [i.name for i in m.graph.initializer
                if i.raw_data or i.float_data or i.int64_data or i.int32_data or i.external_data]
    ok = n == SKELETON_PARAMS[name] and not has_data
    return ok, (f"{name:28s} {len(m.graph.initializer)} initializers, {n} elements "
                f"(expected {SKELETON_PARAMS[name]}), with data: {len(has_data)}")


def markdown(names):
    print("\n| model | opset | nodes | op histogram |\n|---|---|---|---|")
    for name in names:
        m = onnx.load(os.path.join(U.HERE, name + ".onnx"), load_external_data=False)
        ops = ", ".join(f"{k} {v}" for k, v in U.op_histogram(m).items())
        opset = ", ".join(f"{o.domain or 'ai.onnx'} {o.version}" for o in m.opset_import)
        print(f"| {name} | {opset} | {len(m.graph.node)} | {ops} |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--markdown", action="store_true")
    args = ap.parse_args()
    names = sorted(os.path.basename(p)[:-5] for p in glob.glob(os.path.join(U.HERE, "*.onnx")))
    all_ok = True
    for name in names:
        if name in SKELETON_PARAMS:
            ok, msg = check_skeleton(name)
        elif os.path.exists(os.path.join(U.HERE, name + ".ref.npz")):
            ok, msg = check_model(name)
        else:
            ok, msg = False, f"{name}: no reference file"
        all_ok &= ok
        print(("ok   " if ok else "FAIL ") + msg)
    if args.markdown:
        markdown(names)
    sys.exit(0 if all_ok else 1)


if __name__ == "__main__":
    main()
