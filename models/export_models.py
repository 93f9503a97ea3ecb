#!/usr/bin/env python3
"""Exports the small committed ONNX test models and their PyTorch references.

Run from anywhere (CPU only, ~2-4 minutes, needs data/ from make_data.py):
    /work/venv/bin/python models/make_data.py
    /work/venv/bin/python models/export_models.py            # everything
    /work/venv/bin/python models/export_models.py --only vit_tiny text_encoder
    /work/venv/bin/python models/export_models.py --skip-skeletons

See models/README.md for what each file is and the exporter quirks observed.

Weights: random init with fixed seeds, then every parameter whose elements
are all equal (torchvision/HF init leaves LayerNorm weights = 1, most biases =
0, the ViT class token and head = 0) gets N(0, 0.05^2) noise added
(`make_unique_`). This (1) makes every parameter tensor distinct, so the map
torch parameter -> ONNX initializer can be built from values alone and cannot
be fooled by two all-ones LayerNorm weights, (2) stops the exporter's
value-based initializer de-duplication in EVAL mode (see
vit_tiny_eval_op14_tied.onnx for what it does otherwise), and (3) avoids the
zero classification head, which would make every upstream gradient zero.
nn.Embedding.padding_idx is cleared (torch would drop the gradient of that row;
an ONNX Gather has no such notion).

Reference files (models/<name>.ref.npz), one per model with data:
    <graph input names>  batch 4 inputs from data/*_test.npz (first 4 rows)
    labels               int64 [4]
    logits               float32 [4, C], PyTorch with dropout off
    loss                 float32 scalar, mean softmax cross-entropy
    grad/<initializer>   float32, d loss / d ONNX initializer, for every
                         initializer that is (a view of) a model parameter
models/<name>.ref_b3.npz: inputs (rows 4..6) + logits, batch 3.

"Dropout off": the module stays in train() mode with every dropout
probability set to 0 (nn.Dropout.p, nn.MultiheadAttention.dropout). For all
models but bigbird_sparse this is bit-for-bit eval() (asserted below); for
bigbird_sparse eval() would also change HF's random block plan, which the
export froze as constants from train mode (see README).
"""
import argparse
import collections
import json
import os
import shutil
import sys
import tempfile
import warnings

import numpy as np
import onnx
import torch
import torch.nn as nn
import torch.nn.functional as F
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import onnx_ref_util as U  # noqa: E402

MODELS = U.HERE
DATA = os.path.join(U.ROOT, "data")
OPSET_TS = 17
REPORT = {}

warnings.filterwarnings("ignore")
torch.use_deterministic_algorithms(True)
torch.set_num_threads(2)


# ----------------------------------------------------------------------------- helpers

def seed_all(seed):
    torch.manual_seed(seed)
    np.random.seed(seed)


@torch.no_grad()
def make_unique_(model, seed, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    changed = []
    for name, p in model.named_parameters():
        if p.numel() > 1 and bool((p == p.reshape(-1)[0]).all()):
            p.add_(torch.randn(p.shape, generator=g) * scale)
            changed.append(name)
        elif p.numel() == 1:
            p.add_(torch.randn(p.shape, generator=g) * scale)
            changed.append(name)
    for m in model.modules():
        if isinstance(m, nn.Embedding):
            m.padding_idx = None
    # every parameter must now be distinct from every other (and from its transpose)
    ps = list(model.named_parameters())
    for i, (a, pa) in enumerate(ps):
        for b, pb in ps[i + 1:]:
            assert not (pa.shape == pb.shape and torch.equal(pa, pb)), (a, b)
    return changed


def set_dropout(model, p):
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = p
        if isinstance(m, nn.MultiheadAttention):
            m.dropout = p


def export_ts(model, args, path, input_names, dynamic_axes, opset=OPSET_TS,
              training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False):
    torch.onnx.export(model, args, path, input_names=input_names, output_names=["logits"],
                      opset_version=opset, training=training,
                      do_constant_folding=do_constant_folding, dynamic_axes=dynamic_axes,
                      dynamo=False)


def match_initializers(onnx_model, torch_model, allow_tied=False):
    """Map each ONNX initializer to the torch parameters it holds, by value.

    Returns {init_name: [(param_name, transform)]} with transform 'id' or 'T'
    (initializer == param.T, the EVAL-mode constant folding of Linear weights
    for MatMul), the list of non-parameter initializers, and the torch
    parameters with no initializer.
    """
    params = {n: p.detach().cpu().numpy() for n, p in torch_model.named_parameters()}
    by_shape = collections.defaultdict(list)
    for n, a in params.items():
        by_shape[a.shape].append(n)
    mapping, non_param = {}, []
    for init in onnx_model.graph.initializer:
        arr = numpy_helper.to_array(init)
        hits = []
        if arr.dtype == np.float32:
            for n in by_shape.get(arr.shape, []):
                if np.array_equal(arr, params[n]):
                    hits.append((n, "id"))
            if arr.ndim == 2:
                for n in by_shape.get(arr.shape[::-1], []):
                    if np.array_equal(arr, params[n].T) and arr.shape[0] != arr.shape[1]:
                        hits.append((n, "T"))
                    elif arr.shape[0] == arr.shape[1] and np.array_equal(arr, params[n].T) \
                            and not np.array_equal(arr, params[n]):
                        hits.append((n, "T"))
        if hits:
            if len(hits) > 1 and not allow_tied:
                raise RuntimeError(f"initializer {init.name} matches several parameters: {hits}")
            mapping[init.name] = hits
        else:
            non_param.append(init.name)
    used = {n for hs in mapping.values() for n, _ in hs}
    unmatched = [n for n in params if n not in used]
    return mapping, non_param, unmatched


def torch_forward_loss(model, inputs, labels):
    model.zero_grad(set_to_none=True)
    logits = model(*inputs)
    if isinstance(logits, (tuple, list)):
        logits = logits[0]
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    grads = {n: (p.grad.detach().clone() if p.grad is not None else None)
             for n, p in model.named_parameters()}
    return logits.detach(), loss.detach(), grads


def ort_fd_check(model, feeds, labels, grads_by_init, eps=1e-2):
    """Central differences of the ORT loss along d = g/|g| for every param
    initializer; the result must be |g| (independent check of the grad map)."""
    model, _ = U.disable_dropout(model)
    worst = 0.0
    base = {i.name: i for i in model.graph.initializer}
    for name, g in grads_by_init.items():
        gn = float(np.linalg.norm(g.astype(np.float64)))
        if gn == 0.0:
            continue
        d = (g / gn).astype(np.float32)
        vals = []
        orig = numpy_helper.to_array(base[name]).copy()
        for s in (+1, -1):
            base[name].CopyFrom(numpy_helper.from_array((orig + s * eps * d).astype(np.float32), name))
            sess = U.ort_session(model)
            vals.append(U.softmax_xent(sess.run(None, feeds)[0], labels))
        base[name].CopyFrom(numpy_helper.from_array(orig, name))
        fd = (vals[0] - vals[1]) / (2 * eps)
        err = abs(fd - gn) / (gn + 1e-3)
        worst = max(worst, err)
        if abs(fd - gn) > 3e-2 * gn + 3e-4:
            raise RuntimeError(f"FD check failed for {name}: fd={fd} |g|={gn}")
    return worst


def summarize(name, path):
    m = onnx.load(path, load_external_data=False)
    inits = m.graph.initializer
    info = {
        "file": os.path.basename(path),
        "opset": {o.domain or "ai.onnx": o.version for o in m.opset_import},
        "ir_version": m.ir_version,
        "producer": f"{m.producer_name} {m.producer_version}",
        "inputs": [(i.name, [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim],
                    onnx.TensorProto.DataType.Name(i.type.tensor_type.elem_type))
                   for i in m.graph.input],
        "outputs": [(o.name, [d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim])
                    for o in m.graph.output],
        "n_nodes": len(m.graph.node),
        "n_initializers": len(inits),
        "ops": U.op_histogram(m),
        "local_functions": [f"{f.domain}::{f.name}" for f in m.functions],
    }
    REPORT.setdefault(name, {}).update(info)
    return m


def write_refs(name, onnx_path, model, make_inputs, input_names, allow_tied=False,
               eval_equal=True, extra_seq_check=None, batch3=True):
    """Reference files + ORT checks for one committed model."""
    m_onnx = onnx.load(onnx_path, load_external_data=True)
    mapping, non_param, unmatched = match_initializers(m_onnx, model, allow_tied=allow_tied)

    set_dropout(model, 0.0)
    model.train()
    inputs4, labels4 = make_inputs(0, 4)
    logits, loss, grads = torch_forward_loss(model, inputs4, labels4)
    # eval() gives the same logits for every model except bigbird_sparse
    model.eval()
    with torch.no_grad():
        le = model(*inputs4)
        le = le[0] if isinstance(le, (tuple, list)) else le
    model.train()
    eval_diff = float((le - logits).abs().max())
    if eval_equal:
        assert eval_diff <= 1e-6 * float(logits.abs().max()), (name, eval_diff)

    for n in unmatched:
        assert grads[n] is None or float(grads[n].abs().max()) == 0.0, \
            f"{name}: parameter {n} has a gradient but no ONNX initializer"
    ref = {k: v.numpy() for k, v in zip(input_names, inputs4)}
    ref["labels"] = labels4.numpy()
    ref["logits"] = logits.numpy().astype(np.float32)
    ref["loss"] = np.array(float(loss), dtype=np.float32)
    grads_by_init = {}
    for init_name, hits in mapping.items():
        acc = None
        for pname, tr in hits:
            g = grads[pname]
            g = torch.zeros_like(dict(model.named_parameters())[pname]) if g is None else g
            g = g.t() if tr == "T" else g
            acc = g.clone() if acc is None else acc + g
        grads_by_init[init_name] = acc.numpy().astype(np.float32)
        ref["grad/" + init_name] = grads_by_init[init_name]
        if len(hits) > 1:
            # Tied by the exporter's value de-duplication: the other torch
            # parameters survive only as Identity(<init_name>) outputs named
            # after them. grad/<init_name> is the ONNX meaning (one shared
            # tensor, sum of the uses); untied_grad/<torch name> is each use on
            # its own, for an importer that un-ties such Identity copies.
            for pname, tr in hits:
                g = grads[pname]
                ref["untied_grad/" + pname] = (g.t() if tr == "T" else g).numpy().astype(np.float32)
    np.savez(os.path.join(MODELS, f"{name}.ref.npz"), **ref)

    b3_path = os.path.join(MODELS, f"{name}.ref_b3.npz")
    if batch3:
        inputs3, _ = make_inputs(4, 3)
        with torch.no_grad():
            l3 = model(*inputs3)
            l3 = l3[0] if isinstance(l3, (tuple, list)) else l3
        ref3 = {k: v.numpy() for k, v in zip(input_names, inputs3)}
        ref3["logits"] = l3.numpy().astype(np.float32)
        np.savez(b3_path, **ref3)
    elif os.path.exists(b3_path):
        os.remove(b3_path)

    # ORT on the committed file (dropout nodes switched to inference)
    feeds4 = {k: ref[k] for k in input_names}
    d4 = U.rel_diff(U.ort_logits(onnx_path, feeds4), ref["logits"])
    d3 = None
    if batch3:
        feeds3 = {k: ref3[k] for k in input_names}
        d3 = U.rel_diff(U.ort_logits(onnx_path, feeds3), ref3["logits"])
    assert d4 <= 1e-5 and (d3 is None or d3 <= 1e-5), (name, d4, d3)
    ort_loss = U.softmax_xent(U.ort_logits(onnx_path, feeds4), ref["labels"])
    fd_worst = ort_fd_check(m_onnx, feeds4, ref["labels"], grads_by_init)

    seq_diff = None
    if extra_seq_check is not None:      # another sequence length through the dynamic axis
        xs = extra_seq_check()
        with torch.no_grad():
            lt = model(*xs)
            lt = lt[0] if isinstance(lt, (tuple, list)) else lt
        T = int(xs[0].shape[1])
        try:
            seq_diff = U.rel_diff(
                U.ort_logits(onnx_path, {k: v.numpy() for k, v in zip(input_names, xs)}), lt.numpy())
            seq_diff = f"T={T}: rel diff {seq_diff:.2e}"
        except Exception as e:   # e.g. nn.MultiheadAttention bakes the traced length
            seq_diff = f"T={T}: ORT FAILS: " + str(e).split("Status Message:")[-1].strip()[-160:]

    n_param_elems = sum(int(np.prod(grads_by_init[k].shape)) for k in grads_by_init)
    non_param_info = []
    for init in m_onnx.graph.initializer:
        if init.name in non_param:
            a = numpy_helper.to_array(init)
            non_param_info.append((init.name, list(a.shape), str(a.dtype),
                                   a.tolist() if a.size <= 8 else f"{a.size} values"))
    REPORT.setdefault(name, {}).update({
        "param_initializers": len(mapping),
        "param_elements": n_param_elems,
        "torch_params": sum(p.numel() for p in model.parameters()),
        "transposed_initializers": sorted(k for k, h in mapping.items() if h[0][1] == "T"),
        "tied_initializers": {k: [p for p, _ in h] for k, h in mapping.items() if len(h) > 1},
        "non_param_initializers": non_param_info,
        "torch_params_without_initializer": unmatched,
        "ort_vs_torch_b4": d4, "ort_vs_torch_b3": d3, "ort_vs_torch_other_seq": seq_diff,
        "loss": float(loss), "ort_loss": ort_loss,
        "fd_grad_check_worst_rel": fd_worst,
        "eval_vs_train_p0_max_abs_diff": eval_diff,
    })
    set_dropout(model, 0.1)
    print(f"  {name}: ort diff b4={d4:.2e} b3={d3} seq={seq_diff} loss={float(loss):.4f} "
          f"fd={fd_worst:.2e} params={n_param_elems}")


# ----------------------------------------------------------------------------- data

def digits_inputs(start, n):
    d = np.load(os.path.join(DATA, "digits_test.npz"))
    return (torch.from_numpy(d["x"][start:start + n]),), torch.from_numpy(d["y"][start:start + n])


def text_inputs_fn(fname, with_mask=True):
    def f(start, n):
        d = np.load(os.path.join(DATA, fname))
        ids = torch.from_numpy(d["input_ids"][start:start + n])
        mask = torch.from_numpy(d["attention_mask"][start:start + n])
        return ((ids, mask) if with_mask else (ids,)), torch.from_numpy(d["y"][start:start + n])
    return f


# ----------------------------------------------------------------------------- ViT tiny

def build_vit_tiny(seed=0):
    import torchvision
    seed_all(seed)
    m = torchvision.models.VisionTransformer(
        image_size=8, patch_size=2, num_layers=2, num_heads=2, hidden_dim=32, mlp_dim=64,
        num_classes=10, dropout=0.1, attention_dropout=0.1)
    m.conv_proj = nn.Conv2d(1, 32, kernel_size=2, stride=2)
    return m


def do_vit_tiny():
    model = build_vit_tiny()
    changed = make_unique_(model, seed=100)
    REPORT["vit_tiny"] = {"perturbed_params": changed}
    x = digits_inputs(0, 4)[0]
    dyn = {"x": {0: "batch"}, "logits": {0: "batch"}}

    p = os.path.join(MODELS, "vit_tiny.onnx")
    export_ts(model, x, p, ["x"], dyn)
    summarize("vit_tiny", p)
    write_refs("vit_tiny", p, model, digits_inputs, ["x"])

    p = os.path.join(MODELS, "vit_tiny_eval_op14.onnx")
    export_ts(model, x, p, ["x"], dyn, opset=14, training=torch.onnx.TrainingMode.EVAL,
              do_constant_folding=True)
    summarize("vit_tiny_eval_op14", p)
    write_refs("vit_tiny_eval_op14", p, model, digits_inputs, ["x"])

    # external data copy of vit_tiny.onnx
    src = onnx.load(os.path.join(MODELS, "vit_tiny.onnx"))
    p = os.path.join(MODELS, "vit_tiny_ext.onnx")
    for f in (p, p + ".data"):
        if os.path.exists(f):
            os.remove(f)
    onnx.save_model(src, p, save_as_external_data=True, all_tensors_to_one_file=True,
                    location="vit_tiny_ext.onnx.data", size_threshold=0)
    summarize("vit_tiny_ext", p)
    write_refs("vit_tiny_ext", p, model, digits_inputs, ["x"])

    # dynamo exporter
    p = os.path.join(MODELS, "vit_tiny_dynamo.onnx")
    model.eval()
    try:
        batch = torch.export.Dim("batch", min=1, max=4096)
        torch.onnx.export(model, x, p, input_names=["x"], output_names=["logits"],
                          opset_version=18, dynamo=True, dynamic_shapes={"x": {0: batch}})
        summarize("vit_tiny_dynamo", p)
        REPORT["vit_tiny_dynamo"]["note"] = (
            "dynamic_axes={'x':{0:'batch'}} fails in torch 2.5.1 (guard Ne(batch, 2**63-1) "
            "violates the unbounded range); dynamic_shapes with Dim('batch', min=1, max=4096) works")
        model.train()
        write_refs("vit_tiny_dynamo", p, model, digits_inputs, ["x"])
    except Exception as e:  # documented in README if it happens
        REPORT["vit_tiny_dynamo"] = {"error": repr(e)}
        print("  dynamo export failed:", repr(e)[:400])
    model.train()

    # pristine (torchvision) init: LayerNorm 1/0 and zero biases are equal
    # tensors, which the EVAL exporter de-duplicates into Identity nodes.
    tied = build_vit_tiny()
    with torch.no_grad():
        for (n, pt), (_, pu) in zip(tied.named_parameters(), model.named_parameters()):
            if n not in changed or n in ("class_token", "heads.head.weight", "heads.head.bias"):
                pt.copy_(pu)   # keep head/class token non-zero so gradients flow
    set_dropout(tied, 0.1)
    p = os.path.join(MODELS, "vit_tiny_eval_op14_tied.onnx")
    export_ts(tied, x, p, ["x"], dyn, opset=14, training=torch.onnx.TrainingMode.EVAL,
              do_constant_folding=True)
    mt = summarize("vit_tiny_eval_op14_tied", p)
    inits = {i.name for i in mt.graph.initializer}
    REPORT["vit_tiny_eval_op14_tied"]["identity_of_initializer"] = [
        (n.input[0], n.output[0]) for n in mt.graph.node
        if n.op_type == "Identity" and n.input[0] in inits]
    write_refs("vit_tiny_eval_op14_tied", p, tied, digits_inputs, ["x"], allow_tied=True)


# ----------------------------------------------------------------------------- skeletons

def strip_initializers(model):
    for init in model.graph.initializer:
        for field in ("raw_data", "float_data", "int32_data", "int64_data", "double_data",
                      "uint64_data", "string_data", "external_data"):
            init.ClearField(field)
        init.ClearField("data_location")


def do_skeleton(name, ctor, expected):
    seed_all(0)
    model = ctor(weights=None)
    x = torch.zeros(1, 3, 224, 224)
    with tempfile.TemporaryDirectory() as td:
        tmp = os.path.join(td, "full.onnx")
        export_ts(model, x, tmp, ["x"], {"x": {0: "batch"}, "logits": {0: "batch"}})
        m = onnx.load(tmp)
    params = dict(model.named_parameters())
    param_elems, non_param, n_param_inits = 0, [], 0
    for init in m.graph.initializer:
        dims = tuple(init.dims)
        if init.name in params:
            assert tuple(params[init.name].shape) == dims, init.name
            param_elems += int(np.prod(dims))
            n_param_inits += 1
        else:
            a = numpy_helper.to_array(init)
            non_param.append((init.name, list(dims), str(a.dtype), a.tolist() if a.size <= 8 else None))
    missing = [n for n in params if n not in {i.name for i in m.graph.initializer}]
    big_constants = []
    for n in m.graph.node:
        if n.op_type == "Constant":
            for a in n.attribute:
                if a.name == "value" and int(np.prod(a.t.dims)) > 64:
                    big_constants.append((n.output[0], list(a.t.dims)))
    strip_initializers(m)
    p = os.path.join(MODELS, f"{name}.onnx")
    onnx.save_model(m, p)
    summarize(name, p)
    REPORT[name].update({
        "param_initializers": n_param_inits, "param_elements": param_elems,
        "expected_param_elements": expected,
        "torch_params": sum(q.numel() for q in model.parameters()),
        "non_param_initializers": non_param, "torch_params_without_initializer": missing,
        "constant_nodes_over_64_elements": big_constants,
    })
    assert param_elems == expected, (name, param_elems, expected)
    print(f"  {name}: {param_elems} parameter elements in {n_param_inits} initializers; "
          f"non-param initializers: {non_param}; size {os.path.getsize(p)}")


# ----------------------------------------------------------------------------- text encoder

class TextEncoder(nn.Module):
    """Embedding + learned positions + 2-layer post-LN TransformerEncoder + masked mean pool."""

    def __init__(self, vocab=64, d=32, max_len=64, n_classes=2):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d)
        self.pos_emb = nn.Parameter(torch.randn(max_len, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d_model=d, nhead=2, dim_feedforward=64, dropout=0.1,
                                           batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, num_layers=2, enable_nested_tensor=False)
        # nn.TransformerEncoder deep-copies `layer`, so all layers start with
        # identical weights; give each layer its own random init.
        for lyr in self.encoder.layers:
            lyr.self_attn._reset_parameters()
            lyr.self_attn.out_proj.reset_parameters()
            lyr.linear1.reset_parameters()
            lyr.linear2.reset_parameters()
        self.head = nn.Linear(d, n_classes)

    def forward(self, input_ids, attention_mask):
        t = input_ids.shape[1]
        h = self.tok_emb(input_ids) + self.pos_emb[:t]
        h = self.encoder(h, src_key_padding_mask=attention_mask == 0)
        m = attention_mask.unsqueeze(-1).to(h.dtype)
        pooled = (h * m).sum(dim=1) / m.sum(dim=1).clamp(min=1.0)
        return self.head(pooled)


def text_other_len(T, fname="text_test.npz"):
    def f():
        d = np.load(os.path.join(DATA, fname))
        ids = d["input_ids"][10:14, :T].copy()
        mask = d["attention_mask"][10:14, :T].copy()
        return torch.from_numpy(ids), torch.from_numpy(mask)
    return f


def do_text_encoder():
    seed_all(1)
    n_classes = int(np.load(os.path.join(DATA, "text_train.npz"))["y"].max()) + 1
    model = TextEncoder(n_classes=n_classes)
    changed = make_unique_(model, seed=101)
    REPORT["text_encoder"] = {"perturbed_params": changed}
    inputs, _ = text_inputs_fn("text_test.npz")(0, 4)
    p = os.path.join(MODELS, "text_encoder.onnx")
    dyn = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
           "logits": {0: "batch"}}
    model.train()
    export_ts(model, inputs, p, ["input_ids", "attention_mask"], dyn)
    summarize("text_encoder", p)
    write_refs("text_encoder", p, model, text_inputs_fn("text_test.npz"),
               ["input_ids", "attention_mask"], extra_seq_check=text_other_len(20))


# ----------------------------------------------------------------------------- BigBird

def build_bigbird(attention_type, n_classes, seed=2):
    from transformers import BigBirdConfig, BigBirdForSequenceClassification
    seed_all(seed)
    cfg = BigBirdConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                        intermediate_size=64, max_position_embeddings=128, block_size=4,
                        num_random_blocks=2, num_labels=n_classes, attention_type=attention_type,
                        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                        initializer_range=0.2, return_dict=False)
    m = BigBirdForSequenceClassification(cfg)
    return m


def do_bigbird(attention_type, name, fname, seq_check):
    n_classes = int(np.load(os.path.join(DATA, "text_train.npz"))["y"].max()) + 1
    model = build_bigbird(attention_type, n_classes)
    changed = make_unique_(model, seed=102)
    REPORT[name] = {"perturbed_params": changed}
    inputs, _ = text_inputs_fn(fname)(0, 4)
    p = os.path.join(MODELS, f"{name}.onnx")
    dyn = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
           "logits": {0: "batch"}}
    if attention_type == "block_sparse":
        # The block-sparse path computes flat gather indices and the random
        # block plan in Python from the traced batch and sequence sizes, so the
        # graph is only valid at the traced shape (batch 4, seq 64); export it
        # with static shapes rather than advertise axes that do not work.
        dyn = None
    model.train()
    if attention_type == "block_sparse":
        # HF builds the random block plan with torch.tensor(numpy array) inside
        # forward; the tracer records aten::lift_fresh, which has no ONNX
        # symbolic in torch 2.5.1 ("Exporting the operator 'aten::lift_fresh'
        # to ONNX opset version 17 is not supported"). lift_fresh is the
        # identity on a freshly created constant, so map it to its input.
        torch.onnx.register_custom_op_symbolic("aten::lift_fresh", lambda g, x: x, OPSET_TS)
    export_ts(model, inputs, p, ["input_ids", "attention_mask"], dyn)
    assert model.bert.attention_type == attention_type, model.bert.attention_type
    summarize(name, p)
    write_refs(name, p, model, text_inputs_fn(fname), ["input_ids", "attention_mask"],
               eval_equal=(attention_type == "original_full"), extra_seq_check=seq_check,
               batch3=(attention_type == "original_full"))


# ----------------------------------------------------------------------------- main

def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None)
    ap.add_argument("--skip-skeletons", action="store_true")
    args = ap.parse_args()
    jobs = collections.OrderedDict([
        ("vit_tiny", do_vit_tiny),
        ("text_encoder", do_text_encoder),
        ("bigbird_full", lambda: do_bigbird("original_full", "bigbird_full", "text_test.npz",
                                            text_other_len(20))),
        ("bigbird_sparse", lambda: do_bigbird("block_sparse", "bigbird_sparse", "text64_test.npz",
                                              None)),
        ("vit_b_16_skeleton", lambda: do_skeleton("vit_b_16_skeleton", __import__(
            "torchvision").models.vit_b_16, 86_567_656)),
        ("vit_l_16_skeleton", lambda: do_skeleton("vit_l_16_skeleton", __import__(
            "torchvision").models.vit_l_16, 304_326_632)),
        ("vit_h_14_skeleton", lambda: do_skeleton("vit_h_14_skeleton", __import__(
            "torchvision").models.vit_h_14, 632_045_800)),
    ])
    for k, fn in jobs.items():
        if args.only and k not in args.only:
            continue
        if args.skip_skeletons and "skeleton" in k:
            continue
        print(f"== {k}", flush=True)
        fn()
    out = os.path.join(MODELS, "export_report.json")
    old = {}
    if os.path.exists(out):
        with open(out) as f:
            old = json.load(f)
    old.update(REPORT)
    with open(out, "w") as f:
        json.dump(old, f, indent=1, default=str)
    print("wrote", out)


if __name__ == "__main__":
    main()
