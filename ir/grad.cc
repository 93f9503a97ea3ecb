#include "ir/grad.h"

#include "ir/printer.h"

namespace memc {

GradBuilder::GradBuilder(Module& module, Node node, std::vector<ValueId> output_grads, std::vector<bool> needs_input_grad)
    : module_(module), node_(std::move(node)), output_grads_(std::move(output_grads)), needs_(std::move(needs_input_grad)),
      input_grads_(node_.inputs.size(), kNoValue) {}

void GradBuilder::set_GI(int i, ValueId grad) {
  MEMC_CHECK(i >= 0 && i < num_inputs(), "set_GI(", i, ") on memc.", node_.op);
  if (grad == kNoValue || !needs_GI(i)) return;
  const TensorType want = module_.value(node_.inputs[i]).type;
  const TensorType got = module_.value(grad).type;
  MEMC_CHECK(want.shape == got.shape, "gradient rule of memc.", node_.op, " gives input ", i, " shape ",
             shape_str(got.shape), ", input has ", shape_str(want.shape));
  input_grads_[i] = got.dtype == want.dtype ? grad : cast(grad, want.dtype);
}

std::vector<ValueId> GradBuilder::emit_n(const std::string& op, std::vector<ValueId> inputs, Attrs attrs, int num_outputs) {
  const std::string source = node_.source.empty() ? "grad of memc." + node_.op : "grad of " + node_.source;
  Expected<std::vector<ValueId>> out = module_.add_node(op, std::move(inputs), std::move(attrs), source, num_outputs);
  MEMC_CHECK(out.ok(), "gradient rule of memc.", node_.op, " emitted a bad memc.", op, ": ", out.status().message());
  return *out;
}

ValueId GradBuilder::emit(const std::string& op, std::vector<ValueId> inputs, Attrs attrs) {
  return emit_n(op, std::move(inputs), std::move(attrs), -1).at(0);
}

ValueId GradBuilder::scalar(double v, DType dtype) {
  Tensor t = Tensor::zeros(dtype, {});
  t.set_from_double(0, v);
  return module_.add_constant(std::move(t), "c");
}

ValueId GradBuilder::constant(Tensor value) { return module_.add_constant(std::move(value), "c"); }

ValueId GradBuilder::reshape(ValueId v, const Shape& shape) {
  if (this->shape(v) == shape) return v;
  return emit("reshape", {v}, make_attrs({{"shape", shape}}));
}

ValueId GradBuilder::cast(ValueId v, DType dtype) {
  if (this->dtype(v) == dtype) return v;
  return emit("cast", {v}, make_attrs({{"to", std::string(dtype_name(dtype))}}));
}

ValueId GradBuilder::sum_to(ValueId grad, const Shape& target) {
  const Shape from = shape(grad);
  if (from == target) return grad;
  // Dims broadcasting added (leading) or stretched from 1 are summed away.
  std::vector<int64_t> axes;
  const size_t lead = from.size() - target.size();
  for (size_t d = 0; d < from.size(); ++d) {
    if (d < lead || (target[d - lead] == 1 && from[d] != 1)) axes.push_back(static_cast<int64_t>(d));
  }
  ValueId summed = axes.empty() ? grad : emit("reduce_sum", {grad}, make_attrs({{"axes", axes}, {"keepdims", int64_t{0}}}));
  return reshape(summed, target);
}

Attrs make_attrs(std::initializer_list<std::pair<std::string, Attr>> items) {
  Attrs a;
  for (const auto& [k, v] : items) a.set(k, v);
  return a;
}

}  // namespace memc
