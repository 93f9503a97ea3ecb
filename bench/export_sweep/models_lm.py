"""Language-model heads (token-level logits [N, T, C]) of today's transformers, as tiny random configs,
patched into export_all.py: causal LMs, masked LMs and token classification.

    SWEEP_OUT=/tmp/lm_sweep build/python-test-venv/bin/python bench/export_sweep/models_lm.py \
        [--only NAME ...] [--exporters dynamo dynamo_noopt ts_train]
    SWEEP_OUT=/tmp/lm_sweep MEMC=$PWD/build/memc build/python-test-venv/bin/python bench/export_sweep/run_sweep.py
    SWEEP_OUT=/tmp/lm_sweep build/python-test-venv/bin/python bench/export_sweep/models_lm.py --table

What differs from export_all.py (everything else is its code: seeds, make_unique_, the value-based
initializer -> parameter map, the .npz files run_sweep.py reads):
  - y is a label per position, int64 [N, T], -100 = ignored:
      causal  y[:, t] = input_ids[:, t + 1], -100 at the last position and where the target is padding
      mlm     round(15 %) of each row's non-pad positions (at least one) = the input id there, else -100
              (inputs left as they are, no [MASK] substitution)
      tok     a class in [0, 5) per position, -100 on padding
  - the reference loss is F.cross_entropy(logits.reshape(-1, C), y.reshape(-1), ignore_index=-100)
    (model in eval(), every nn.Dropout p = 0, use_cache=False).
  - exporters: dynamo (torch.onnx.export defaults), dynamo_noopt (optimize=False, what memc's Python
    package makes) and ts_train (dynamo=False, opset 17, do_constant_folding=False,
    training=TrainingMode.TRAINING).
A tied embedding (lm_head = the input embedding) maps two initializers to one parameter when the
exporter folds the head's transpose; each gets the whole tied gradient in ref.npz. memc ties the copy
back and trains one tensor, so the copy is absent from its --dump-grads (listed as "tied copy" by
--table, not as a failure); the kept one compares against the whole gradient.
"""
import json
import glob
import os
import sys

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import export_all as E  # noqa: E402

V = E.VOCAB
IGNORE = -100
NUM_TOK_LABELS = 5
_MODE = {"label": None, "exporter": None}


def _lm_models():
    import transformers as X
    common, dec = E.ENCODER, E.DECODER
    dec = dict(dec, use_cache=False)
    enc = dict(common)
    tokc = dict(common, num_labels=NUM_TOK_LABELS)
    gpt2 = dict(vocab_size=V, n_positions=64, n_embd=32, n_layer=2, n_head=2, resid_pdrop=0.0, embd_pdrop=0.0,
                attn_pdrop=0.0, initializer_range=0.2, pad_token_id=0, use_cache=False)
    distil = dict(vocab_size=V, dim=32, n_layers=2, n_heads=2, hidden_dim=64, max_position_embeddings=64,
                  dropout=0.0, attention_dropout=0.0, seq_classif_dropout=0.0, initializer_range=0.2, pad_token_id=0)
    return {
        # ---- causal LMs
        "gpt2_lm": ("causal", lambda: X.GPT2LMHeadModel(X.GPT2Config(**gpt2))),
        "llama_lm": ("causal", lambda: X.LlamaForCausalLM(X.LlamaConfig(**dec))),
        "llama_tied_lm": ("causal", lambda: X.LlamaForCausalLM(X.LlamaConfig(tie_word_embeddings=True, **dec))),
        "qwen2_lm": ("causal", lambda: X.Qwen2ForCausalLM(X.Qwen2Config(**dec))),
        "qwen3_lm": ("causal", lambda: X.Qwen3ForCausalLM(X.Qwen3Config(head_dim=16, **dec))),
        "mistral_lm": ("causal", lambda: X.MistralForCausalLM(X.MistralConfig(**dec))),
        "phi3_lm": ("causal", lambda: X.Phi3ForCausalLM(X.Phi3Config(**dec))),
        "gemma_lm": ("causal", lambda: X.GemmaForCausalLM(X.GemmaConfig(head_dim=16, **dec))),
        "opt_lm": ("causal", lambda: X.OPTForCausalLM(X.OPTConfig(
            vocab_size=V, hidden_size=32, ffn_dim=64, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=64, word_embed_proj_dim=32, pad_token_id=0, dropout=0.0,
            attention_dropout=0.0, use_cache=False))),
        "gpt_neo_lm": ("causal", lambda: X.GPTNeoForCausalLM(X.GPTNeoConfig(
            vocab_size=V, max_position_embeddings=64, hidden_size=32, num_layers=2, num_heads=2,
            attention_types=[[["global", "local"], 1]], window_size=8, intermediate_size=64,
            embed_dropout=0.0, attention_dropout=0.0, resid_dropout=0.0, initializer_range=0.2,
            pad_token_id=0, bos_token_id=1, eos_token_id=2, use_cache=False))),
        "bloom_lm": ("causal", lambda: X.BloomForCausalLM(X.BloomConfig(
            vocab_size=V, hidden_size=32, n_layer=2, n_head=2, hidden_dropout=0.0, attention_dropout=0.0,
            initializer_range=0.2, pad_token_id=0, bos_token_id=1, eos_token_id=2, use_cache=False))),
        "falcon_lm": ("causal", lambda: X.FalconForCausalLM(X.FalconConfig(
            vocab_size=V, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, hidden_dropout=0.0,
            attention_dropout=0.0, initializer_range=0.2, pad_token_id=0, bos_token_id=1,
            eos_token_id=2, max_position_embeddings=64, use_cache=False))),
        "stablelm_lm": ("causal", lambda: X.StableLmForCausalLM(X.StableLmConfig(**dec))),
        "olmo_lm": ("causal", lambda: X.OlmoForCausalLM(X.OlmoConfig(**dec))),
        # ---- masked LMs
        "bert_mlm": ("mlm", lambda: X.BertForMaskedLM(X.BertConfig(pad_token_id=0, **enc))),
        "roberta_mlm": ("mlm", lambda: X.RobertaForMaskedLM(X.RobertaConfig(pad_token_id=1, **enc))),
        "distilbert_mlm": ("mlm", lambda: X.DistilBertForMaskedLM(X.DistilBertConfig(**distil))),
        "albert_mlm": ("mlm", lambda: X.AlbertForMaskedLM(X.AlbertConfig(
            embedding_size=16, classifier_dropout_prob=0.0, pad_token_id=0, **enc))),
        "electra_mlm": ("mlm", lambda: X.ElectraForMaskedLM(X.ElectraConfig(
            embedding_size=16, pad_token_id=0, **enc))),
        "deberta_v2_mlm": ("mlm", lambda: X.DebertaV2ForMaskedLM(X.DebertaV2Config(
            relative_attention=True, pos_att_type=["p2c", "c2p"], position_buckets=16,
            max_relative_positions=-1, norm_rel_ebd="layer_norm", share_att_key=True,
            position_biased_input=False, pad_token_id=0, **enc))),
        "modernbert_mlm": ("mlm", lambda: X.ModernBertForMaskedLM(X.ModernBertConfig(
            vocab_size=V, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
            max_position_embeddings=64, pad_token_id=0, initializer_range=0.2))),
        "bigbird_full_mlm": ("mlm", lambda: X.BigBirdForMaskedLM(X.BigBirdConfig(
            attention_type="original_full", block_size=2, num_random_blocks=1, pad_token_id=0, **enc))),
        # ---- token classification
        "bert_tok": ("tok", lambda: X.BertForTokenClassification(X.BertConfig(pad_token_id=0, **tokc))),
        "roberta_tok": ("tok", lambda: X.RobertaForTokenClassification(X.RobertaConfig(pad_token_id=1, **tokc))),
        "distilbert_tok": ("tok", lambda: X.DistilBertForTokenClassification(X.DistilBertConfig(
            num_labels=NUM_TOK_LABELS, **distil))),
    }


LABEL_KIND = {}


def text_models():
    out = {}
    for name, (kind, ctor) in _lm_models().items():
        LABEL_KIND[name] = kind

        def build(ctor=ctor):
            m = ctor()
            m.config.use_cache = False
            for mod in m.modules():  # any dropout a config leaves on (classifier heads, hard-coded p)
                if isinstance(mod, nn.modules.dropout._DropoutNd):
                    mod.p = 0.0
            return m
        out[name] = build
    return out


def image_models():
    return {}


# ----------------------------------------------------------------------------- token labels
def token_labels(ids, mask, kind, seed):
    y = np.full(ids.shape, IGNORE, dtype=np.int64)
    if kind == "causal":
        y[:, :-1] = np.where(mask[:, 1:] != 0, ids[:, 1:], IGNORE)
    elif kind == "mlm":
        rng = np.random.default_rng(seed + 7)
        for r in range(ids.shape[0]):
            valid = np.flatnonzero(mask[r])
            k = max(1, int(round(0.15 * len(valid))))
            pos = np.sort(rng.choice(valid, size=k, replace=False))
            y[r, pos] = ids[r, pos]
    elif kind == "tok":
        rng = np.random.default_rng(seed + 11)
        y = np.where(mask != 0, rng.integers(0, NUM_TOK_LABELS, size=ids.shape), IGNORE).astype(np.int64)
    else:
        raise ValueError(kind)
    return y


_orig_text_batch = E.text_batch


def text_batch(pad_id, seed, **kw):
    feeds, _ = _orig_text_batch(pad_id, seed, **kw)
    return feeds, token_labels(feeds["input_ids"], feeds["attention_mask"], _MODE["label"], seed)


def torch_ref(model, feeds, y, names):
    model.eval()
    model.zero_grad(set_to_none=True)
    args = tuple(torch.from_numpy(feeds[n]) for n in names)
    logits = model(*args)
    assert logits.dim() == 3, f"logits {tuple(logits.shape)}: not token-level"
    loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), torch.from_numpy(y).reshape(-1), ignore_index=IGNORE)
    loss.backward()
    grads = {n: (p.grad.detach().clone() if p.grad is not None else torch.zeros_like(p))
             for n, p in model.named_parameters()}
    _MODE["grads"] = grads
    return logits.detach().numpy(), float(loss), grads


def export_ts(model, args, names, path, dyn_axes, fold=True):
    kw = {"do_constant_folding": fold}
    if dyn_axes is not None:
        kw["dynamic_axes"] = dyn_axes
    if _MODE["exporter"] == "ts_train":
        kw["training"] = torch.onnx.TrainingMode.TRAINING
    torch.onnx.export(model, args, path, input_names=names, output_names=["logits"], opset_version=17,
                      dynamo=False, **kw)


_orig_do_one = E.do_one


def do_one(name, ctor, kind, exporter, seed):
    _MODE["label"], _MODE["exporter"] = LABEL_KIND[name], exporter
    meta = _orig_do_one(name, ctor, kind, exporter, seed)
    meta["label_kind"] = LABEL_KIND[name]
    # parameters the map cannot name (an initializer the exporter folded from one, e.g. Gemma's 1 + w):
    # their PyTorch gradient as param_grad/<name> in ref.npz, for --table (run_sweep.py reads only grad/)
    ref_path = os.path.join(E.OUT, f"{name}_{exporter}.ref.npz")
    if meta.get("unmatched_params_with_grad") and os.path.exists(ref_path):
        ref = dict(np.load(ref_path))
        for p in meta["unmatched_params_with_grad"]:
            ref["param_grad/" + p] = _MODE["grads"][p].numpy().astype(np.float32)
        np.savez(ref_path, **ref)
    path = os.path.join(E.OUT, f"{name}_{exporter}.data.npz")
    if os.path.exists(path):
        y = np.load(path)["y"]
        meta["labelled_positions"] = int((y != IGNORE).sum())
    return meta


E.text_models = text_models
E.image_models = image_models
E.text_batch = text_batch
E.torch_ref = torch_ref
E.export_ts = export_ts
E.do_one = do_one


# ----------------------------------------------------------------------------- table
def first_line(r, step):
    s = r.get(step) or {}
    errs = s.get("stderr_errors") or []
    return errs[0] if errs else f"rc {s.get('rc')} (no stderr line)"


def table(exporters=("dynamo", "dynamo_noopt", "ts_train")):
    out = E.OUT
    names = list(_lm_models())
    print("| model | labels | exporter | result | loss rel err (memc / torch) | worst grad rel err (tensor) | n grads | notes |")
    print("|---|---|---|---|---|---|---|---|")
    for n in names:
        for ex in exporters:
            b = f"{n}_{ex}"
            mf = os.path.join(out, b + ".meta.json")
            if not os.path.exists(mf):
                continue
            meta = json.load(open(mf))
            lab = LABEL_KIND.get(n, "?")
            if meta.get("status") != "exported":
                e = (meta.get("export_errors") or [meta.get("error")])
                print(f"| {n} | {lab} | {ex} | export failed (torch): {str(e[-1])[:160]} | | | | |")
                continue
            rf = os.path.join(out, b + ".memc.json")
            if not os.path.exists(rf):
                print(f"| {n} | {lab} | {ex} | not run | | | | |")
                continue
            r = json.load(open(rf))
            notes = []
            if r.get("compile", {}).get("rc") != 0:
                res = f"**compile rc {r['compile']['rc']}**: {first_line(r, 'compile')[:200]}"
            elif r.get("run", {}).get("rc") != 0:
                res = f"**run rc {r['run']['rc']}**: {first_line(r, 'run')[:200]}"
            else:
                L = r.get("losses") or [float("nan")]
                tl = meta["torch_loss"]
                lrel = abs(L[0] - tl) / abs(tl)
                gw = r.get("grad_worst")
                ok = lrel <= 1e-4 and gw is not None and gw[1] <= 1e-3 and not r.get("grad_shape_mismatch")
                # missing grads: an initializer whose parameter another initializer that memc trains also
                # holds (a tied embedding's folded transpose, the exporter's duplicate folded copies of
                # ALBERT's shared weights): memc merges them into one tensor (its compile warning says so)
                # and that tensor's grad is compared against the parameter's whole gradient
                mp = meta.get("map", {})
                strip = lambda p: p[:-2] if p.endswith("^T") else p.replace("(reshaped)", "")
                miss = r.get("grad_missing") or []
                dumped = set(mp) - set(miss)
                merged = [m for m in miss if mp.get(m) and all(
                    any(strip(p) in map(strip, mp[k]) for k in dumped) for p in mp[m])]
                other_miss = [m for m in miss if m not in merged]
                if other_miss:
                    ok = False
                    notes.append(f"missing grads {other_miss[:3]}")
                if merged:
                    notes.append(f"{merged} merged into the tensor memc trains for the same parameter (tied/shared)")
                if r.get("grad_shape_mismatch"):
                    notes.append(f"shape mismatch {list(r['grad_shape_mismatch'].items())[:2]}")
                if gw and gw[1] > 1e-3:
                    notes.append(f"{len(r.get('grad_over_1e-3', {}))} grads > 1e-3")
                extra = [x for x in r.get("grad_extra", []) if x != "loss"]
                if extra:
                    # memc's compile warning names the parameter an initializer was folded from
                    import re
                    src = {}
                    for w in r.get("compile", {}).get("warnings", []):
                        mm = re.search(r"initializer '([^']+)' \[[^]]*\] is a value the exporter folded from parameter '([^']+)' alone", w)
                        if mm:
                            src[mm.group(1)] = mm.group(2)
                    g = np.load(os.path.join(out, b + ".grads.npz"))
                    ref = np.load(os.path.join(out, b + ".ref.npz"))
                    errs, unk = {}, []
                    for x in extra:
                        k = "param_grad/" + src.get(x, "?")
                        if k in ref.files and ref[k].size == g[x].size:
                            rg = ref[k].reshape(g[x].shape)
                            errs[x] = float(np.abs(g[x] - rg).max() / max(float(np.abs(rg).max()), 1e-12))
                        else:
                            unk.append(x)
                    if errs:
                        w = max(errs, key=errs.get)
                        notes.append(f"{len(errs)} folded-from-parameter tensors memc trains (vs the parameter's grad): "
                                     f"worst {errs[w]:.1e} ({w} <- {src[w]})")
                        if errs[w] > 1e-3:
                            ok = False
                    if unk:
                        notes.append(f"{len(unk)} memc-trained tensors not in ref: {unk[:3]}")
                res = "ok" if ok else "**MISMATCH**"
                print(f"| {n} | {lab} | {ex} | {res} | {lrel:.1e} ({L[0]:.5f} / {tl:.5f}) | "
                      f"{(f'{gw[1]:.1e} ({gw[0]})') if gw else '–'} | {r.get('grad_n_compared')} | {'; '.join(notes)} |")
                continue
            for s in ("infer", "infer2", "compile2"):
                if r.get(s, {}).get("rc") not in (0, None):
                    notes.append(f"{s} rc {r[s]['rc']}")
            print(f"| {n} | {lab} | {ex} | {res} | | | | {'; '.join(notes)} |")


if __name__ == "__main__":
    if "--table" in sys.argv:
        _lm_models()
        for k, (kind, _) in _lm_models().items():
            LABEL_KIND[k] = kind
        table()
    else:
        if "--exporters" not in sys.argv:
            sys.argv += ["--exporters", "dynamo", "dynamo_noopt"]
        E.main()
