#include "passes/emit.h"

#include "ir/grad.h"
#include "support/status.h"

namespace memc {

ValueId emit_node(Module& m, std::string_view source, const std::string& op, std::vector<ValueId> inputs, Attrs attrs, int outputs) {
  auto out = m.add_node(op, std::move(inputs), std::move(attrs), std::string(source), outputs);
  MEMC_CHECK(out.ok(), out.status().message());
  return (*out)[0];
}

ValueId emit_cast(Module& m, std::string_view source, ValueId v, DType to) {
  if (m.value(v).type.dtype == to) return v;
  return emit_node(m, source, "cast", {v}, make_attrs({{"to", std::string(dtype_name(to))}}));
}

ValueId emit_rows(Module& m, std::string_view source, ValueId v, int64_t begin, int64_t end) {
  return emit_node(m, source, "slice", {v},
                   make_attrs({{"axes", std::vector<int64_t>{0}}, {"starts", std::vector<int64_t>{begin}}, {"ends", std::vector<int64_t>{end}},
                               {"steps", std::vector<int64_t>{1}}}));
}

ValueId f32_scalar(Module& m, double v, const std::string& name) {
  Tensor t = Tensor::zeros(DType::kF32, {});
  t.data<float>()[0] = static_cast<float>(v);
  return m.add_constant(std::move(t), name);
}

}  // namespace memc
