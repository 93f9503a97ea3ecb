"""Writes the tiny ONNX fixtures of tests/cli/*.sh (run with the venv's onnx)."""
import onnx
from onnx import TensorProto, helper

# A valid model whose second node is an op memc does not lower (Det): the importer must name
# the op, the node and the opset.
x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 3])
y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch"])
graph = helper.make_graph(
    [helper.make_node("Relu", ["x"], ["r"], name="relu0"),
     helper.make_node("Det", ["r"], ["y"], name="det0")],
    "unsupported_op", [x], [y])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="memc-tests")
onnx.checker.check_model(model)
onnx.save(model, "unsupported_op.onnx")
