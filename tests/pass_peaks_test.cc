// No memory pass raises the planned peak: on every committed model (each models/<name>.ref.npz,
// at the reference's batch and sequence length), each pass is compiled against the same options
// without it. A pass that cannot apply (micro-batches on an export that fixes its batch) is
// skipped, saying so, as is bf16-mixed where a model's activations weigh less than its
// weights (below). (Tiled attention on the block-sparse BigBird export was an exception until
// the fusion stopped copying keys it cannot save: frontend/fuse_attention.cc, bench/journal/2026.md §24.)
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <functional>

#include "planner/compile.h"
#include "runtime/npz.h"
#include "tests/test_util.h"

namespace memc {
namespace {

namespace fs = std::filesystem;

std::vector<std::string> committed_models() {
  std::vector<std::string> names;
  const std::string suffix = ".ref.npz";
  for (const auto& entry : fs::directory_iterator(testing::source_path("models"))) {
    const std::string file = entry.path().filename().string();
    if (file.size() > suffix.size() && file.compare(file.size() - suffix.size(), suffix.size(), suffix) == 0)
      names.push_back(file.substr(0, file.size() - suffix.size()));
  }
  std::sort(names.begin(), names.end());
  return names;
}

// The reference's batch and sequence length (as tests/models_test.cc reads them).
CompileOptions reference_options(const std::string& model) {
  auto ref = read_npz(testing::source_path("models/" + model + ".ref.npz"));
  MEMC_CHECK(ref.ok(), ref.status().message());
  CompileOptions o;
  o.batch = ref->at("logits").shape().at(0);
  for (const auto& [key, t] : *ref)
    if (t.rank() == 2 && !is_float(t.dtype()) && key != "labels") o.seq = t.shape()[1];
  o.optimizer.kind = "adamw";
  return o;
}

struct Pass {
  std::string name;
  std::function<void(CompileOptions&)> without, with;
};

std::vector<Pass> memory_passes(int64_t activation_bytes) {
  auto nothing = [](CompileOptions&) {};
  return {
      {"remat blocks", nothing, [](CompileOptions& o) { o.remat.policy = RematPolicy::kBlocks; }},
      {"remat limit", nothing, [=](CompileOptions& o) { o.remat = {.policy = RematPolicy::kLimit, .limit_bytes = activation_bytes / 4}; }},
      {"2 micro-batches", nothing, [](CompileOptions& o) { o.micro_batches = 2; }},
      {"offload optimizer", nothing, [](CompileOptions& o) { o.offload = OffloadLevel::kOptimizer; }},
      {"bf16-mixed", nothing, [](CompileOptions& o) { o.precision = PrecisionKind::kBf16Mixed; }},
      {"tiled attention", [](CompileOptions& o) { o.attention = AttentionKernel::kNaive; }, [](CompileOptions& o) { o.attention = AttentionKernel::kTiled; }},
  };
}

class PassPeaks : public ::testing::TestWithParam<std::string> {};

TEST_P(PassPeaks, NoMemoryPassRaisesThePeak) {
  const std::string path = testing::source_path("models/" + GetParam() + ".onnx");
  ModelCompiler compiler(path, path + ".plan");
  const CompileOptions base = reference_options(GetParam());
  auto plain = compiler.compile(base);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  for (const Pass& pass : memory_passes(plain->memory.category_peak_bytes.at("activations"))) {
    CompileOptions without = base, with = base;
    pass.without(without);
    pass.with(with);
    auto before = compiler.compile(without);
    auto after = compiler.compile(with);
    ASSERT_TRUE(before.ok()) << pass.name << ": " << before.status().message();
    // Micro-batches are refused where the export fixes its batch, and where a BatchNorm in
    // train() normalizes with the batch's statistics (each micro-batch would take its own).
    const std::string refused = after.ok() ? "" : after.status().message();
    if (with.micro_batches > 1 && (refused.find("the export fixes") != std::string::npos ||
                                   refused.find("normalizes with its batch's statistics") != std::string::npos)) {
      std::printf("[peaks] %s: %s skipped: %s\n", GetParam().c_str(), pass.name.c_str(), after.status().message().c_str());
      continue;
    }
    ASSERT_TRUE(after.ok()) << pass.name << ": " << after.status().message();
    // bf16-mixed keeps f32 master weights and adds a 16-bit copy of each (half their bytes), and
    // its 16-bit GEMMs take their own scratch (oneDNN's bf16 matmul scratchpad, which depends on
    // the CPU: pad_fold_net_t215's grows 26 → 49 KiB on a Xeon with avx512_bf16). It can lower
    // the peak only by the activations it halves. Where those are fewer bytes than the copies
    // and the scratch it adds (a model of weights and little else: moe_net's experts at batch
    // 4; a tiny net whose peak is mostly scratch), the mode is not a memory pass, and the
    // planner's search never takes it for memory.
    const auto& peak = before->memory.category_peak_bytes;
    auto category = [](const std::map<std::string, int64_t>& m, const char* name) { return m.count(name) ? m.at(name) : int64_t{0}; };
    const int64_t added_scratch = std::max<int64_t>(0, category(after->memory.category_peak_bytes, "workspace") - category(peak, "workspace"));
    if (pass.name == "bf16-mixed" && category(peak, "activations") / 2 < category(peak, "params") / 2 + added_scratch) {
      std::printf("[peaks] %s: bf16-mixed %lld B, without %lld B: not a memory pass here (activations %lld B, weights %lld B, "
                  "scratch added %lld B)\n",
                  GetParam().c_str(), static_cast<long long>(after->memory.predicted_peak_bytes),
                  static_cast<long long>(before->memory.predicted_peak_bytes), static_cast<long long>(category(peak, "activations")),
                  static_cast<long long>(category(peak, "params")), static_cast<long long>(added_scratch));
      continue;
    }
    std::printf("[peaks] %s: %s %lld B, without %lld B%s\n", GetParam().c_str(), pass.name.c_str(),
                static_cast<long long>(after->memory.predicted_peak_bytes), static_cast<long long>(before->memory.predicted_peak_bytes),
                after->remat_outcome.kept_without_remat ? " (remat planned higher: kept the step without it)" : "");
    EXPECT_LE(after->memory.predicted_peak_bytes, before->memory.predicted_peak_bytes) << pass.name;
  }
}

INSTANTIATE_TEST_SUITE_P(Committed, PassPeaks, ::testing::ValuesIn(committed_models()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace memc
