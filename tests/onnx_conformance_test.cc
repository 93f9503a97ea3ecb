// ONNX backend node tests (Debian's libonnx-testdata) through the importer and CPU executor, and
// again through the CUDA backend's kernels run on the host (tests/cuda/host_cuda_backend.h).
// A case whose ops memc supports must pass, or be listed in tests/onnx_conformance_expected.txt
// with its reason; a listed case that passes fails the test too, so the list stays honest.
// Prints per-op counts and a closing "N passed, N failed" line.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "frontend/onnx_import.h"
#include "frontend/onnx_tensor.h"
#include "runtime/executor.h"
#include "tests/cuda/host_cuda_backend.h"
#include "tests/test_util.h"

namespace memc {
namespace {

namespace fs = std::filesystem;
const char* kNodeTestDir = "/usr/share/libonnx-testdata/data/node";

struct CaseResult {
  std::string name, op;
  enum Kind { kPass, kFail, kUnsupported } kind;
  std::string detail;
};

bool read_proto(const fs::path& path, google::protobuf::MessageLite& msg) {
  std::ifstream in(path, std::ios::binary);
  return in && msg.ParseFromIstream(&in);
}

// The op a case exercises: its single node's type, or its unexpanded twin's for "_expanded".
std::string case_op(const fs::path& dir) {
  std::string name = dir.filename().string();
  const std::string suffix = "_expanded";
  const bool expanded = name.size() > suffix.size() && name.ends_with(suffix);
  fs::path model_dir = expanded ? dir.parent_path() / name.substr(0, name.size() - suffix.size()) : dir;
  onnx::ModelProto model;
  if (!read_proto(model_dir / "model.onnx", model) || model.graph().node_size() == 0) {
    if (!read_proto(dir / "model.onnx", model) || model.graph().node_size() == 0) return "?";
  }
  const std::string op = model.graph().node(model.graph().node_size() - 1).op_type();
  return expanded ? op + " (expanded)" : op;
}

bool close_enough(const Tensor& actual, const Tensor& expected, std::string& detail) {
  if (actual.dtype() != expected.dtype() || actual.shape() != expected.shape()) {
    detail = str_cat("got ", dtype_name(actual.dtype()), "[", shape_str(actual.shape()), "], expected ",
                     dtype_name(expected.dtype()), "[", shape_str(expected.shape()), "]");
    return false;
  }
  // The ONNX backend test tolerance: |a - e| ≤ atol + rtol·|e| with rtol 1e-3, atol 1e-7.
  const bool exact = !is_float(expected.dtype());
  const double rtol = expected.dtype() == DType::kF16 || expected.dtype() == DType::kBF16 ? 4e-3 : 1e-3;
  for (int64_t i = 0; i < expected.numel(); ++i) {
    const double a = actual.get_as_double(i), e = expected.get_as_double(i);
    if (std::isnan(e) && std::isnan(a)) continue;
    if (std::isinf(e) && a == e) continue;
    const bool ok = exact ? a == e : std::abs(a - e) <= 1e-7 + rtol * std::abs(e);
    if (!ok) {
      detail = str_cat("element ", i, ": got ", a, ", expected ", e);
      return false;
    }
  }
  return true;
}

// `kernels`: the backend whose kernels run the case (null: the CPU's).
CaseResult run_case(const fs::path& dir, const std::set<std::string>& supported, const Backend* kernels = nullptr) {
  CaseResult r{dir.filename().string(), case_op(dir), CaseResult::kFail, ""};
  onnx::ModelProto model;
  if (!read_proto(dir / "model.onnx", model)) {
    r.detail = "model.onnx does not parse";
    return r;
  }
  for (const auto& node : model.graph().node()) {
    if ((!node.domain().empty() && node.domain() != "ai.onnx") || !supported.count(node.op_type())) {
      r.kind = CaseResult::kUnsupported;
      r.detail = "op " + node.op_type() + " is not supported";
      return r;
    }
  }
  // memc specializes shapes at compile time: integer inputs (shapes, axes, indices, sizes),
  // scalars (ratios, pad values, range bounds) and Resize's roi and scales become initializers
  // of the model, as an exporter with a fixed batch writes them.
  const fs::path data = dir / "test_data_set_0";
  std::map<std::string, Tensor> feeds;
  auto& graph = *model.mutable_graph();
  std::set<std::string> initializers;
  for (const auto& init : graph.initializer()) initializers.insert(init.name());
  std::set<std::string> static_operands;  // Resize's roi, scales and sizes
  for (const auto& node : graph.node())
    if (node.op_type() == "Resize")
      for (int i = 1; i < node.input_size(); ++i) static_operands.insert(node.input(i));
  int input_index = 0;
  for (const auto& input : graph.input()) {
    if (initializers.count(input.name())) continue;
    onnx::TensorProto proto;
    const fs::path file = data / ("input_" + std::to_string(input_index++) + ".pb");
    if (!fs::exists(file)) break;  // optional inputs left out
    if (!input.type().has_tensor_type() || !read_proto(file, proto)) {
      r.kind = CaseResult::kUnsupported;
      r.detail = "input is not a tensor (sequence or optional type)";
      return r;
    }
    const int elem = input.type().tensor_type().elem_type();
    const bool scalar = proto.dims_size() == 0;  // ratios, pad values, range bounds
    if (elem == onnx::TensorProto::INT64 || elem == onnx::TensorProto::INT32 || scalar || static_operands.count(input.name())) {
      *graph.add_initializer() = proto;
      graph.mutable_initializer(graph.initializer_size() - 1)->set_name(input.name());
      continue;
    }
    Expected<Tensor> t = tensor_from_proto(proto, data.string());
    if (!t.ok()) {
      r.detail = "input: " + t.status().message();
      return r;
    }
    feeds[input.name()] = *t;
  }
  std::string bytes;
  model.SerializeToString(&bytes);
  Expected<Module> module = import_onnx_bytes(bytes, dir.string(), ImportOptions{}, r.name);
  if (!module.ok()) {
    r.detail = "import: " + module.status().message();
    return r;
  }
  Expected<std::vector<Tensor>> outputs = execute(*module, feeds, ExecOptions{.kernels = kernels});
  if (!outputs.ok()) {
    r.detail = "run: " + outputs.status().message();
    return r;
  }
  for (int i = 0; i < graph.output_size(); ++i) {
    onnx::TensorProto proto;
    if (!read_proto(data / ("output_" + std::to_string(i) + ".pb"), proto)) {
      r.detail = str_cat("cannot read output_", i, ".pb");
      return r;
    }
    Expected<Tensor> expected = tensor_from_proto(proto, data.string());
    if (!expected.ok()) {
      r.detail = "expected output: " + expected.status().message();
      return r;
    }
    if (i >= static_cast<int>(outputs->size())) {
      r.detail = str_cat("memc produced ", outputs->size(), " outputs, expected ", graph.output_size());
      return r;
    }
    std::string detail;
    if (!close_enough((*outputs)[i], *expected, detail)) {
      r.detail = str_cat("output ", i, ": ", detail);
      return r;
    }
  }
  r.kind = CaseResult::kPass;
  return r;
}

// "case_name  reason" lines; '#' starts a comment.
std::map<std::string, std::string> read_expected_failures() {
  std::map<std::string, std::string> out;
  std::ifstream in(testing::source_path("tests/onnx_conformance_expected.txt"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t space = line.find_first_of(" \t");
    const std::string name = line.substr(0, space);
    const size_t reason = space == std::string::npos ? std::string::npos : line.find_first_not_of(" \t", space);
    out[name] = reason == std::string::npos ? "" : line.substr(reason);
  }
  return out;
}

// Every node test's folder, sorted.
std::vector<fs::path> node_test_dirs() {
  std::vector<fs::path> dirs;
  for (const auto& entry : fs::directory_iterator(kNodeTestDir)) {
    if (entry.is_directory() && fs::exists(entry.path() / "model.onnx")) dirs.push_back(entry.path());
  }
  std::sort(dirs.begin(), dirs.end());
  return dirs;
}

TEST(OnnxConformance, NodeTests) {
  if (!fs::exists(kNodeTestDir)) GTEST_SKIP() << kNodeTestDir << " missing: install libonnx-testdata";
  std::vector<std::string> ops = supported_onnx_ops();
  const std::set<std::string> supported(ops.begin(), ops.end());
  const auto expected_failures = read_expected_failures();

  const std::vector<fs::path> dirs = node_test_dirs();

  struct Counts {
    int pass = 0, fail = 0, listed = 0, unsupported = 0;
  };
  std::map<std::string, Counts> by_op;
  int passed = 0, failed = 0, listed = 0, unsupported = 0;
  for (const fs::path& dir : dirs) {
    CaseResult r = run_case(dir, supported);
    Counts& c = by_op[r.op];
    auto listed_it = expected_failures.find(r.name);
    if (r.kind == CaseResult::kUnsupported) {
      ++c.unsupported, ++unsupported;
    } else if (r.kind == CaseResult::kPass) {
      ++c.pass, ++passed;
      EXPECT_TRUE(listed_it == expected_failures.end())
          << r.name << " passes but is listed as an expected failure: remove it from the list";
    } else if (listed_it != expected_failures.end()) {
      ++c.listed, ++listed;
    } else {
      ++c.fail, ++failed;
      ADD_FAILURE() << r.name << " (" << r.op << "): " << r.detail;
    }
  }
  std::printf("%-40s %6s %6s %8s %12s\n", "op", "pass", "fail", "listed", "unsupported");
  for (const auto& [op, c] : by_op) {
    if (c.pass + c.fail + c.listed == 0) continue;  // ops memc does not claim
    std::printf("%-40s %6d %6d %8d %12d\n", op.c_str(), c.pass, c.fail, c.listed, c.unsupported);
  }
  std::printf("cases: %zu; outside memc's op set: %d; listed with reasons: %d\n", dirs.size(), unsupported, listed);
  std::printf("conformance: %d passed, %d failed\n", passed, failed);
}

// The same node tests through the CUDA kernels (run as host loops): every case the CPU passes
// must pass on them too, against ONNX's expected outputs, unless one of its memc ops has no CUDA
// kernel (counted per op and printed; those ops are outside the committed models' steps) or it
// computes in float64 (counted: the CUDA backend takes f32, bf16 and f16).
TEST(OnnxConformance, NodeTestsOnTheCudaKernels) {
  if (!fs::exists(kNodeTestDir)) GTEST_SKIP() << kNodeTestDir << " missing: install libonnx-testdata";
  std::vector<std::string> ops = supported_onnx_ops();
  const std::set<std::string> supported(ops.begin(), ops.end());
  const auto expected_failures = read_expected_failures();
  const std::vector<fs::path> dirs = node_test_dirs();
  const testing::HostCudaBackend cuda;
  int passed = 0, failed = 0;
  std::map<std::string, int> no_kernel;  // memc op → cases
  int f64_cases = 0;
  for (const fs::path& dir : dirs) {
    if (expected_failures.count(dir.filename().string()) || run_case(dir, supported).kind != CaseResult::kPass) continue;
    const CaseResult r = run_case(dir, supported, &cuda);
    const std::string missing = "no cuda-on-host kernel for memc.";
    if (r.kind == CaseResult::kPass) {
      ++passed;
    } else if (const size_t at = r.detail.find(missing); at != std::string::npos) {
      const std::string rest = r.detail.substr(at + missing.size());
      ++no_kernel[rest.substr(0, rest.find_first_of(" ("))];
    } else if (r.detail.find("(CUDA kernels take f32, bf16 or f16)") != std::string::npos) {
      ++f64_cases;  // float64 data: the CUDA backend computes in f32, bf16 or f16 by design
    } else {
      ++failed;
      ADD_FAILURE() << r.name << " (" << r.op << ") on the CUDA kernels: " << r.detail;
    }
  }
  std::string missing_ops;
  int missing_cases = 0;
  for (const auto& [op, n] : no_kernel) missing_ops += str_cat(" ", op, " (", n, ")"), missing_cases += n;
  std::printf("CUDA kernels: %d of the CPU's passing cases passed, %d failed; %d compute in float64, which the CUDA kernels do not take; "
              "%d need a memc op without a CUDA kernel:%s\n",
              passed, failed, f64_cases, missing_cases, missing_ops.c_str());
  EXPECT_GT(passed, 0);
}

}  // namespace
}  // namespace memc
