// Builds small ONNX ModelProtos in tests: inputs, initializers, nodes, attributes.
#pragma once
#include <map>
#include <string>
#include <vector>

#include "frontend/onnx_import.h"
#include "frontend/onnx_tensor.h"
#include "onnx/onnx_pb.h"
#include "passes/autodiff.h"
#include "passes/pass.h"
#include "runtime/executor.h"

namespace memc::testing {

class OnnxBuilder {
 public:
  explicit OnnxBuilder(int64_t opset = 17) {
    model_.set_ir_version(8);
    model_.set_producer_name("memc-test");
    auto* o = model_.add_opset_import();
    o->set_domain("");
    o->set_version(opset);
    model_.mutable_graph()->set_name("g");
  }
  // dims: -1 is a symbolic dim named by `params` in order ("batch", "seq", ...).
  OnnxBuilder& input(const std::string& name, std::vector<int64_t> dims, int elem = onnx::TensorProto::FLOAT,
                     std::vector<std::string> params = {"batch", "seq", "d2", "d3"}) {
    auto* in = model_.mutable_graph()->add_input();
    in->set_name(name);
    auto* tt = in->mutable_type()->mutable_tensor_type();
    tt->set_elem_type(elem);
    auto* shape = tt->mutable_shape();
    size_t p = 0;
    for (int64_t d : dims) {
      auto* dim = shape->add_dim();
      if (d >= 0) dim->set_dim_value(d);
      else dim->set_dim_param(params[p++]);
    }
    return *this;
  }
  OnnxBuilder& output(const std::string& name) {
    model_.mutable_graph()->add_output()->set_name(name);
    return *this;
  }
  OnnxBuilder& init(const std::string& name, const Tensor& t, bool strip_data = false) {
    auto* p = model_.mutable_graph()->add_initializer();
    tensor_to_proto(t, *p);
    p->set_name(name);
    if (strip_data) p->clear_raw_data();
    return *this;
  }
  OnnxBuilder& ints(const std::string& name, std::vector<int64_t> values) {
    Tensor t = Tensor::zeros(DType::kI64, {static_cast<int64_t>(values.size())});
    for (size_t i = 0; i < values.size(); ++i) t.data<int64_t>()[i] = values[i];
    return init(name, t);
  }
  OnnxBuilder& scalar(const std::string& name, double v, DType dtype = DType::kF32) {
    Tensor t = Tensor::zeros(dtype, {});
    t.set_from_double(0, v);
    return init(name, t);
  }
  onnx::NodeProto& node(const std::string& op, std::vector<std::string> inputs, std::vector<std::string> outputs,
                        const std::string& name = "") {
    auto* n = model_.mutable_graph()->add_node();
    n->set_op_type(op);
    n->set_name(name.empty() ? op + "_" + std::to_string(model_.graph().node_size()) : name);
    for (auto& i : inputs) n->add_input(i);
    for (auto& o : outputs) n->add_output(o);
    return *n;
  }
  std::string bytes() const { return model_.SerializeAsString(); }
  onnx::ModelProto& proto() { return model_; }
  Expected<Module> import(ImportOptions options = {}) const { return import_onnx_bytes(bytes(), "", options, "test.onnx"); }

 private:
  onnx::ModelProto model_;
};

inline void attr_i(onnx::NodeProto& n, const std::string& name, int64_t v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INT);
  a->set_i(v);
}
inline void attr_f(onnx::NodeProto& n, const std::string& name, float v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::FLOAT);
  a->set_f(v);
}
inline void attr_s(onnx::NodeProto& n, const std::string& name, const std::string& v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::STRING);
  a->set_s(v);
}
inline void attr_ints(onnx::NodeProto& n, const std::string& name, std::vector<int64_t> v) {
  auto* a = n.add_attribute();
  a->set_name(name);
  a->set_type(onnx::AttributeProto::INTS);
  for (int64_t x : v) a->add_ints(x);
}

inline Tensor make_tensor(DType dtype, Shape shape, std::vector<double> values) {
  Tensor t = Tensor::zeros(dtype, shape);
  for (int64_t i = 0; i < t.numel(); ++i) t.set_from_double(i, values[i % values.size()]);
  return t;
}

// The gradients of the sum of an imported module's first output with respect to the graph
// inputs named in `wrt`, at `feeds`: how a lowered op's gradient is checked against PyTorch's.
inline Expected<std::vector<Tensor>> input_gradients(Module m, const std::vector<std::string>& wrt,
                                                     const std::map<std::string, Tensor>& feeds) {
  std::vector<ValueId> inputs;
  for (const std::string& name : wrt) inputs.push_back(m.find_value(name));
  Attrs all;
  all.set("axes", std::vector<int64_t>{});
  all.set("keepdims", int64_t{0});
  MEMC_ASSIGN_OR_RETURN(std::vector<ValueId> loss, m.add_node("reduce_sum", {m.outputs().at(0)}, all));
  MEMC_ASSIGN_OR_RETURN(std::vector<ValueId> grads, Autodiff().run(m, loss[0], inputs));
  m.set_outputs(grads);
  return execute(m, feeds);
}

using memc::count_op;  // passes/pass.h

}  // namespace memc::testing
