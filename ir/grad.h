// The vocabulary gradient rules are written in (after ONNX Runtime's gradient builder):
// I(i) forward input, O(i) forward output, GO(i) gradient arriving at output i, and
// set_GI(i, g) to contribute the gradient of input i. Rules emit ordinary IR nodes.
#pragma once
#include <string>
#include <vector>

#include "ir/graph.h"

namespace memc {

class GradBuilder {
 public:
  GradBuilder(Module& module, Node node, std::vector<ValueId> output_grads, std::vector<bool> needs_input_grad);

  ValueId I(int i) const { return node_.inputs.at(i); }
  ValueId O(int i) const { return node_.outputs.at(i); }
  // kNoValue when nothing downstream depends on output i.
  ValueId GO(int i) const { return i < static_cast<int>(output_grads_.size()) ? output_grads_[i] : kNoValue; }
  int num_inputs() const { return static_cast<int>(node_.inputs.size()); }
  bool has_input(int i) const { return i < num_inputs() && node_.inputs[i] != kNoValue; }
  // Whether the gradient of input i is wanted; rules skip work nobody needs.
  bool needs_GI(int i) const { return i < static_cast<int>(needs_.size()) && needs_[i]; }
  void set_GI(int i, ValueId grad);
  const std::vector<ValueId>& input_grads() const { return input_grads_; }

  const Node& node() const { return node_; }
  const Attrs& attrs() const { return node_.attrs; }
  // By value: emitting nodes grows the module's value table, so references would dangle.
  TensorType type(ValueId v) const { return module_.value(v).type; }
  Shape shape(ValueId v) const { return module_.value(v).type.shape; }
  DType dtype(ValueId v) const { return module_.value(v).type.dtype; }

  // Emits one node and returns its first output. A failure here is a bug in a rule.
  ValueId emit(const std::string& op, std::vector<ValueId> inputs, Attrs attrs = {});
  std::vector<ValueId> emit_n(const std::string& op, std::vector<ValueId> inputs, Attrs attrs, int num_outputs);
  // A scalar constant of `dtype`.
  ValueId scalar(double v, DType dtype);
  // A constant tensor.
  ValueId constant(Tensor value);
  // Sums `grad` over the dims that broadcasting added or stretched, so it has shape `target`.
  ValueId sum_to(ValueId grad, const Shape& target);
  ValueId reshape(ValueId v, const Shape& shape);
  ValueId cast(ValueId v, DType dtype);

 private:
  Module& module_;
  Node node_;
  std::vector<ValueId> output_grads_;
  std::vector<bool> needs_;
  std::vector<ValueId> input_grads_;
};

// Attribute-building shorthand for rules: attrs({{"axis", int64_t{1}}}).
Attrs make_attrs(std::initializer_list<std::pair<std::string, Attr>> items);

}  // namespace memc
