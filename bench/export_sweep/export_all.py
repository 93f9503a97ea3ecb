#!/usr/bin/env python3
"""Sweep exporter: tiny random HF models exported with today's torch / transformers / onnx.

    build/python-test-venv/bin/python bench/export_sweep/export_all.py [--only NAME ...] [--exporters dynamo ts]

For every model and exporter writes into $SWEEP_OUT (default ./export_sweep_out/):
  <model>_<exp>.onnx       the export (eval() mode; dynamo: torch.onnx.export defaults + dynamic_shapes;
                           ts: dynamo=False, opset 17, dynamic_axes, other options default)
  <model>_<exp>.data.npz   the one batch (4 rows): graph inputs by name + y
  <model>_<exp>.ref.npz    PyTorch (eval mode, fp32) loss, logits, grad/<initializer> for every
                           initializer matched by value to a parameter (identity or transpose)
  <model>_<exp>.meta.json  status, error, dynamic axes used, initializer->param map, float
                           non-parameter initializers (passed to memc compile --freeze)
Conventions mirror models/export_t215.py: fixed seeds, make_unique_ (so the
value-based map is unambiguous and the dynamo optimizer does not merge weights),
padding_idx cleared, a Logits wrapper returning the logits tensor, output name 'logits'.
"""
import argparse
import json
import os
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

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "models"))
import onnx_ref_util as U  # noqa: E402

warnings.filterwarnings("ignore")
torch.set_num_threads(1)
OUT = os.environ.get("SWEEP_OUT", os.path.abspath("export_sweep_out"))
B, T, IMG = 4, 16, 32
VOCAB = 100


def seed_all(s):
    torch.manual_seed(s)
    np.random.seed(s)


def make_unique_(model, seed, scale=0.05):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.numel() == 1 or bool((p == p.reshape(-1)[0]).all()):
                p.add_(torch.randn(p.shape, generator=g) * scale)
    for m in model.modules():
        if isinstance(m, nn.Embedding):
            m.padding_idx = None


class TextLogits(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, input_ids, attention_mask):
        return self.inner(input_ids=input_ids, attention_mask=attention_mask, return_dict=False)[0]


class ImageLogits(nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, pixel_values):
        return self.inner(pixel_values=pixel_values, return_dict=False)[0]


# ----------------------------------------------------------------------------- configs
# The tiny dims every round shares (models_round3.py, models_round4.py): BERT-style encoders
# and Llama-style decoders.
ENCODER = dict(vocab_size=VOCAB, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
               intermediate_size=64, max_position_embeddings=64, hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0, initializer_range=0.2, num_labels=2)
DECODER = dict(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
               num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=64,
               initializer_range=0.2, num_labels=2, pad_token_id=0, bos_token_id=1, eos_token_id=2)


def text_models():
    import transformers as X
    common, dec = ENCODER, DECODER
    return {
        "bert": lambda: X.BertForSequenceClassification(X.BertConfig(pad_token_id=0, **common)),
        "roberta": lambda: X.RobertaForSequenceClassification(X.RobertaConfig(pad_token_id=1, **common)),
        "xlm_roberta": lambda: X.XLMRobertaForSequenceClassification(X.XLMRobertaConfig(pad_token_id=1, **common)),
        "distilbert": lambda: X.DistilBertForSequenceClassification(X.DistilBertConfig(
            vocab_size=VOCAB, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64,
            dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0, initializer_range=0.2,
            num_labels=2, pad_token_id=0)),
        "albert": lambda: X.AlbertForSequenceClassification(X.AlbertConfig(
            embedding_size=16, classifier_dropout_prob=0.0, pad_token_id=0, **common)),
        "electra": lambda: X.ElectraForSequenceClassification(X.ElectraConfig(
            embedding_size=16, pad_token_id=0, **common)),
        "deberta_v2": lambda: X.DebertaV2ForSequenceClassification(X.DebertaV2Config(
            relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=16,
            max_relative_positions=-1, norm_rel_ebd="layer_norm", share_att_key=True,
            position_biased_input=False, pad_token_id=0, pooler_dropout=0.0, **common)),
        "mpnet": lambda: X.MPNetForSequenceClassification(X.MPNetConfig(pad_token_id=1, **common)),
        "bigbird_full": lambda: X.BigBirdForSequenceClassification(X.BigBirdConfig(
            attention_type="original_full", block_size=2, num_random_blocks=1, pad_token_id=0, **common)),
        "bigbird_sparse": lambda: X.BigBirdForSequenceClassification(X.BigBirdConfig(
            attention_type="block_sparse", block_size=2, num_random_blocks=1, pad_token_id=0, **common)),
        "gpt2": lambda: X.GPT2ForSequenceClassification(X.GPT2Config(
            vocab_size=VOCAB, n_positions=64, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0,
            embd_pdrop=0.0, attn_pdrop=0.0, initializer_range=0.2, num_labels=2, pad_token_id=0)),
        "llama": lambda: X.LlamaForSequenceClassification(X.LlamaConfig(**dec)),
        "qwen2": lambda: X.Qwen2ForSequenceClassification(X.Qwen2Config(**dec)),
        "mistral": lambda: X.MistralForSequenceClassification(X.MistralConfig(**dec)),
        # the second round (journal §46)
        "phi3": lambda: X.Phi3ForSequenceClassification(X.Phi3Config(**dec)),
        "gemma": lambda: X.GemmaForSequenceClassification(X.GemmaConfig(head_dim=16, **dec)),
        "qwen3": lambda: X.Qwen3ForSequenceClassification(X.Qwen3Config(head_dim=16, **dec)),
        "modernbert": lambda: X.ModernBertForSequenceClassification(X.ModernBertConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=64, pad_token_id=0, num_labels=2, initializer_range=0.2)),
        "opt": lambda: X.OPTForSequenceClassification(X.OPTConfig(
            vocab_size=VOCAB, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=64, word_embed_proj_dim=32, pad_token_id=0, num_labels=2, dropout=0.0,
            attention_dropout=0.0)),
    }


def image_models():
    import transformers as X
    vit = dict(image_size=IMG, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
               num_attention_heads=2, intermediate_size=64, hidden_dropout_prob=0.0,
               attention_probs_dropout_prob=0.0, num_labels=10, initializer_range=0.2)
    return {
        "vit": lambda: X.ViTForImageClassification(X.ViTConfig(**vit)),
        "deit": lambda: X.DeiTForImageClassification(X.DeiTConfig(**vit)),
        "beit": lambda: X.BeitForImageClassification(X.BeitConfig(
            use_relative_position_bias=True, drop_path_rate=0.0, **vit)),
        "swin": lambda: X.SwinForImageClassification(X.SwinConfig(
            image_size=IMG, patch_size=4, num_channels=3, embed_dim=16, depths=[2, 2], num_heads=[2, 2],
            window_size=4, mlp_ratio=2.0, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            drop_path_rate=0.0, num_labels=10, initializer_range=0.2)),
        "convnext": lambda: X.ConvNextForImageClassification(X.ConvNextConfig(
            num_channels=3, patch_size=4, num_stages=2, hidden_sizes=[16, 32], depths=[1, 1], image_size=IMG,
            drop_path_rate=0.0, num_labels=10, initializer_range=0.2)),
        "mobilevit": lambda: X.MobileViTForImageClassification(X.MobileViTConfig(
            image_size=IMG, patch_size=2, num_channels=3, hidden_sizes=[16, 24, 32],
            neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_attention_heads=2, mlp_ratio=2.0,
            hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0, classifier_dropout_prob=0.0,
            num_labels=10, initializer_range=0.2)),
        "dinov2": lambda: X.Dinov2ForImageClassification(X.Dinov2Config(
            image_size=IMG, patch_size=8, num_channels=3, hidden_size=32, num_hidden_layers=2,
            num_attention_heads=2, mlp_ratio=2, hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0,
            drop_path_rate=0.0, num_labels=10, initializer_range=0.2)),
    }


def text_batch(pad_id, seed, b=B, t=T, lens=(T, 13, 11, 15)):
    rng = np.random.default_rng(seed)
    ids = rng.integers(3, VOCAB, size=(b, t)).astype(np.int64)
    mask = np.ones((b, t), np.int64)
    for i, L in enumerate(lens):
        ids[i, L:] = pad_id
        mask[i, L:] = 0
    y = np.array([0, 1, 1, 0][:b], np.int64)
    return {"input_ids": ids, "attention_mask": mask}, y


def image_batch(seed, b=B):
    rng = np.random.default_rng(seed)
    return {"pixel_values": rng.standard_normal((b, 3, IMG, IMG)).astype(np.float32)}, np.array([3, 1, 7, 0][:b], np.int64)


# ----------------------------------------------------------------------------- export
def export_dynamo(model, args, names, path, dyn_dims, optimize=True):
    """dyn_dims: {input_name: {axis: Dim}} or None for static."""
    with tempfile.TemporaryDirectory() as td:
        tmp = os.path.join(td, "m.onnx")
        kw = {} if optimize else {"optimize": False}
        if dyn_dims is not None:
            kw["dynamic_shapes"] = dyn_dims
        torch.onnx.export(model, args, tmp, input_names=names, output_names=["logits"], dynamo=True, **kw)
        m = onnx.load(tmp, load_external_data=True)
    U.keep_scope_metadata(m)
    onnx.save_model(m, path)


def first_export(tries, export, meta, errors):
    """Exports with the first of `tries` ([(label, dynamic dims)]) that works; meta["dynamic"]
    names it, and each failure is kept in `errors` and meta["export_error_full"]."""
    for label, dd in tries:
        try:
            export(dd)
            meta["dynamic"] = label
            return
        except Exception as e:
            errors.append(f"{label}: {type(e).__name__}: {str(e).splitlines()[0][:400] if str(e) else ''}")
            meta.setdefault("export_error_full", {})[label] = (str(e)[:6000], traceback.format_exc()[-3000:])


def export_ts(model, args, names, path, dyn_axes, fold=True):
    kw = {"do_constant_folding": fold}
    if dyn_axes is not None:
        kw["dynamic_axes"] = dyn_axes
    torch.onnx.export(model, args, path, input_names=names, output_names=["logits"], opset_version=17,
                      dynamo=False, **kw)


def match(m, model):
    params = {n: p.detach().cpu().numpy() for n, p in model.named_parameters()}
    mapping, non_param_float = {}, []
    for init in m.graph.initializer:
        a = numpy_helper.to_array(init)
        hits = []
        if a.dtype == np.float32:
            for n, p in params.items():
                if a.shape == p.shape and np.array_equal(a, p):
                    hits.append((n, "id"))
                elif a.ndim == 2 and a.shape == p.shape[::-1] and np.array_equal(a, p.T) and not np.array_equal(a, p):
                    hits.append((n, "T"))
                elif a.size == p.size and a.size > 1 and a.shape != p.shape and np.array_equal(a.reshape(-1), p.reshape(-1)):
                    hits.append((n, "R"))  # reshaped copy (e.g. layer-scale [C] -> [C,1,1])
                elif 8 <= a.size < p.size and p.dtype == np.float32:
                    flat, af = p.reshape(-1), a.reshape(-1)
                    for off in np.nonzero(flat[:p.size - a.size + 1] == af[0])[0]:
                        if np.array_equal(flat[off:off + a.size], af):
                            hits.append((n, f"S{off}"))  # a contiguous slice (folded position table)
                            break
        if hits:
            mapping[init.name] = hits
        elif a.dtype.kind == "f":
            non_param_float.append((init.name, list(a.shape)))
    used = {n for hs in mapping.values() for n, _ in hs}
    return mapping, non_param_float, [n for n in params if n not in used]


def initializer_grads(m, mapping, grads):
    """Each initializer's gradient from PyTorch's parameter gradients `grads`, by match()'s
    mapping: a transposed (T), reshaped (R) or sliced (S<offset>) parameter, summed where several
    parameters feed one initializer."""
    shapes = {i.name: numpy_helper.to_array(i).shape for i in m.graph.initializer}
    out = {}
    for init, hits in mapping.items():
        shape = shapes[init]
        acc = None
        for pname, tr in hits:
            g = grads[pname]
            if tr.startswith("S"):
                off = int(tr[1:])
                g = g.reshape(-1)[off:off + int(np.prod(shape))].reshape(shape)
            else:
                g = g.t() if tr == "T" else (g.reshape(shape) if tr == "R" else g)
            acc = g.clone() if acc is None else acc + g
        out[init] = acc.numpy()
    return out


def torch_ref(model, feeds, y, names):
    model.eval()
    model.zero_grad(set_to_none=True)
    args = tuple(torch.from_numpy(feeds[n]) for n in names)
    logits = model(*args)
    loss = F.cross_entropy(logits, torch.from_numpy(y))
    loss.backward()
    grads = {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
             for n, p in model.named_parameters()}
    return logits.detach().numpy(), float(loss), grads


def ts_tries(kind):
    """TorchScript's dynamic axes to try, the widest first."""
    if kind == "text":
        return [("batch+seq", {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
                               "logits": {0: "batch"}}), ("static", None)]
    return [("batch", {"pixel_values": {0: "batch"}, "logits": {0: "batch"}}), ("static", None)]


def do_one(name, ctor, kind, exporter, seed):
    base = os.path.join(OUT, f"{name}_{exporter}")
    meta = {"model": name, "exporter": exporter, "kind": kind}
    seed_all(seed)
    inner = ctor()
    make_unique_(inner, seed + 1000)
    inner.eval()
    if kind == "text":
        model = TextLogits(inner)
        pad = inner.config.pad_token_id
        feeds, y = text_batch(pad, seed)
        names = ["input_ids", "attention_mask"]
    else:
        model = ImageLogits(inner)
        feeds, y = image_batch(seed)
        names = ["pixel_values"]
    model.eval()
    meta["attn_implementation"] = getattr(inner.config, "_attn_implementation", None)
    args = tuple(torch.from_numpy(feeds[n]) for n in names)
    path = base + ".onnx"
    errors = []
    t0 = time.time()
    if exporter.startswith("dynamo"):
        Dim = torch.export.Dim
        if kind == "text":
            b, s = Dim("batch", min=1, max=1024), Dim("seq", min=2, max=64)
            tries = [("batch+seq", {n: {0: b, 1: s} for n in names}),
                     ("batch", {n: {0: b} for n in names}), ("static", None)]
        else:
            b = Dim("batch", min=1, max=1024)
            tries = [("batch", {n: {0: b} for n in names}), ("static", None)]
        first_export(tries, lambda dd: export_dynamo(model, args, names, path, dd, optimize=(exporter == "dynamo")), meta, errors)
    else:
        first_export(ts_tries(kind), lambda dd: export_ts(model, args, names, path, dd, fold=(exporter == "ts")), meta, errors)
    meta["export_seconds"] = round(time.time() - t0, 1)
    meta["export_errors"] = errors
    if "dynamic" not in meta:
        meta["status"] = "export_failed"
        if os.path.exists(path):
            os.remove(path)
        return meta
    m = onnx.load(path)
    meta["opset"] = {o.domain or "ai.onnx": o.version for o in m.opset_import}
    meta["inputs"] = [(i.name, [d.dim_param or d.dim_value for d in i.type.tensor_type.shape.dim]) for i in m.graph.input]
    hist = {}
    for n in m.graph.node:
        hist[n.op_type] = hist.get(n.op_type, 0) + 1
    meta["onnx_ops"] = dict(sorted(hist.items(), key=lambda kv: -kv[1]))
    mapping, non_param_float, unmatched = match(m, model)
    logits, loss, grads = torch_ref(model, feeds, y, names)
    # ORT check of the export against torch (logits)
    try:
        import onnxruntime as ort
        sess = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        feed = {i.name: feeds[i.name] for i in sess.get_inputs()}
        o = sess.run(None, feed)[0]
        meta["ort_vs_torch"] = float(np.abs(o - logits).max() / max(np.abs(logits).max(), 1e-12))
    except Exception as e:
        meta["ort_vs_torch"] = f"ort unavailable/failed: {type(e).__name__}: {str(e)[:200]}"
    ref = {"labels": y, "logits": logits.astype(np.float32), "loss": np.array(loss, np.float32)}
    for init, g in initializer_grads(m, mapping, grads).items():
        ref["grad/" + init] = g.astype(np.float32)
    # a second shape (batch 3, seq 12) for the dynamic axes
    if kind == "text":
        feeds2, y2 = text_batch(pad, seed + 500, b=3, t=12, lens=(12, 9, 7))
    else:
        feeds2, y2 = image_batch(seed + 500, b=3)
    with torch.no_grad():
        ref["logits2"] = model(*[torch.from_numpy(feeds2[n]) for n in names]).numpy().astype(np.float32)
    np.savez(base + ".data2.npz", y=y2, **feeds2)
    bufs = {n: b.detach().numpy() for n, b in model.named_buffers() if b.is_floating_point()}
    meta["buffer_initializers"] = [i.name for i in m.graph.initializer
                                   if any(numpy_helper.to_array(i).shape == v.shape and np.array_equal(numpy_helper.to_array(i), v)
                                          for v in bufs.values())]
    np.savez(base + ".ref.npz", **ref)
    np.savez(base + ".data.npz", y=y, **feeds)
    meta["map"] = {k: [f"{p}{'^T' if t == 'T' else ('(reshaped)' if t == 'R' else '')}" for p, t in h] for k, h in mapping.items()}
    meta["shared_initializers"] = {k: [p for p, _ in h] for k, h in mapping.items() if len(h) > 1}
    meta["non_param_float_initializers"] = non_param_float
    meta["unmatched_params_with_grad"] = [n for n in unmatched if float(grads[n].abs().max()) > 0]
    meta["unmatched_params_zero_grad"] = [n for n in unmatched if float(grads[n].abs().max()) == 0]
    meta["torch_loss"] = loss
    meta["status"] = "exported"
    meta["bytes"] = os.path.getsize(path)
    return meta


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*")
    ap.add_argument("--exporters", nargs="*", default=["dynamo", "ts", "dynamo_noopt", "ts_nofold"])
    a = ap.parse_args()
    os.makedirs(OUT, exist_ok=True)
    jobs = [(n, c, "text") for n, c in text_models().items()] + [(n, c, "image") for n, c in image_models().items()]
    import transformers
    print("versions", torch.__version__, transformers.__version__, onnx.__version__, flush=True)
    for i, (name, ctor, kind) in enumerate(jobs):
        if a.only and name not in a.only:
            continue
        for exp in a.exporters:
            t0 = time.time()
            try:
                meta = do_one(name, ctor, kind, exp, seed=10 + i)
            except Exception as e:
                meta = {"model": name, "exporter": exp, "status": "script_error",
                        "error": f"{type(e).__name__}: {str(e)[:500]}", "trace": traceback.format_exc()[-2000:]}
            with open(os.path.join(OUT, f"{name}_{exp}.meta.json"), "w") as f:
                json.dump(meta, f, indent=1, default=str)
            print(f"{name:15s} {exp:6s} {meta['status']:14s} dyn={meta.get('dynamic')} "
                  f"ort={meta.get('ort_vs_torch')} unmatched={meta.get('unmatched_params_with_grad')} "
                  f"nonparam={[n for n, _ in meta.get('non_param_float_initializers', [])][:4]} "
                  f"errs={meta.get('export_errors') or meta.get('error')} {time.time() - t0:.0f}s", flush=True)


if __name__ == "__main__":
    main()
