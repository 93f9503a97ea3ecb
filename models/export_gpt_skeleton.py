"""Writes models/gpt_6b7_skeleton.onnx: a decoder with GPT-3 6.7B's dimensions, for memc's
scaling predictions (`memc compile --devices N --shard zero3`, bench/scale_zero3.sh, the
`planner.zero3_scaling` test). Its weights would be 26.6 GB in float32, more than this machine
can export through torch, so the graph is written node by node with onnx.helper, as GPT-2's
modelling code computes it, and stripped like the torchvision skeletons (every initializer keeps
its name, dims and type, no data; compile and inspect need no weights, `memc run` refuses it).

  d_model 4096, 32 layers, 32 heads of 128, MLP 16384 (erf GELU), vocab 50257, 2048 positions
  (Brown et al. 2020, table 2.1), pre-norm blocks with biases, GPT-2's parameter names and
  Conv1D layout ([in, out] weights), token embedding tied to the output projection.
  Input `input_ids` int64 [batch, seq] (seq ≤ 2048, `memc compile --seq`); the causal mask is
  computed from seq (Range, Greater, Where). Output `logits` [batch, seq, 50257]: every
  position's next token through the tied embedding, so memc trains it as a language model is
  trained (a label per position), with the logits' activations and gradients of real training;
  the model states (what ZeRO shards) are GPT-3 6.7B's.

Parameters: 6,658,404,352 (checked below). Needs the onnx package only.
Usage: python models/export_gpt_skeleton.py [--layers 32] [--out models/gpt_6b7_skeleton.onnx]"""
import argparse
import math
import os

import numpy as np
import onnx
from onnx import TensorProto, helper

HERE = os.path.dirname(os.path.abspath(__file__))


def build(layers=32, d=4096, heads=32, mlp=16384, vocab=50257, positions=2048):
    nodes, inits, n = [], [], [0]
    params = [0]

    def weight(name, dims):
        t = TensorProto()
        t.name, t.data_type = name, TensorProto.FLOAT
        t.dims.extend(dims)
        inits.append(t)
        params[0] += int(np.prod(dims))
        return name

    def const(values, dtype=np.int64):
        n[0] += 1
        name = f"const_{n[0]}"
        arr = np.array(values, dtype=dtype)
        nodes.append(helper.make_node("Constant", [], [name], value=onnx.numpy_helper.from_array(arr, name)))
        return name

    def op(kind, inputs, **attrs):
        n[0] += 1
        out = f"{kind.lower()}_{n[0]}"
        nodes.append(helper.make_node(kind, inputs, [out], **attrs))
        return out

    def linear(x, prefix, fan_in, fan_out):
        return op("Add", [op("MatMul", [x, weight(f"{prefix}.weight", [fan_in, fan_out])]),
                          weight(f"{prefix}.bias", [fan_out])])

    def layer_norm(x, prefix):
        return op("LayerNormalization", [x, weight(f"{prefix}.weight", [d]), weight(f"{prefix}.bias", [d])],
                  axis=-1, epsilon=1e-5)

    head_dim = d // heads
    wte = weight("transformer.wte.weight", [vocab, d])
    wpe = weight("transformer.wpe.weight", [positions, d])
    seq = op("Gather", [op("Shape", ["input_ids"]), const(1)], axis=0)
    pos = op("Range", [const(0), seq, const(1)])
    h = op("Add", [op("Gather", [wte, "input_ids"], axis=0), op("Gather", [wpe, pos], axis=0)])
    # The causal mask [seq, seq]: 0 where a query may see the key, float32's lowest value after.
    future = op("Greater", [op("Unsqueeze", [pos, const([0])]), op("Unsqueeze", [pos, const([1])])])
    mask = op("Where", [future, const(np.finfo(np.float32).min, np.float32), const(0.0, np.float32)])
    split_heads = const([0, 0, heads, head_dim])
    for i in range(layers):
        p = f"transformer.h.{i}"
        qkv = linear(layer_norm(h, f"{p}.ln_1"), f"{p}.attn.c_attn", d, 3 * d)
        q, k, v = (op("Reshape", [op("Slice", [qkv, const([j * d]), const([(j + 1) * d]), const([2])]), split_heads])
                   for j in range(3))
        q = op("Transpose", [q], perm=[0, 2, 1, 3])
        k = op("Transpose", [k], perm=[0, 2, 3, 1])
        v = op("Transpose", [v], perm=[0, 2, 1, 3])
        scores = op("Add", [op("Mul", [op("MatMul", [q, k]), const(1.0 / math.sqrt(head_dim), np.float32)]), mask])
        ctx = op("MatMul", [op("Softmax", [scores], axis=-1), v])
        ctx = op("Reshape", [op("Transpose", [ctx], perm=[0, 2, 1, 3]), const([0, 0, d])])
        h = op("Add", [h, linear(ctx, f"{p}.attn.c_proj", d, d)])
        x = linear(layer_norm(h, f"{p}.ln_2"), f"{p}.mlp.c_fc", d, mlp)
        x = op("Mul", [op("Mul", [x, const(0.5, np.float32)]),
                       op("Add", [op("Erf", [op("Div", [x, const(math.sqrt(2.0), np.float32)])]), const(1.0, np.float32)])])
        h = op("Add", [h, linear(x, f"{p}.mlp.c_proj", mlp, d)])
    h = layer_norm(h, "transformer.ln_f")
    nodes.append(helper.make_node("MatMul", [h, op("Transpose", [wte], perm=[1, 0])], ["logits"]))
    graph = helper.make_graph(
        nodes, "gpt_6b7",
        [helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", vocab])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="memc export_gpt_skeleton.py")
    return model, params[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--out", default=os.path.join(HERE, "gpt_6b7_skeleton.onnx"))
    args = ap.parse_args()
    model, count = build(layers=args.layers)
    if args.layers == 32:
        assert count == 6_658_404_352, count
    onnx.save_model(model, args.out)
    print(f"{args.out}: {count:,} parameters in {len(model.graph.initializer)} initializers, "
          f"{len(model.graph.node)} nodes, {os.path.getsize(args.out):,} bytes")


if __name__ == "__main__":
    main()
