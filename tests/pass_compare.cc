#include "tests/pass_compare.h"

#include <gtest/gtest.h>

#include <cmath>
#include <algorithm>
#include <cstring>

#include "runtime/dataset.h"
#include "runtime/trainer.h"
#include "tests/test_util.h"

namespace memc::testing {

Plan compile_committed(const std::string& model, const CompileOptions& options) {
  const std::string path = source_path("models/" + model + ".onnx");
  auto plan = compile_model(path, path + ".plan", options);
  MEMC_CHECK(plan.ok(), plan.status().message());
  plan->model_path = path;
  return std::move(plan).value();
}

std::map<std::string, Tensor> first_step_gradients(const Plan& plan, const std::string& data) {
  std::vector<InputSpec> specs;
  for (ValueId a : plan.train.arguments()) {
    const Value& v = plan.train.value(a);
    if (v.role == Role::kInput && v.source_name != kLabelsArg) specs.push_back({v.source_name, v.type});
  }
  auto dataset = load_dataset(source_path("data/" + data), specs, label_spec(plan.train, plan.num_classes));
  MEMC_CHECK(dataset.ok(), dataset.status().message());
  std::vector<int64_t> order(static_cast<size_t>(dataset->size));
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  auto state = initial_state("", plan);
  MEMC_CHECK(state.ok(), state.status().message());
  auto grads = compute_gradients(plan, *state, *make_batch(*dataset, order, 0, plan.batch, specs, kLabelsArg), 0, 1);
  MEMC_CHECK(grads.ok(), grads.status().message());
  for (auto& [name, t] : *grads) {
    if (t.dtype() != DType::kF32) t = t.cast(DType::kF32);
  }
  return std::move(grads).value();
}

GradientDiff compare_gradients(const std::map<std::string, Tensor>& got, const std::map<std::string, Tensor>& want) {
  GradientDiff out;
  double diff_sq = 0, ref_sq = 0, largest = 0;
  std::map<std::string, std::pair<double, double>> per_param;  // name → (‖g − g₀‖², ‖g₀‖²)
  for (const auto& [name, w] : want) {
    auto it = got.find(name);
    if (it == got.end() || it->second.shape() != w.shape()) {
      out.missing = name;
      out.bit_identical = false;
      continue;
    }
    const Tensor& g = it->second;
    out.bit_identical = out.bit_identical && std::memcmp(g.raw(), w.raw(), w.nbytes()) == 0;
    if (name == "loss") {
      out.loss_rel = std::abs(g.get_as_double(0) - w.get_as_double(0)) / std::abs(w.get_as_double(0));
      continue;
    }
    double d = 0, r = 0;
    for (int64_t i = 0; i < g.numel(); ++i) {
      const double a = g.get_as_double(i), b = w.get_as_double(i);
      d += (a - b) * (a - b), r += b * b;
    }
    diff_sq += d, ref_sq += r;
    per_param[name] = {d, r};
    largest = std::max(largest, std::sqrt(r));
  }
  for (const auto& [name, dr] : per_param) {
    const auto [d, r] = dr;
    if (std::sqrt(r) < 1e-4 * largest || r == 0) continue;
    if (std::sqrt(d / r) > out.worst_param_rel) out.worst_param_rel = std::sqrt(d / r), out.worst_param = name;
  }
  out.grad_rel_l2 = ref_sq > 0 ? std::sqrt(diff_sq / ref_sq) : std::sqrt(diff_sq);
  return out;
}

int64_t measured_peak(const Plan& plan, const std::string& data, int64_t steps) {
  RunOptions run{.data = source_path("data/" + data), .steps = steps, .seed = 0, .quiet = true};
  auto report = run_plan("", plan, run);
  EXPECT_TRUE(report.ok()) << report.status().message();
  if (!report.ok()) return -1;
  EXPECT_EQ(report->losses.size(), static_cast<size_t>(steps));
  for (double l : report->losses) EXPECT_TRUE(std::isfinite(l));
  return report->measured_peak_bytes;
}

}  // namespace memc::testing
