#!/usr/bin/env python3
"""Exports with today's releases (issue 13): the models the issue reports, as current PyPI
torch / transformers / onnx write them, with PyTorch references in the format of
export_models.py (models/README.md, "Reference files").

    /work/venv-export/bin/python models/export_t215.py            # ~1 min, CPU only
    /work/venv-export/bin/python models/export_t215.py --only distilbert_t215

Versions used are written into export_report.json ("t215_versions") and models/README.md.
Every model uses the small configs of export_models.py (random weights, fixed seeds,
make_unique_), except where noted:

  bigbird_sparse_t215   HF BigBirdForSequenceClassification, attention_type block_sparse,
                        TorchScript exporter (dynamo=False), opset 17, TRAINING mode, no
                        dynamic axes: batch 4 and seq 64 are fixed by the trace.
  bigbird_full_t215     same config, original_full, TorchScript, opset 17, no dynamic axes
                        (the issue's "traced without dynamic axes": batch 4, seq 32 fixed).
  distilbert_ts_t215    the same DistilBERT through the TorchScript exporter (opset 17, TRAINING):
                        SDPA exported as Sqrt/Cast scale, Softmax, IsNaN/Where.
  distilbert_t215       HF DistilBertForSequenceClassification (SDPA attention, the default),
                        torch.onnx.export with default options (dynamo exporter, optimize=True),
                        static shapes [4, 32].
  vit_tiny_dynamo_t215  the vit_tiny of export_models.py (same weights), torch.onnx.export with
                        default options (dynamo, optimize=True): folded weight transposes, a
                        batch-expanded class token [4,1,32], static batch 4.
  vit_tiny_dynamo_t215_tied  the same with torchvision's LayerNorm init left as is (weights 1,
                        biases 0): the optimizer deduplicates equal initializers. Reference
                        gradients are per PyTorch parameter (untied_grad/<torch name>) and for
                        the shared initializer (grad/<init>, the sum: what the graph says).
  pool_net_t215, pool_net_ts_t215  a small digits model with GroupNorm, AvgPool (padded;
                        ceil mode), MaxPool (2-D padded; 1-D), Hardswish and Hardsigmoid: the
                        ops of PoolFormer, Funnel, BiT, CANINE and LeViT, through the dynamo
                        default and the TorchScript (TRAINING, no folding) exporters.
  bn_net_noopt_t215, bn_net_ts_t215  BatchNorm (2-D and 1-D) with running statistics, exported
                        in eval() by dynamo with optimize=False (the Python package's export) and by
                        TorchScript (EVAL, no folding); references in eval() (frozen-BN training).
  bn_net_train_t215, bn_net_train_ts_t215  the same BnNet exported in train(): dynamo with
                        optimize=False and a dynamic batch (_native_batch_norm_legit_functional,
                        no training_mode) and
                        TorchScript (TRAINING: training_mode 1, running-statistics outputs).
                        References in train(): gradients through the batch statistics, the running
                        statistics after that forward (buffer/<init>), the eval() logits with
                        them (eval/logits) and with the file's (infer/logits: what inference computes).
  moe_net_t215, moe_net_ts_t215  a mixture-of-experts layer (softmax router, TopK 2 of 4,
                        one_hot combine, batched experts) through the dynamo default and TorchScript.
  rnn_net_ts_t215       a bidirectional LSTM, a batch-first GRU and a tanh RNN over the digits'
                        rows (ONNX LSTM, GRU, RNN), TorchScript (TRAINING). The dynamo default
                        writes LSTM and GRU weights gate-reordered into folded initializers, which
                        the reference files cannot name (timm's Sequencer through dynamo is in
                        bench/journal/2026.md §53 instead).
  pad_fold_net_t215     reflect and replicate padding and F.fold of overlapping blocks (Col2Im with
                        stride 2 and padding 1), dynamo default (TorchScript cannot export col2im).
  bert_t215, roberta_t215  HF BertForSequenceClassification / RobertaForSequenceClassification,
                        small configs, dynamo default options (coverage: import + logits).
  distilbert_base_t215_skeleton  DistilBERT-base dims (768, 12 layers, 12 heads, vocab 30522,
                        max_pos 512), dynamo default, static [16, 512], weights stripped.
  bigbird_base_sparse_t215_skeleton  google/bigbird-roberta-base dims, block_sparse, TorchScript
                        opset 17, static [2, 4096], weights stripped (bench/journal/2026.md).

Reference keys add `map/<init>` (a 0-d string array naming the PyTorch parameter and 'T' when
the initializer holds its transpose) for the mapping test and the README.
"""
import argparse
import collections
import json
import os
import sys
import tempfile
import warnings

import numpy as np
import onnx
import torch
import torch.nn.functional as F
from onnx import numpy_helper

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import onnx_ref_util as U  # noqa: E402
from export_models import (DATA, MODELS, build_vit_tiny, digits_inputs, make_unique_, seed_all,  # noqa: E402
                           set_dropout, strip_initializers, text_inputs_fn)

warnings.filterwarnings("ignore")
torch.use_deterministic_algorithms(True)
torch.set_num_threads(2)
REPORT = {}


def versions():
    import transformers
    import onnxscript
    import onnxruntime
    import torchvision
    return {"torch": torch.__version__, "torchvision": torchvision.__version__,
            "transformers": transformers.__version__, "onnx": onnx.__version__,
            "onnxscript": onnxscript.__version__, "onnxruntime": onnxruntime.__version__,
            "numpy": np.__version__}


def match(onnx_model, torch_model):
    """{init: [(param, 'id'|'T'|'B')]} by value; 'B' = a batch-expanded copy of the param
    (leading dim = export batch, every row equal to it)."""
    params = {n: p.detach().cpu().numpy() for n, p in torch_model.named_parameters()}
    mapping, non_param = {}, []
    for init in onnx_model.graph.initializer:
        a = numpy_helper.to_array(init)
        hits = []
        if a.dtype == np.float32 and a.size > 1:
            for n, p in params.items():
                if a.shape == p.shape and np.array_equal(a, p):
                    hits.append((n, "id"))
                elif a.ndim == 2 and a.shape == p.shape[::-1] and np.array_equal(a, p.T) \
                        and not np.array_equal(a, p):
                    hits.append((n, "T"))
                elif a.ndim == p.ndim and a.ndim >= 2 and p.shape[0] == 1 and a.shape[1:] == p.shape[1:] \
                        and a.shape[0] > 1 and np.array_equal(a, np.broadcast_to(p, a.shape)):
                    hits.append((n, "B"))
                elif a.ndim == p.ndim + 1 and a.shape[0] == 1 and a.shape[2:] == p.shape[1:] \
                        and a.shape[1] < p.shape[0] and np.array_equal(a[0], p[:a.shape[1]]):
                    hits.append((n, "S"))   # a folded lookup of the first rows (position embeddings)
                elif a.shape != p.shape and a.size == p.size and np.array_equal(a.reshape(-1), p.reshape(-1)):
                    hits.append((n, "R"))   # a folded reshape (GroupNorm's weight as [C, 1, 1])
        if hits:
            mapping[init.name] = hits
        else:
            non_param.append(init.name)
    used = {n for hs in mapping.values() for n, _ in hs}
    return mapping, non_param, [n for n in params if n not in used]


def forward_loss(model, inputs, labels):
    model.zero_grad(set_to_none=True)
    out = model(*inputs)
    logits = out[0] if isinstance(out, (tuple, list)) else (out.logits if hasattr(out, "logits") else out)
    loss = F.cross_entropy(logits, labels)
    loss.backward()
    grads = {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
             for n, p in model.named_parameters()}
    return logits.detach(), loss.detach(), grads


def write_refs(name, path, model, make_inputs, input_names, train=True, buffers=False, ort_agrees=True):
    """<name>.ref.npz: inputs, labels, logits, loss, grad/<init> (what the graph means:
    transposed for 'T', summed over a shared initializer's params; for 'B' the parameter's own
    gradient, the re-derived [1,...] form memc trains) and untied_grad/<torch name> for shared
    initializers."""
    m = onnx.load(path, load_external_data=True)
    mapping, non_param, unmatched = match(m, model)
    set_dropout(model, 0.0)
    model.train(train)   # eval() for BatchNorm with running statistics
    inputs4, labels4 = make_inputs(0, 4)
    if buffers:   # what inference computes: eval() with the running statistics the file holds
        model.eval()
        with torch.no_grad():
            infer_logits = model(*inputs4).numpy().astype(np.float32)
        model.train(train)
    logits, loss, grads = forward_loss(model, inputs4, labels4)
    for n in unmatched:
        assert float(grads[n].abs().max()) == 0.0, f"{name}: {n} has a gradient but no initializer"
    # A parameter reached only through a folded lookup of its first rows: the rest get no gradient.
    for init, hits in mapping.items():
        for p, t in hits:
            if t == "S":
                rows = numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == init)).shape[1]
                assert float(grads[p][rows:].abs().max()) == 0.0, (name, p)
    ref = {k: v.numpy() for k, v in zip(input_names, inputs4)}
    if buffers:   # the running statistics the train() forward above updated, and eval() with them
        ref["infer/logits"] = infer_logits
        state = model.state_dict()
        for init in m.graph.initializer:
            if "running_" in init.name:
                ref["buffer/" + init.name] = state[init.name].numpy().astype(np.float32)
        model.eval()
        with torch.no_grad():
            ref["eval/logits"] = model(*inputs4).numpy().astype(np.float32)
        model.train(train)
    ref["labels"] = labels4.numpy()
    ref["logits"] = logits.numpy().astype(np.float32)
    ref["loss"] = np.array(float(loss), dtype=np.float32)
    for init, hits in mapping.items():
        acc = None
        for pname, tr in hits:
            g = grads[pname]
            g = g.t() if tr == "T" else g
            if tr in ("S", "R"):
                shape = numpy_helper.to_array(next(i for i in m.graph.initializer if i.name == init)).shape
                g = (g[:shape[1]] if tr == "S" else g).reshape(shape)
            acc = g.clone() if acc is None else acc + g
        ref["grad/" + init] = acc.numpy().astype(np.float32)
        ref["map/" + init] = np.array(",".join(p + {"T": "^T", "B": "[batch-expanded]", "S": "[:T] (folded lookup)",
                                                    "R": "[reshaped]"}.get(t, "")
                                               for p, t in hits))
        if len(hits) > 1:
            for pname, tr in hits:
                g = grads[pname]
                ref["untied_grad/" + pname] = (g.t() if tr == "T" else g).numpy().astype(np.float32)
    np.savez(os.path.join(MODELS, f"{name}.ref.npz"), **{k: v for k, v in ref.items() if not k.startswith("map/")})
    ort = U.rel_diff(U.ort_logits(path, {k: ref[k] for k in input_names}), ref["logits"])
    REPORT.setdefault(name, {}).update({
        "param_initializers": len(mapping),
        "map": {k: v.item() for k, v in ref.items() if k.startswith("map/")},
        "transposed_initializers": sorted(k for k, h in mapping.items() if h[0][1] == "T"),
        "folded_lookup_initializers": sorted(k for k, h in mapping.items() if h[0][1] == "S"),
        "batch_expanded_initializers": sorted(k for k, h in mapping.items() if h[0][1] == "B"),
        "shared_initializers": {k: [p for p, _ in h] for k, h in mapping.items() if len(h) > 1},
        "non_param_initializers": [(n, list(numpy_helper.to_array(i).shape)) for i in m.graph.initializer
                                   for n in [i.name] if n in non_param],
        "torch_params_without_initializer": unmatched,
        "torch_params": sum(p.numel() for p in model.parameters()),
        "ort_vs_torch_b4": ort, "loss": float(loss)})
    print(f"  {name}: ORT vs torch {ort:.2e}, loss {float(loss):.4f}, {len(mapping)} param inits, "
          f"T={REPORT[name]['transposed_initializers'][:3]}.. B={REPORT[name]['batch_expanded_initializers']} "
          f"shared={REPORT[name]['shared_initializers']} unmatched={unmatched}")
    assert ort <= 1e-5 or not ort_agrees, (name, ort)


def summarize(name, path):
    m = onnx.load(path, load_external_data=False)
    REPORT.setdefault(name, {}).update({
        "file": os.path.basename(path),
        "opset": {o.domain or "ai.onnx": o.version for o in m.opset_import},
        "producer": f"{m.producer_name} {m.producer_version}",
        "inputs": [(i.name, [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim],
                    onnx.TensorProto.DataType.Name(i.type.tensor_type.elem_type)) for i in m.graph.input],
        "n_nodes": len(m.graph.node), "ops": U.op_histogram(m), "bytes": os.path.getsize(path)})
    print(f"  {name}: {len(m.graph.node)} nodes, {os.path.getsize(path)} bytes, ops {U.op_histogram(m)}")
    return m


def save_inline(path):
    """Re-saves a dynamo export (external data by default) as one file, without the per-node
    stack-trace metadata that makes most of its bytes."""
    m = onnx.load(path, load_external_data=True)
    for n in m.graph.node:
        del n.metadata_props[:]
    for f in (path, path + ".data"):
        if os.path.exists(f):
            os.remove(f)
    onnx.save_model(m, path)


def export_dynamo_default(model, args, path, optimize=True, dynamic_batch=False):
    """torch.onnx.export with default options (dynamo=True, optimize=True in torch ≥ 2.9);
    only the names are given (and optimize=False where asked: memc's Python package's export;
    a dynamic batch where asked)."""
    with tempfile.TemporaryDirectory() as td:
        tmp = os.path.join(td, "m.onnx")
        dynamic = {"dynamic_shapes": ({0: torch.export.Dim.AUTO},)} if dynamic_batch else {}
        torch.onnx.export(model, args, tmp, input_names=None, output_names=["logits"], optimize=optimize, **dynamic)
        m = onnx.load(tmp, load_external_data=True)
    U.keep_scope_metadata(m)
    onnx.save_model(m, path)


def export_ts(model, args, path, names, opset=17):
    torch.onnx.export(model, args, path, input_names=names, output_names=["logits"], opset_version=opset,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, dynamo=False)


def n_classes():
    return int(np.load(os.path.join(DATA, "text_train.npz"))["y"].max()) + 1


# --------------------------------------------------------------------------- models

def build_bigbird(attention_type, seed=2, **dims):
    from transformers import BigBirdConfig, BigBirdForSequenceClassification
    seed_all(seed)
    cfg = dict(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
               max_position_embeddings=128, block_size=4, num_random_blocks=2, num_labels=n_classes(),
               hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1, initializer_range=0.2)
    cfg.update(dims)
    return BigBirdForSequenceClassification(BigBirdConfig(attention_type=attention_type, **cfg))


class Logits(torch.nn.Module):
    """HF models return ModelOutput; the exporters and references want the logits tensor."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]


def do_bigbird(attention_type, name, fname):
    model = build_bigbird(attention_type)
    REPORT[name] = {"perturbed_params": make_unique_(model, seed=102)}
    wrapped = Logits(model)
    inputs, _ = text_inputs_fn(fname)(0, 4)
    p = os.path.join(MODELS, f"{name}.onnx")
    model.train()
    export_ts(wrapped, inputs, p, ["input_ids", "attention_mask"])
    assert model.bert.attention_type == attention_type
    summarize(name, p)
    write_refs(name, p, wrapped, text_inputs_fn(fname), ["input_ids", "attention_mask"])


def build_distilbert(seed=3, **dims):
    from transformers import DistilBertConfig, DistilBertForSequenceClassification
    seed_all(seed)
    cfg = dict(vocab_size=64, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64,
               dropout=0.1, attention_dropout=0.1, seq_classif_dropout=0.1, initializer_range=0.2,
               num_labels=n_classes())
    cfg.update(dims)
    return DistilBertForSequenceClassification(DistilBertConfig(**cfg))


def do_hf_dynamo(name, model, seed):
    REPORT[name] = {"perturbed_params": make_unique_(model, seed=seed),
                    "attn_implementation": getattr(model.config, "_attn_implementation", None)}
    wrapped = Logits(model)
    inputs, _ = text_inputs_fn("text_test.npz")(0, 4)
    p = os.path.join(MODELS, f"{name}.onnx")
    wrapped.eval()
    export_dynamo_default(wrapped, inputs, p)
    summarize(name, p)
    write_refs(name, p, wrapped, text_inputs_fn("text_test.npz"), ["input_ids", "attention_mask"])


def do_distilbert_ts(name):
    """The same DistilBERT through the TorchScript exporter (dynamo=False), TRAINING mode, opset 17."""
    model = build_distilbert()
    REPORT[name] = {"perturbed_params": make_unique_(model, seed=104)}
    wrapped = Logits(model)
    inputs, _ = text_inputs_fn("text_test.npz")(0, 4)
    p = os.path.join(MODELS, f"{name}.onnx")
    wrapped.train()
    export_ts(wrapped, inputs, p, ["input_ids", "attention_mask"])
    summarize(name, p)
    write_refs(name, p, wrapped, text_inputs_fn("text_test.npz"), ["input_ids", "attention_mask"])


def build_bert(kind, seed):
    import transformers as T
    seed_all(seed)
    cfg_cls = T.BertConfig if kind == "bert" else T.RobertaConfig
    model_cls = T.BertForSequenceClassification if kind == "bert" else T.RobertaForSequenceClassification
    cfg = cfg_cls(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                  max_position_embeddings=72, hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                  initializer_range=0.2, num_labels=n_classes(), pad_token_id=0)
    return model_cls(cfg)


def build_gpt2(seed):
    """GPT-2 as a sequence classifier: a causal mask, and the logits of each row's last
    non-pad token picked by a GatherND whose indices the export computes at run time."""
    import transformers as T
    seed_all(seed)
    cfg = T.GPT2Config(vocab_size=64, n_positions=72, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.1, embd_pdrop=0.1,
                       attn_pdrop=0.1, initializer_range=0.2, num_labels=n_classes(), pad_token_id=0)
    return T.GPT2ForSequenceClassification(cfg)


def do_vit_dynamo(name, pristine):
    model = build_vit_tiny()
    changed = make_unique_(model, seed=100)   # the same weights as vit_tiny.onnx
    if pristine:   # torchvision's LayerNorm init (1 / 0) back: equal tensors, deduplicated by the optimizer
        with torch.no_grad():
            for n, p in model.named_parameters():
                if n in changed and ".ln" in n or n.startswith("encoder.ln."):
                    p.fill_(1.0 if n.endswith("weight") else 0.0)
    x = digits_inputs(0, 4)[0]   # the tuple (x,)
    p = os.path.join(MODELS, f"{name}.onnx")
    model.eval()
    export_dynamo_default(model, x, p)
    summarize(name, p)
    model.train()
    write_refs(name, p, model, digits_inputs, ["x"])


class PoolNet(torch.nn.Module):
    """The pooling ops of today's vision and text transformers on one small digits model:
    PoolFormer's GroupNorm and average-pool token mixer (count_include_pad=False), LeViT's
    Hardswish, BiT's padded max-pool stem, Funnel's ceil-mode average pool, a Hardsigmoid gate
    and CANINE's 1-D max-pool downsampling."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(1, 8, 3, padding=1)
        self.norm = torch.nn.GroupNorm(2, 8)
        self.mix = torch.nn.AvgPool2d(3, 1, 1, count_include_pad=False)
        self.act = torch.nn.Hardswish()
        self.down = torch.nn.MaxPool2d(3, 2, 1)
        self.pool = torch.nn.AvgPool2d(3, 2, ceil_mode=True)
        self.gate = torch.nn.Hardsigmoid()
        self.seq_pool = torch.nn.MaxPool1d(2, 2)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = self.stem(x)                       # [B, 8, 8, 8]
        y = self.norm(x)
        x = x + self.mix(y) - y                # PoolFormer's block
        x = self.down(self.act(x))             # [B, 8, 4, 4]
        x = self.pool(x)                       # [B, 8, 2, 2]: the last window overhangs
        x = x * self.gate(x)
        x = self.seq_pool(x.flatten(2))        # [B, 8, 2]
        return self.head(x.flatten(1))


def do_digits_net(name, build, seed, dynamo):
    """A small digits model through the dynamo default (from eval()) or TorchScript (TRAINING),
    with references in train() (neither model has dropout or BatchNorm)."""
    seed_all(seed)
    model = build()
    REPORT[name] = {"perturbed_params": make_unique_(model, seed=100 + seed)}
    x = digits_inputs(0, 4)[0]
    p = os.path.join(MODELS, f"{name}.onnx")
    if dynamo:
        model.eval()
        export_dynamo_default(model, x, p)
    else:
        model.train()
        export_ts(model, x, p, ["x"])
    summarize(name, p)
    write_refs(name, p, model, digits_inputs, ["x"])


class BnNet(torch.nn.Module):
    """BatchNorm with running statistics (a module fine-tuned in eval(), as frozen-BN training
    does): 2-D after a Conv and a depthwise Conv, 1-D after a Linear."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(1, 8, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.dw = torch.nn.Conv2d(8, 8, 3, stride=2, padding=1, groups=8)
        self.bn2 = torch.nn.BatchNorm2d(8, eps=1e-3)
        self.fc = torch.nn.Linear(128, 16)
        self.bn3 = torch.nn.BatchNorm1d(16)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = torch.nn.functional.hardswish(self.bn1(self.stem(x)))
        x = torch.relu(self.bn2(self.dw(x)))
        return self.head(torch.relu(self.bn3(self.fc(x.flatten(1)))))


def bn_net(name, seed):
    """A BnNet with weights perturbed by `seed` and running statistics away from 0 and 1."""
    seed_all(9)
    model = BnNet()
    REPORT[name] = {"perturbed_params": make_unique_(model, seed=seed)}
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for bn in (model.bn1, model.bn2, model.bn3):
            bn.running_mean.copy_(torch.randn(bn.num_features, generator=g) * 0.1)
            bn.running_var.copy_(0.5 + torch.rand(bn.num_features, generator=g))
    return model


def do_bn_net(name, dynamo):
    model = bn_net(name, 109)
    x = digits_inputs(0, 4)[0]
    p = os.path.join(MODELS, f"{name}.onnx")
    model.eval()
    if dynamo:
        export_dynamo_default(model, x, p, optimize=False)
    else:
        torch.onnx.export(model, x, p, input_names=["x"], output_names=["logits"], opset_version=17,
                          training=torch.onnx.TrainingMode.EVAL, do_constant_folding=False, dynamo=False)
    summarize(name, p)
    write_refs(name, p, model, digits_inputs, ["x"], train=False)


def do_bn_net_train(name, dynamo):
    """BnNet exported in train(): batch statistics, running statistics updated each forward. The
    TorchScript trace runs the forward once (updating the buffers), so the module takes the
    running statistics the file holds before its references are computed."""
    model = bn_net(name, 110)
    x = digits_inputs(0, 4)[0]
    p = os.path.join(MODELS, f"{name}.onnx")
    model.train()
    if dynamo:  # a dynamic batch: sharded over ranks, each normalizes with the whole batch's statistics
        export_dynamo_default(model, x, p, optimize=False, dynamic_batch=True)
    else:
        export_ts(model, x, p, ["x"])
    stored = {i.name: numpy_helper.to_array(i) for i in onnx.load(p).graph.initializer}
    with torch.no_grad():
        for n, b in model.named_buffers():
            if n in stored:
                b.copy_(torch.from_numpy(stored[n].copy()))
    summarize(name, p)
    # onnxruntime normalizes a BatchNormalization without training_mode with its running
    # statistics: that the dynamo export's means the batch's only its FX metadata says.
    write_refs(name, p, model, digits_inputs, ["x"], train=True, buffers=True, ort_agrees=not dynamo)


class MoeNet(torch.nn.Module):
    """A mixture-of-experts layer as today's MoE transformers route (Mixtral, Qwen2-MoE): a
    softmax router, its top 2 of 4 experts (TopK) renormalized, combined through one_hot
    (OneHot) over experts computed as one batched product."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Linear(64, 16)
        self.router = torch.nn.Linear(16, 4, bias=False)
        self.experts = torch.nn.Parameter(torch.randn(4, 16, 16) * 0.25)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        h = torch.relu(self.embed(x.flatten(1)))                             # [B, 16]
        weights, chosen = torch.topk(torch.softmax(self.router(h), -1), 2)   # [B, 2]
        weights = weights / weights.sum(-1, keepdim=True)
        combine = (torch.nn.functional.one_hot(chosen, 4) * weights[..., None]).sum(1)   # [B, 4]
        every = torch.einsum("bd,edf->bef", h, self.experts)                 # [B, 4, 16]
        return self.head(torch.einsum("be,bef->bf", combine, every))


class RnnNet(torch.nn.Module):
    """The recurrent layers of timm's Sequencer and of text and speech models on one small digits
    model: the 8x8 image read as 8 rows of 8, through a bidirectional LSTM (sequence first), a GRU
    (batch first) and a tanh RNN."""

    def __init__(self):
        super().__init__()
        self.lstm = torch.nn.LSTM(8, 6, bidirectional=True)
        self.gru = torch.nn.GRU(12, 6, batch_first=True)
        self.rnn = torch.nn.RNN(6, 5)
        self.head = torch.nn.Linear(5 * 8, 10)

    def forward(self, x):
        rows = x.reshape(x.shape[0], 8, 8)                 # [B, T=8, 8]
        y, _ = self.lstm(rows.transpose(0, 1))             # [T, B, 12]
        y, _ = self.gru(y.transpose(0, 1))                 # [B, T, 6]
        y, _ = self.rnn(y.transpose(0, 1))                 # [T, B, 5]
        return self.head(y.transpose(0, 1).flatten(1))


class PadFoldNet(torch.nn.Module):
    """timm's TResNet blur pool (reflect padding), replicate (edge) padding and VOLO's outlook
    fold (F.fold of overlapping 3x3 blocks at stride 2 with padding 1) on one digits model."""

    def __init__(self):
        super().__init__()
        self.stem = torch.nn.Conv2d(1, 4, 3)
        self.reflect = torch.nn.ReflectionPad2d((1, 2, 1, 0))
        self.edge = torch.nn.ReplicationPad2d(1)
        self.mix = torch.nn.Linear(4 * 9, 4 * 9)
        self.head = torch.nn.Linear(4 * 8 * 8, 10)

    def forward(self, x):
        x = self.stem(self.reflect(x))                     # [B, 4, 7, 8]
        x = self.edge(x)[:, :, :8, :8]                     # [B, 4, 8, 8]
        blocks = torch.nn.functional.unfold(x, 3, padding=1, stride=2)          # [B, 36, 16]
        blocks = self.mix(blocks.transpose(1, 2)).transpose(1, 2)
        x = torch.nn.functional.fold(blocks, (8, 8), 3, padding=1, stride=2)    # overlapping blocks add
        return self.head(x.flatten(1))


def do_skeleton(name, model, args, dynamo, names):
    with tempfile.TemporaryDirectory() as td:
        tmp = os.path.join(td, "full.onnx")
        if dynamo:
            model.eval()
            torch.onnx.export(model, args, tmp, output_names=["logits"])
        else:
            model.train()
            export_ts(model, args, tmp, names)
        m = onnx.load(tmp, load_external_data=True)
    for n in m.graph.node:
        del n.metadata_props[:]
    floats = [i for i in m.graph.initializer if i.data_type == onnx.TensorProto.FLOAT and int(np.prod(i.dims)) > 1]
    params = sum(int(np.prod(i.dims)) for i in floats)
    # Strip the weights only: index grids, masks and scalars keep their values (memc needs them).
    keep = onnx.ModelProto()
    keep.CopyFrom(m)
    del keep.graph.initializer[:]
    keep.graph.initializer.extend(floats)
    strip_initializers(keep)
    stripped = {i.name: i for i in keep.graph.initializer}
    for i in m.graph.initializer:
        if i.name in stripped:
            i.CopyFrom(stripped[i.name])
    p = os.path.join(MODELS, f"{name}.onnx")
    onnx.save_model(m, p)
    summarize(name, p)
    REPORT[name].update({"float_initializer_elements": params,
                         "torch_params": sum(q.numel() for q in model.parameters())})
    print(f"  {name}: {params} float initializer elements, torch {REPORT[name]['torch_params']}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    jobs = collections.OrderedDict([
        ("bigbird_sparse_t215", lambda: do_bigbird("block_sparse", "bigbird_sparse_t215", "text64_test.npz")),
        ("bigbird_full_t215", lambda: do_bigbird("original_full", "bigbird_full_t215", "text_test.npz")),
        ("distilbert_t215", lambda: do_hf_dynamo("distilbert_t215", build_distilbert(), 104)),
        ("distilbert_ts_t215", lambda: do_distilbert_ts("distilbert_ts_t215")),
        ("vit_tiny_dynamo_t215", lambda: do_vit_dynamo("vit_tiny_dynamo_t215", False)),
        ("vit_tiny_dynamo_t215_tied", lambda: do_vit_dynamo("vit_tiny_dynamo_t215_tied", True)),
        ("bert_t215", lambda: do_hf_dynamo("bert_t215", build_bert("bert", 5), 105)),
        ("roberta_t215", lambda: do_hf_dynamo("roberta_t215", build_bert("roberta", 6), 106)),
        ("gpt2_t215", lambda: do_hf_dynamo("gpt2_t215", build_gpt2(7), 107)),
        ("pool_net_t215", lambda: do_digits_net("pool_net_t215", PoolNet, 8, True)),
        ("pool_net_ts_t215", lambda: do_digits_net("pool_net_ts_t215", PoolNet, 8, False)),
        ("bn_net_noopt_t215", lambda: do_bn_net("bn_net_noopt_t215", True)),
        ("bn_net_ts_t215", lambda: do_bn_net("bn_net_ts_t215", False)),
        ("bn_net_train_t215", lambda: do_bn_net_train("bn_net_train_t215", True)),
        ("bn_net_train_ts_t215", lambda: do_bn_net_train("bn_net_train_ts_t215", False)),
        ("moe_net_t215", lambda: do_digits_net("moe_net_t215", MoeNet, 10, True)),
        ("moe_net_ts_t215", lambda: do_digits_net("moe_net_ts_t215", MoeNet, 10, False)),
        ("rnn_net_ts_t215", lambda: do_digits_net("rnn_net_ts_t215", RnnNet, 11, False)),
        ("pad_fold_net_t215", lambda: do_digits_net("pad_fold_net_t215", PadFoldNet, 12, True)),
        ("distilbert_base_t215_skeleton", lambda: do_skeleton(
            "distilbert_base_t215_skeleton",
            Logits(build_distilbert(0, vocab_size=30522, dim=768, n_layers=6, n_heads=12, hidden_dim=3072,
                                    max_position_embeddings=512, initializer_range=0.02)),
            (torch.zeros(16, 512, dtype=torch.int64), torch.ones(16, 512, dtype=torch.int64)), True, None)),
        ("bigbird_base_sparse_t215_skeleton", lambda: do_skeleton(
            "bigbird_base_sparse_t215_skeleton",
            Logits(build_bigbird("block_sparse", 0, vocab_size=50358, hidden_size=768, num_hidden_layers=12,
                                 num_attention_heads=12, intermediate_size=3072, max_position_embeddings=4096,
                                 block_size=64, num_random_blocks=3, initializer_range=0.02)),
            (torch.randint(5, 50358, (2, 4096)), torch.ones(2, 4096, dtype=torch.int64)), False,
            ["input_ids", "attention_mask"])),
    ])
    REPORT["t215_versions"] = versions()
    print(REPORT["t215_versions"])
    for k, fn in jobs.items():
        if args.only and k not in args.only:
            continue
        print(f"== {k}", flush=True)
        try:
            fn()
        except Exception as e:  # recorded, so the README can say what fails
            REPORT.setdefault(k, {})["error"] = repr(e)[:2000]
            print(f"  {k} FAILED: {repr(e)[:1500]}")
    out = os.path.join(MODELS, "export_report.json")
    with open(out) as f:
        old = json.load(f)
    old.update(REPORT)
    with open(out, "w") as f:
        json.dump(old, f, indent=1, default=str)
    print("wrote", out)


if __name__ == "__main__":
    main()
