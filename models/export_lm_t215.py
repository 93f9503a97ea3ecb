#!/usr/bin/env python3
"""Small language models (token-level logits [B, T, V]) with PyTorch references, for memc's
token-level cross-entropy training tests. Same route as export_t215.py's HF models (its
helpers are imported, not copied): tiny configs, fixed seeds, make_unique_, a `Logits`
wrapper (parameter names get an `inner.` prefix), torch.onnx.export with default options
(dynamo, optimize=True) from eval(), batch 4 x seq 32 fixed, rows 0..3 of data/text_test.npz.

    build/python-test-venv/bin/python models/export_lm_t215.py          # ~15 s, CPU only
    build/python-test-venv/bin/python models/export_lm_t215.py --only gpt2_lm_t215

Writes
  data/lm_test.npz          rows 0..63 of text_test (input_ids, attention_mask) and
                            y = the GPT-2 shifted token labels [64, 32] int64 (-100 = ignore)
  models/gpt2_lm_t215.*     HF GPT2LMHeadModel (lm_head tied to wte), use_cache=False
  models/bert_mlm_t215.*    HF BertForMaskedLM (decoder tied to the word embeddings)

Not written: BigBirdForMaskedLM (original_full). Its export folds the token-type lookup
(token_type_embeddings.weight[0], the default all-zero token types) into a batch- and
position-expanded constant `embedding_1` [4, 32, 32], a copy of one parameter row that
write_refs's map cannot name (the reference would need a per-position gradient or memc's
expanded-copy rule); BERT's export keeps that Gather (the optimizer fails to fold its
GatherElements, the "Evaluation failed" line).

Reference files follow write_refs (export_t215.py) except that labels are token-level:
  <input name>         the batch-4 inputs
  labels               int64 [4, 32], -100 = ignored position
  logits               f32 [4, 32, V], PyTorch in train() with every dropout p = 0
  loss                 f32, F.cross_entropy(logits.reshape(-1, V), labels.reshape(-1),
                       ignore_index=-100): the mean over the labelled tokens
  loss_f64             the same forward in float64 (a floor for tolerances)
  grad/<init>          d loss / d initializer as write_refs writes it: transposed for a folded
                       transpose ('T'), rows 0..T-1 for a folded position lookup ('S'), the sum
                       over a deduplicated initializer's parameters; a PyTorch parameter behind
                       several initializers gives each of them the parameter's (whole) gradient
  tied_grad/<init>     instead of grad/ for the folded transpose of a tied parameter that the
                       graph also reads under its own name: memc ties the two back (it reads
                       the parameter's transpose, frontend/param_audit.h), so only the kept
                       initializer trains, and grad/<kept> is the whole tied gradient
  use_grad/<init>      only for initializers holding a tied parameter that the exporter split
                       over several initializers (the tied word embedding: one read by Gather,
                       one folded transpose read by the LM head's MatMul): the gradient through
                       that initializer's own use alone (what the graph computes if the copies
                       train independently); these sum to grad/<init> (transposed as stored)

GPT-2 labels are pre-shifted (the exported model does not shift): labels[:, t] =
input_ids[:, t + 1], -100 at t = 31 and wherever attention_mask[:, t + 1] = 0. MLM labels:
round(15 %) of each row's non-pad positions (at least one), drawn with numpy
default_rng(MLM_SEED), labels = the input id there and -100 elsewhere; the inputs are left
as they are (no [MASK] substitution).
"""
import argparse
import copy
import os
import sys
import warnings

import numpy as np
import onnx
import torch
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_t215 as E  # noqa: E402
import onnx_ref_util as U  # noqa: E402
from export_models import DATA, MODELS, make_unique_, seed_all, set_dropout, text_inputs_fn  # noqa: E402

warnings.filterwarnings("ignore")
IGNORE = -100
MLM_SEED = 2024
INPUT_NAMES = ["input_ids", "attention_mask"]


# --------------------------------------------------------------------------- labels

def causal_lm_labels(ids, mask):
    """Next-token targets aligned with the logits: labels[:, t] = ids[:, t+1]; the last
    position and every position whose target is padding are ignored."""
    ids, mask = np.asarray(ids), np.asarray(mask)
    y = np.full(ids.shape, IGNORE, dtype=np.int64)
    y[:, :-1] = np.where(mask[:, 1:] != 0, ids[:, 1:], IGNORE)
    return y


def mlm_labels(ids, mask, seed=MLM_SEED, frac=0.15):
    ids, mask = np.asarray(ids), np.asarray(mask)
    rng = np.random.default_rng(seed)
    y = np.full(ids.shape, IGNORE, dtype=np.int64)
    for r in range(ids.shape[0]):
        valid = np.flatnonzero(mask[r])
        k = max(1, int(round(frac * len(valid))))
        pos = np.sort(rng.choice(valid, size=k, replace=False))
        y[r, pos] = ids[r, pos]
    return y


def make_lm_data():
    d = np.load(os.path.join(DATA, "text_test.npz"))
    ids, mask = d["input_ids"][:64].astype(np.int64), d["attention_mask"][:64].astype(np.int64)
    y = causal_lm_labels(ids, mask)
    out = os.path.join(DATA, "lm_test.npz")
    np.savez(out, input_ids=ids, attention_mask=mask, y=y)
    print(f"  wrote {out}: input_ids/attention_mask {list(ids.shape)}, y {list(y.shape)} int64, "
          f"{int((y != IGNORE).sum())} labelled tokens")


# --------------------------------------------------------------------------- models

def build_gpt2_lm(seed=7):
    import transformers as T
    seed_all(seed)
    cfg = T.GPT2Config(vocab_size=64, n_positions=72, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.1,
                       embd_pdrop=0.1, attn_pdrop=0.1, initializer_range=0.2, pad_token_id=0, use_cache=False)
    return T.GPT2LMHeadModel(cfg)


def build_bert_mlm(seed=5):
    import transformers as T
    seed_all(seed)
    cfg = T.BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                       intermediate_size=64, max_position_embeddings=72, hidden_dropout_prob=0.1,
                       attention_probs_dropout_prob=0.1, initializer_range=0.2, pad_token_id=0)
    return T.BertForMaskedLM(cfg)


# --------------------------------------------------------------------------- references

def token_forward_loss(model, inputs, labels):
    model.zero_grad(set_to_none=True)
    logits = model(*inputs)
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=IGNORE)
    loss.backward()
    grads = {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
             for n, p in model.named_parameters()}
    return logits.detach(), loss.detach(), grads


def tied_aliases(model):
    """{kept torch name: [other names of the same tensor]} (named_parameters drops the others)."""
    seen, out = {}, {}
    for n, p in model.named_parameters(remove_duplicate=False):
        if id(p) in seen:
            out.setdefault(seen[id(p)], []).append(n)
        else:
            seen[id(p)] = n
    return out


def per_use_grads(model, inputs, labels, kept, alias):
    """The gradients through each use of a tied parameter: a copy with `alias` untied."""
    m = copy.deepcopy(model)
    owner, attr = m.get_submodule(alias.rsplit(".", 1)[0]), alias.rsplit(".", 1)[1]
    setattr(owner, attr, torch.nn.Parameter(m.get_parameter(kept).detach().clone()))
    assert m.get_parameter(alias) is not m.get_parameter(kept)
    _, _, g = token_forward_loss(m, inputs, labels)
    return g[kept], g[alias]


def consumers(m, name):
    return [n.op_type for n in m.graph.node if name in n.input]


def reference_logits(path, feeds):
    """onnxruntime where installed, else onnx's reference evaluator."""
    try:
        return U.ort_logits(path, feeds), "onnxruntime"
    except ImportError:
        from onnx.reference import ReferenceEvaluator
        from onnx.reference.op_run import OpRun

        class GatherElements(OpRun):   # onnx 1.23's falls over past 64 columns (np.choose's limit)
            def _run(self, data, indices, axis=None):
                return (np.take_along_axis(data, np.where(indices < 0, indices + data.shape[axis], indices),
                                           axis=axis),)

        m = onnx.load(path, load_external_data=True)
        sess = ReferenceEvaluator(m, new_ops=[GatherElements])
        names = [i.name for i in m.graph.input]
        return sess.run(None, {k: feeds[k] for k in names})[0], "onnx.reference"


def write_lm_refs(name, path, model, inputs4, labels4, dropout_nodes=False):
    m = onnx.load(path, load_external_data=True)
    mapping, non_param, unmatched = E.match(m, model)
    set_dropout(model, 0.0)
    model.train()
    logits, loss, grads = token_forward_loss(model, inputs4, labels4)
    for n in unmatched:
        assert float(grads[n].abs().max()) == 0.0, f"{name}: {n} has a gradient but no initializer"
    init_shape = {i.name: tuple(i.dims) for i in m.graph.initializer}
    for init, hits in mapping.items():
        for p, t in hits:
            if t == "S":
                assert float(grads[p][init_shape[init][1]:].abs().max()) == 0.0, (name, p)
    ref = {k: v.numpy() for k, v in zip(INPUT_NAMES, inputs4)}
    ref["labels"] = labels4.numpy()
    ref["logits"] = logits.numpy().astype(np.float32)
    ref["loss"] = np.array(float(loss), dtype=np.float32)
    m64 = copy.deepcopy(model).double()
    with torch.no_grad():
        z64 = m64(*inputs4)
        ref["loss_f64"] = np.array(float(F.cross_entropy(z64.reshape(-1, z64.shape[-1]), labels4.reshape(-1),
                                                          ignore_index=IGNORE)), dtype=np.float64)
    for init, hits in mapping.items():   # write_refs's mapping, verbatim in effect
        acc = None
        for pname, tr in hits:
            g = grads[pname]
            g = g.t() if tr == "T" else g
            if tr in ("S", "R"):
                shape = init_shape[init]
                g = (g[:shape[1]] if tr == "S" else g).reshape(shape)
            acc = g.clone() if acc is None else acc + g
        ref["grad/" + init] = acc.numpy().astype(np.float32)
        if len(hits) > 1:
            for pname, tr in hits:
                g = grads[pname]
                ref["untied_grad/" + pname] = (g.t() if tr == "T" else g).numpy().astype(np.float32)
    # A tied parameter the exporter split over several initializers (one per use).
    aliases = tied_aliases(model)
    split = {}
    for init, hits in mapping.items():
        for pname, tr in hits:
            if pname in aliases:
                split.setdefault(pname, []).append((init, tr))
    tied_report = {}
    for pname, inits in split.items():
        tied_report[pname] = {"aliases": aliases[pname], "initializers": [f"{i} ({t}; read by {consumers(m, i)})"
                                                                          for i, t in inits]}
        if len(inits) < 2:
            continue
        assert len(aliases[pname]) == 1 and len(inits) == 2, (name, pname, aliases[pname], inits)
        g_kept, g_alias = per_use_grads(model, inputs4, labels4, pname, aliases[pname][0])
        assert torch.allclose(g_kept + g_alias, grads[pname], rtol=1e-4, atol=1e-6), name
        # the kept name is the input embedding (Gather), the alias the output projection
        for init, tr in inits:
            ops = consumers(m, init)
            g = g_kept if ops == ["Gather"] else g_alias
            assert ops == ["Gather"] or "Gather" not in ops, (name, init, ops)
            ref["use_grad/" + init] = (g.t() if tr == "T" else g).numpy().astype(np.float32)
            if tr == "T":   # memc trains the folded transpose as the kept initializer's transpose: one tensor
                ref["tied_grad/" + init] = ref.pop("grad/" + init)
    np.savez(os.path.join(MODELS, f"{name}.ref.npz"), **ref)
    got, how = reference_logits(path, {k: ref[k] for k in INPUT_NAMES})
    diff = U.rel_diff(got, ref["logits"])
    with torch.no_grad():
        model.eval()
        eval_diff = U.rel_diff(model(*inputs4).numpy(), ref["logits"])
        model.train()
    n_grad = sum(k.startswith("grad/") for k in ref)
    print(f"  {name}: {how} vs torch logits {diff:.2e} (eval vs train-p0 {eval_diff:.1e}), loss {float(loss):.6f} "
          f"(f64 {float(ref['loss_f64']):.8f}), labelled tokens {int((labels4 != IGNORE).sum())}, "
          f"{n_grad} grad/, {sum(k.startswith('use_grad/') for k in ref)} use_grad/, "
          f"{sum(k.startswith('untied_grad/') for k in ref)} untied_grad/")
    print(f"    transposed {sorted(k for k, h in mapping.items() if h[0][1] == 'T')}")
    print(f"    folded lookups {sorted(k for k, h in mapping.items() if h[0][1] == 'S')}")
    print(f"    deduplicated (one init, several params) {({k: [p for p, _ in h] for k, h in mapping.items() if len(h) > 1})}")
    print(f"    tied torch params {tied_report}")
    print(f"    non-param initializers {len(non_param)}, torch params without initializer {unmatched}")
    # A TRAINING-mode export keeps its Dropout nodes (p = 0.1), which onnx.reference applies:
    # memc's own inference (tests/models_test.cc) checks those logits instead.
    assert dropout_nodes or diff <= 1e-5, (name, diff)
    assert eval_diff <= 1e-6, (name, eval_diff)


def prepared(name, model, seed, labels_fn):
    """The perturbed model wrapped to return its logits, the batch-4 inputs, their labels and
    the file to write."""
    make_unique_(model, seed=seed)
    inputs, _ = text_inputs_fn("text_test.npz")(0, 4)
    labels = torch.from_numpy(labels_fn(inputs[0].numpy(), inputs[1].numpy()))
    return E.Logits(model), inputs, labels, os.path.join(MODELS, f"{name}.onnx")


def do_lm(name, model, seed, labels_fn):
    wrapped, inputs, labels, p = prepared(name, model, seed, labels_fn)
    wrapped.eval()
    E.export_dynamo_default(wrapped, inputs, p)
    om = E.summarize(name, p)
    print(f"    inputs {E.REPORT[name]['inputs']}, outputs "
          f"{[(o.name, [d.dim_value for d in o.type.tensor_type.shape.dim]) for o in om.graph.output]}")
    write_lm_refs(name, p, wrapped, inputs, labels)


def do_lm_ts(name, model, seed, labels_fn):
    """The TorchScript exporter in TRAINING mode with a dynamic batch: the tied embedding stays one
    initializer (Gather, and a Transpose node for the LM head), and memc can compile it at any
    batch (micro-batches, ranks with uneven slices: tests/cli/shard.sh)."""
    wrapped, inputs, labels, p = prepared(name, model, seed, labels_fn)
    wrapped.train()
    batch = {0: "batch"}
    torch.onnx.export(wrapped, inputs, p, input_names=INPUT_NAMES, output_names=["logits"], opset_version=17,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False, dynamo=False,
                      dynamic_axes={"input_ids": batch, "attention_mask": batch, "logits": batch})
    E.summarize(name, p)
    write_lm_refs(name, p, wrapped, inputs, labels, dropout_nodes=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", nargs="*", default=None)
    args = ap.parse_args()
    import transformers
    import onnxscript
    print({"torch": torch.__version__, "transformers": transformers.__version__, "onnx": onnx.__version__,
           "onnxscript": onnxscript.__version__, "numpy": np.__version__})
    jobs = {
        "lm_test": make_lm_data,
        "gpt2_lm_t215": lambda: do_lm("gpt2_lm_t215", build_gpt2_lm(), 107, causal_lm_labels),
        "bert_mlm_t215": lambda: do_lm("bert_mlm_t215", build_bert_mlm(), 105, mlm_labels),
        "gpt2_lm_ts_t215": lambda: do_lm_ts("gpt2_lm_ts_t215", build_gpt2_lm(), 107, causal_lm_labels),
    }
    for k, fn in jobs.items():
        if args.only and k not in args.only:
            continue
        print(f"== {k}", flush=True)
        fn()


if __name__ == "__main__":
    main()
