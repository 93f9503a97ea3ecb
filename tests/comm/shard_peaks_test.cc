// Planned = measured device peak, to the byte, on every rank of a sharded run (issue 32): ViTs of
// 12 shapes (odd widths, 1 to 5 layers, 1 and 3 channels, other patch grids, batches the ranks
// do not divide) × zero1/2/3 × fp32/bf16-mixed, with the offload levels in turn (streamed
// parameters with zero3), each planned for
// 2 compute threads and run with 1, as a rank bound to one core runs (mpirun's default binding:
// its oneDNN scratchpads are smaller than planned, and the run still takes the planned workspace).
// Run as 2 and 3 ranks (tests/CMakeLists.txt); every rank builds the same files in its own folder.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "passes/offload.h"
#include "passes/precision.h"
#include "passes/shard.h"
#include "planner/compile.h"
#include "runtime/host_memory.h"
#include "runtime/npz.h"
#include "runtime/plan.h"
#include "runtime/trainer.h"
#include "tests/comm/mpi_test_util.h"
#include "tests/vit_builder.h"

namespace memc::comm::testing {
namespace {

using memc::testing::VitShape;

struct PeakCase {
  VitShape vit;
  int64_t batch;
};

// image, patch, channels, hidden, heads, layers, mlp, classes; batch.
const PeakCase kShapes[] = {
    {{8, 4, 1, 16, 2, 2, 32, 10}, 8},  {{8, 2, 1, 20, 4, 3, 40, 10}, 9},  {{12, 4, 3, 18, 3, 5, 36, 7}, 10},
    {{8, 4, 1, 22, 2, 3, 44, 10}, 7},  {{16, 4, 3, 30, 5, 3, 60, 5}, 8},  {{8, 4, 1, 26, 2, 5, 52, 10}, 11},
    {{12, 3, 1, 14, 7, 3, 28, 10}, 6}, {{8, 8, 3, 34, 2, 2, 68, 3}, 9},   {{16, 8, 1, 42, 6, 4, 84, 10}, 8},
    {{8, 4, 1, 10, 5, 5, 20, 10}, 10}, {{12, 6, 3, 38, 2, 3, 76, 4}, 5},  {{8, 2, 1, 12, 3, 1, 24, 10}, 12},
};

// The model and two batches of random data, in this rank's folder.
struct CaseFiles {
  std::string model, data;
};
CaseFiles write_case(const std::filesystem::path& dir, const PeakCase& c) {
  std::filesystem::create_directories(dir);
  CaseFiles f{(dir / (c.vit.name() + ".onnx")).string(), (dir / (c.vit.name() + ".npz")).string()};
  std::ofstream(f.model, std::ios::binary) << memc::testing::build_vit_onnx(c.vit);
  const int64_t n = 2 * c.batch;
  Tensor x = memc::testing::vit_random({n, c.vit.channels, c.vit.image, c.vit.image}, 1.0, 99);
  Tensor y = Tensor::zeros(DType::kI64, {n});
  for (int64_t i = 0; i < n; ++i) y.data<int64_t>()[i] = (i * 7) % c.vit.classes;
  EXPECT_TRUE(write_npz(f.data, {{"x", x}, {"y", y}}).ok());
  return f;
}

TEST(ShardPeaks, MeasuredEqualsPlannedOnEveryRankForViTsOfManyShapes) {
  MpiCommunicator& comm = *g_comm;
  const int64_t ranks = comm.size();
  const std::filesystem::path dir = std::filesystem::temp_directory_path() / str_cat("memc_shard_peaks_", getpid());
  const char* stages[] = {"zero1", "zero2", "zero3"};
  const char* precisions[] = {"fp32", "bf16-mixed"};
  const char* offloads[] = {"none", "optimizer", "params"};
  int cases = 0, turn = 0;
  for (const PeakCase& c : kShapes) {
    const CaseFiles files = write_case(dir, c);
    for (const char* stage : stages) {
      for (const char* precision : precisions) {
        // Streamed parameters are zero3's (each rank streams its shards); zero1/2 take the others.
        const char* offload = offloads[turn++ % (std::string(stage) == "zero3" ? 3 : 2)];
        const std::string what = str_cat(c.vit.name(), " b", c.batch, " ", ranks, " ranks ", stage, " ", precision, " offload ", offload);
        CompileOptions options;
        options.batch = c.batch;
        options.precision = *parse_precision(precision);
        options.shard = *parse_shard(stage, ranks);
        options.offload = *parse_offload_level(offload);
        set_compute_threads(2);  // the plan's workspaces: 2 threads' scratchpads
        options.threads = 2;
        const std::string plan_path = (dir / "case.plan").string();
        Expected<Plan> plan = compile_model(files.model, plan_path, options);
        ASSERT_TRUE(plan.ok()) << what << ": " << plan.status().message();
        plan->threads = 2;
        ASSERT_TRUE(write_plan(plan_path, *plan).ok()) << what;
        set_compute_threads(1);  // the run's: one core per rank
        RunOptions run{.data = files.data, .steps = 1, .quiet = true, .comm = &comm};
        Expected<RunReport> report = run_plan(plan_path, *plan, run);
        ASSERT_TRUE(report.ok()) << what << ": " << report.status().message();
        ASSERT_EQ(report->rank_peak_bytes.size(), static_cast<size_t>(ranks)) << what;
        for (int64_t r = 0; r < ranks; ++r) {
          EXPECT_EQ(report->rank_peak_bytes[r], plan->memory.predicted_peak_bytes) << what << ": rank " << r;
        }
        ++cases;
      }
    }
  }
  std::filesystem::remove_all(dir);
  EXPECT_EQ(cases, 72);
  if (comm.rank() == 0) std::printf("[shard peaks] %d plans on %lld ranks: measured = planned on every rank\n", cases, static_cast<long long>(ranks));
}

}  // namespace
}  // namespace memc::comm::testing
