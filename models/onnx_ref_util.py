"""Shared helpers for models/export_models.py and models/check_models.py.

Nothing here is used by the C++ build; it documents how the committed ONNX
files and reference .npz files were produced and checked.
"""
import collections
import copy
import os

import numpy as np
import onnx
from onnx import numpy_helper

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

FLOAT_TYPES = (onnx.TensorProto.FLOAT, onnx.TensorProto.DOUBLE, onnx.TensorProto.FLOAT16,
               onnx.TensorProto.BFLOAT16)


def load(path, with_data=True):
    return onnx.load(path, load_external_data=with_data)


def keep_scope_metadata(model):
    """Drops each node's metadata but the module scope and FX node, which name the parameter
    behind a folded weight (memc reads them); stack traces make most of a dynamo export's bytes."""
    keep = ("pkg.torch.onnx.name_scopes", "pkg.torch.onnx.fx_node")
    for n in model.graph.node:
        kept = [(p.key, p.value) for p in n.metadata_props if p.key in keep]
        del n.metadata_props[:]
        for k, v in kept:
            n.metadata_props.add(key=k, value=v)


def op_histogram(model):
    """op_type counts over the main graph (domain-qualified when not ai.onnx)."""
    c = collections.Counter()
    for n in model.graph.node:
        key = n.op_type if n.domain in ("", "ai.onnx") else f"{n.domain}::{n.op_type}"
        c[key] += 1
    return dict(sorted(c.items(), key=lambda kv: (-kv[1], kv[0])))


def initializer_arrays(model):
    return {i.name: numpy_helper.to_array(i) for i in model.graph.initializer}


def disable_dropout(model):
    """Copy of `model` in which every Dropout node runs in inference mode.

    The TorchScript exporter in TRAINING mode emits Dropout(data, ratio,
    training_mode=True). Dropping the optional third input makes training_mode
    default to false, so ORT computes the identity, which is what the C++
    engine does in inference and what the references (dropout off) assume.
    """
    m = copy.deepcopy(model)
    n_changed = 0
    for n in m.graph.node:
        if n.op_type == "Dropout" and len(n.input) >= 3:
            del n.input[2]
            n_changed += 1
    return m, n_changed


def ort_session(model_or_path, threads=2):
    import onnxruntime as ort
    so = ort.SessionOptions()
    so.intra_op_num_threads = threads
    so.log_severity_level = 3
    if isinstance(model_or_path, onnx.ModelProto):
        data = model_or_path.SerializeToString()
        return ort.InferenceSession(data, so, providers=["CPUExecutionProvider"])
    return ort.InferenceSession(model_or_path, so, providers=["CPUExecutionProvider"])


def ort_logits(model_path, feeds):
    """Logits from ORT on the committed file at `model_path` with dropout off.

    External data is loaded relative to the file's folder.
    """
    m = onnx.load(model_path, load_external_data=True)
    m, _ = disable_dropout(m)
    sess = ort_session(m)
    names = [i.name for i in sess.get_inputs()]
    return sess.run(None, {k: feeds[k] for k in names})[0]


def rel_diff(a, b):
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return float(np.max(np.abs(a - b)) / max(np.max(np.abs(b)), 1e-30))


def softmax_xent(logits, labels):
    z = np.asarray(logits, np.float64)
    z = z - z.max(axis=1, keepdims=True)
    lse = np.log(np.exp(z).sum(axis=1))
    return float(np.mean(lse - z[np.arange(len(labels)), labels]))


def graph_input_names(model):
    inits = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in inits]
