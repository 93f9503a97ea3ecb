#!/usr/bin/env python3
"""Exports a long-context BigBird skeleton (attention_type original_full) for memc's attention
benchmark (bench/attention_bigbird.sh, bench/journal/2026.md §9).

    /work/venv/bin/python models/export_bigbird_long.py                       # ~1 min
    /work/venv/bin/python models/export_bigbird_long.py --full-out /tmp/bigbird_long_full.onnx

Writes models/bigbird_long_skeleton.onnx: transformers BigBirdForSequenceClassification with
the dimensions of google/bigbird-roberta-base (hidden 768, 12 heads, 12 layers, FFN 3072,
vocab 50358, max_position_embeddings 4096, dropout 0.1 / 0.1 as in that config; no pretrained
weights, nothing downloaded), attention_type "original_full", 2 labels. TorchScript exporter,
opset 17, TRAINING mode (dropout kept, as the other committed models), traced at batch 1,
seq 64 with dynamic axes {0: batch, 1: seq} on input_ids / attention_mask, so memc compiles
it at any --seq ≤ 4096. Weights are stripped as for the torchvision skeletons
(export_models.strip_initializers): initializers keep name, dtype and dims but no data, so the
file is small (compile and inspect need no weights; `memc run` refuses a skeleton).

--full-out PATH also writes the same export *with* its random weights (HF init, seed 0, about
0.5 GB) to PATH, outside the repository, for `memc run` measurements. Never commit that file.

Check (run every time): a second export of the same weights with every dropout p = 0 is run
in onnxruntime at seq 64 (the traced length) and seq 200 (another length, through the dynamic
axis) and compared with PyTorch's logits.
"""
import argparse
import os
import sys
import tempfile
import warnings

import numpy as np
import onnx
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_models import export_ts, seed_all, set_dropout, strip_initializers  # noqa: E402

warnings.filterwarnings("ignore")
HERE = os.path.dirname(os.path.abspath(__file__))


def build(layers, seed=0):
    from transformers import BigBirdConfig, BigBirdForSequenceClassification
    seed_all(seed)
    cfg = BigBirdConfig(vocab_size=50358, hidden_size=768, num_hidden_layers=layers,
                        num_attention_heads=12, intermediate_size=3072, hidden_act="gelu_new",
                        max_position_embeddings=4096, type_vocab_size=2,
                        hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1,
                        attention_type="original_full", num_labels=2, return_dict=False)
    return BigBirdForSequenceClassification(cfg)


def inputs(batch, seq, seed):
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(5, 50358, (batch, seq), generator=g)
    mask = torch.ones(batch, seq, dtype=torch.int64)
    return ids, mask


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=12)
    ap.add_argument("--out", default=os.path.join(HERE, "bigbird_long_skeleton.onnx"))
    ap.add_argument("--full-out", default=None, help="also write the weighted export here (not in the repo)")
    args = ap.parse_args()

    model = build(args.layers)
    model.train()
    assert model.bert.attention_type == "original_full"
    dyn = {"input_ids": {0: "batch", 1: "seq"}, "attention_mask": {0: "batch", 1: "seq"},
           "logits": {0: "batch"}}
    names = ["input_ids", "attention_mask"]
    with tempfile.TemporaryDirectory() as td:
        # 1. parity check of the graph structure on a dropout-free export
        import onnxruntime as ort
        set_dropout(model, 0.0)
        chk = os.path.join(td, "check.onnx")
        export_ts(model, inputs(1, 64, 0), chk, names, dyn)
        sess = ort.InferenceSession(chk, providers=["CPUExecutionProvider"])
        for batch, seq in ((1, 64), (2, 200)):
            ids, mask = inputs(batch, seq, seq)
            with torch.no_grad():
                ref = model(ids, attention_mask=mask)[0].numpy()
            got = sess.run(None, {"input_ids": ids.numpy(), "attention_mask": mask.numpy()})[0]
            rel = float(np.abs(got - ref).max() / max(np.abs(ref).max(), 1e-30))
            print(f"  ORT vs torch (dropout 0) batch {batch} seq {seq}: rel err {rel:.2e}")
            assert rel < 1e-4, rel
        del sess
        # 2. the real export: dropout 0.1 as in bigbird-roberta-base's config
        set_dropout(model, 0.1)
        full = args.full_out or os.path.join(td, "full.onnx")
        export_ts(model, inputs(1, 64, 0), full, names, dyn)
        m = onnx.load(full)
    params = dict(model.named_parameters())
    n_param = sum(int(np.prod(i.dims)) for i in m.graph.initializer if i.name in params)
    strip_initializers(m)
    onnx.save_model(m, args.out)
    size = os.path.getsize(args.out)
    print(f"  {args.out}: {len(m.graph.node)} nodes, {len(m.graph.initializer)} initializers, "
          f"{n_param:,} parameter elements as initializers (torch: {sum(p.numel() for p in params.values()):,}), "
          f"{size:,} bytes")
    if args.full_out:
        print(f"  {args.full_out}: {os.path.getsize(args.full_out):,} bytes (with weights; do not commit)")
    assert size < 2_000_000, size


if __name__ == "__main__":
    main()
