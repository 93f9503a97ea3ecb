#!/usr/bin/env python3
"""Loads an exported ONNX model in onnxruntime and reports its accuracy on a test set.

    /work/venv/bin/python models/check_export.py MODEL.onnx [--weights W.safetensors|W.npz]
        [--data data/digits_test.npz] [--batch 64] [--strict] [--json]

Shows that a model written by `memc export` (or any ONNX file plus a weights
checkpoint) loads and runs in another runtime. Steps:
  1. load MODEL.onnx (external data resolved relative to its folder);
  2. if --weights is given, every tensor in it replaces the initializer of the
     same name (or is fed as a graph input of that name when the graph declares
     the weight as an input); dtype is converted to the initializer's dtype
     (f16 / bf16 / f64 checkpoints work), shape must match. Names present in
     the checkpoint but not in the graph, and initializers the checkpoint does
     not cover, are listed; --strict makes either an error;
  3. Dropout nodes with a `training_mode` input (TRAINING-mode exports) are
     switched to inference by removing that input;
  4. runs the data set (`x` or the array named by --input-key, labels `y`) in
     batches (the last, short batch too; pass --batch equal to the exported
     batch for a static-batch graph) and prints accuracy and mean
     cross-entropy.

Safetensors are parsed by hand (8-byte little-endian header length, JSON header
{name: {dtype, shape, data_offsets}}, then the raw little-endian data), so
bf16 works and the `safetensors` package is not needed; if it is installed it
is used to cross-check the parse for the dtypes numpy supports.
"""
import argparse
import json
import os
import struct
import sys

import numpy as np
import onnx
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

_ST_DTYPES = {
    "F64": np.float64, "F32": np.float32, "F16": np.float16, "BF16": "bf16",
    "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
    "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_,
}


def read_safetensors(path):
    with open(path, "rb") as f:
        blob = f.read()
    if len(blob) < 8:
        raise ValueError(f"{path}: too short for a safetensors file")
    (n,) = struct.unpack("<Q", blob[:8])
    if n > len(blob) - 8:
        raise ValueError(f"{path}: header length {n} exceeds the file ({len(blob)} bytes)")
    header = json.loads(blob[8:8 + n].decode("utf-8"))
    data = memoryview(blob)[8 + n:]
    out, meta = {}, header.pop("__metadata__", None)
    for name, info in header.items():
        dt = _ST_DTYPES.get(info["dtype"])
        if dt is None:
            raise ValueError(f"{path}: tensor {name}: unsupported dtype {info['dtype']}")
        b, e = info["data_offsets"]
        if not (0 <= b <= e <= len(data)):
            raise ValueError(f"{path}: tensor {name}: offsets {b}..{e} outside the data ({len(data)} bytes)")
        shape = tuple(info["shape"])
        raw = bytes(data[b:e])
        if dt == "bf16":
            u = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = u.view(np.float32)
        else:
            arr = np.frombuffer(raw, dtype=np.dtype(dt).newbyteorder("<")).astype(dt)
        if arr.size != int(np.prod(shape, dtype=np.int64)):
            raise ValueError(f"{path}: tensor {name}: {arr.size} elements for shape {list(shape)}")
        out[name] = arr.reshape(shape)
    try:   # optional cross-check with the reference implementation
        from safetensors.numpy import load_file
        ref = load_file(path)
        for k, v in ref.items():
            assert np.array_equal(v, out[k]), f"safetensors package disagrees on {k}"
    except ImportError:
        pass
    except (TypeError, ValueError) as e:   # e.g. bf16 is not a numpy dtype
        if "bf16" not in str(e).lower() and "bfloat16" not in str(e).lower():
            raise
    return out, meta


def read_weights(path):
    if path.endswith(".npz"):
        with np.load(path) as z:
            return {k: z[k] for k in z.files}, None
    return read_safetensors(path)


def apply_weights(model, weights, strict):
    inits = {i.name: i for i in model.graph.initializer}
    graph_inputs = {i.name for i in model.graph.input} - set(inits)
    replaced, fed, unknown = [], {}, []
    for name, arr in weights.items():
        if name in inits:
            old = numpy_helper.to_array(inits[name])
            if tuple(old.shape) != tuple(arr.shape):
                raise SystemExit(f"weight {name}: shape {list(arr.shape)}, graph has {list(old.shape)}")
            inits[name].CopyFrom(numpy_helper.from_array(np.ascontiguousarray(arr.astype(old.dtype)), name))
            replaced.append(name)
        elif name in graph_inputs:
            fed[name] = arr
        else:
            unknown.append(name)
    float_inits = [n for n, i in inits.items() if i.data_type in (onnx.TensorProto.FLOAT,
                                                                  onnx.TensorProto.FLOAT16,
                                                                  onnx.TensorProto.BFLOAT16)]
    not_covered = [n for n in float_inits if n not in weights]
    if strict and (unknown or not_covered):
        raise SystemExit(f"--strict: checkpoint names not in graph: {unknown}; "
                         f"float initializers not in checkpoint: {not_covered}")
    return replaced, fed, unknown, not_covered


def disable_dropout(model):
    n = 0
    for node in model.graph.node:
        if node.op_type == "Dropout" and len(node.input) >= 3:
            del node.input[2]
            n += 1
    return n


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--weights", help=".safetensors or .npz, tensor names = initializer names")
    ap.add_argument("--data", default=os.path.join(ROOT, "data", "digits_test.npz"))
    ap.add_argument("--input-key", default=None, help="array for the model input (default: x, "
                    "else the array named like the graph input)")
    ap.add_argument("--label-key", default="y")
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--strict", action="store_true")
    ap.add_argument("--json", action="store_true", help="print one JSON line only")
    args = ap.parse_args()

    import onnxruntime as ort
    model = onnx.load(args.model, load_external_data=True)
    replaced, fed, unknown, not_covered, meta = [], {}, [], [], None
    if args.weights:
        weights, meta = read_weights(args.weights)
        replaced, fed, unknown, not_covered = apply_weights(model, weights, args.strict)
    n_dropout = disable_dropout(model)

    so = ort.SessionOptions()
    so.intra_op_num_threads = args.threads
    so.log_severity_level = 3
    sess = ort.InferenceSession(model.SerializeToString(), so, providers=["CPUExecutionProvider"])
    data_inputs = [i for i in sess.get_inputs() if i.name not in fed]
    if len(data_inputs) != 1:
        raise SystemExit(f"expected one data input, graph has {[i.name for i in data_inputs]}")
    inp = data_inputs[0]
    d = np.load(args.data)
    key = args.input_key or ("x" if "x" in d.files else inp.name)
    x, y = d[key], d[args.label_key]
    want = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64,
            "tensor(double)": np.float64}.get(inp.type, x.dtype)
    x = x.astype(want)

    correct, nll, n = 0, 0.0, len(y)
    for s in range(0, n, args.batch):
        feeds = dict(fed)
        feeds[inp.name] = x[s:s + args.batch]
        logits = sess.run(None, feeds)[0].astype(np.float64)
        yy = y[s:s + args.batch]
        correct += int((logits.argmax(1) == yy).sum())
        z = logits - logits.max(1, keepdims=True)
        lse = np.log(np.exp(z).sum(1))
        nll += float((lse - z[np.arange(len(yy)), yy]).sum())
    res = {"model": args.model, "weights": args.weights, "data": args.data, "n": int(n),
           "accuracy": correct / n, "correct": correct, "mean_xent": nll / n,
           "replaced_initializers": len(replaced), "fed_as_inputs": sorted(fed),
           "checkpoint_names_not_in_graph": unknown, "initializers_not_in_checkpoint": not_covered,
           "dropout_nodes_disabled": n_dropout, "onnxruntime": ort.__version__}
    if meta:
        res["safetensors_metadata"] = meta
    if args.json:
        print(json.dumps(res))
        return
    print(f"{args.model}: accuracy {correct}/{n} = {correct / n:.4f}, mean cross-entropy {nll / n:.4f} "
          f"(onnxruntime {ort.__version__})")
    if args.weights:
        print(f"  weights {args.weights}: {len(replaced)} initializers replaced, {len(fed)} fed as inputs")
        if unknown:
            print(f"  WARNING: checkpoint tensors not in the graph: {unknown}")
        if not_covered:
            print(f"  WARNING: float initializers the checkpoint does not cover (kept): {not_covered}")
    print(f"  {n_dropout} Dropout node(s) switched to inference")


if __name__ == "__main__":
    sys.exit(main())
