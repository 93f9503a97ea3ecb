// Writes a skeleton ONNX model (initializers with dims, no data) back with seeded weights, so a
// test can run a model of real size that the repository ships only as shapes: N(0, 0.02²)-like
// values everywhere, ones for 1-D LayerNorm scales (bench/random_weights.py, without NumPy).
// Usage: fill_skeleton SKELETON.onnx OUT.onnx
#include <cstdio>
#include <fstream>
#include <random>

#include "frontend/onnx_tensor.h"

int main(int argc, char** argv) {
  if (argc != 3) {
    std::fprintf(stderr, "usage: fill_skeleton SKELETON.onnx OUT.onnx\n");
    return 2;
  }
  onnx::ModelProto model;
  std::ifstream in(argv[1], std::ios::binary);
  if (!in || !model.ParseFromIstream(&in)) {
    std::fprintf(stderr, "fill_skeleton: %s: cannot read the model\n", argv[1]);
    return 2;
  }
  std::mt19937 rng(0);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  for (onnx::TensorProto& init : *model.mutable_graph()->mutable_initializer()) {
    if (!memc::tensor_proto_has_no_data(init)) continue;
    memc::Shape shape(init.dims().begin(), init.dims().end());
    const memc::Expected<memc::DType> dtype = memc::dtype_from_onnx(init.data_type());
    if (!dtype.ok()) {
      std::fprintf(stderr, "fill_skeleton: %s: initializer '%s': %s\n", argv[1], init.name().c_str(), dtype.status().message().c_str());
      return 2;
    }
    memc::Tensor t = memc::Tensor::zeros(*dtype, shape);
    const std::string name = init.name();
    if (*dtype != memc::DType::kF32) {  // integer constants of a skeleton: zeros
      memc::tensor_to_proto(t, init);
      init.set_name(name);
      continue;
    }
    const bool ln_scale = shape.size() == 1 && init.name().find("ln") != std::string::npos && init.name().find("weight") != std::string::npos;
    float* data = t.data<float>();
    for (int64_t i = 0; i < t.numel(); ++i) data[i] = ln_scale ? 1.0f : normal(rng);
    memc::tensor_to_proto(t, init);
    init.set_name(name);
  }
  std::ofstream out(argv[2], std::ios::binary);
  if (!out || !model.SerializeToOstream(&out)) {
    std::fprintf(stderr, "fill_skeleton: %s: cannot write the model\n", argv[2]);
    return 2;
  }
  return 0;
}
