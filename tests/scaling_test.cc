// Scale on paper (issue 39): the per-rank peak memc predicts for ZeRO-3 at 8 to 512 GPUs, against
// the published formula, and NCCL's collective cost model (planner/cost_model.h). No GPU needed.
//
// ZeRO's model states under mixed precision with Adam are 16Ψ/N bytes per rank (Rajbhandari et
// al. 2020, §5: DeepSpeed keeps 2Ψ fp16 parameters, 2Ψ fp16 gradients and 12Ψ of fp32 master
// weights, momentum and variance). memc's bf16-mixed keeps the fp32 parameter itself as the master
// and casts on use, so its bytes are 4 (parameter) + 8 (AdamW's two moments) = 12Ψ/N held for the
// whole step, partitioned the same way, plus the fp32 gradient shards. Without clipping or loss
// scaling, a unit's update needs only its own reduce-scattered gradient, and the memory-aware
// schedule runs it as soon as that completes: a rank holds about one unit's gradient shard at a
// time, not 4Ψ/N. Each unit's flat buffer is padded to a multiple of N (passes/shard.h), which
// adds less than one element per unit per rank.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "planner/compile.h"
#include "planner/cost_model.h"
#include "tests/test_util.h"

namespace memc {
namespace {

struct ScaledModel {
  const char* file;
  int64_t params;         // Ψ, from the export scripts (models/README.md)
  int64_t rank_batch;     // samples per rank
  int64_t seq;            // -1: an image model
};

constexpr ScaledModel kModels[] = {
    {"models/vit_l_16_skeleton.onnx", 304'326'632, 8, -1},
    {"models/vit_h_14_skeleton.onnx", 632'045'800, 8, -1},
    {"models/gpt_6b7_skeleton.onnx", 6'658'404'352, 1, 2048},
};

Plan compile_zero3(const ScaledModel& m, int64_t devices) {
  CompileOptions o;
  o.batch = m.rank_batch * devices;
  o.seq = m.seq;
  o.optimizer.kind = "adamw";
  o.precision = PrecisionKind::kBf16Mixed;
  o.target = "h200";
  auto shard = parse_shard("zero3", devices);
  EXPECT_TRUE(shard.ok());
  o.shard = *shard;
  const std::string path = testing::source_path(m.file);
  auto plan = compile_model(path, path + ".plan", o);
  EXPECT_TRUE(plan.ok()) << m.file << " on " << devices << ": " << plan.status().message();
  return plan.ok() ? *plan : Plan{};
}

TEST(Zero3Scaling, ParamsAndMomentsAreTwelvePsiOverNAndGradientsOneUnitAtATime) {
  for (const ScaledModel& m : kModels) {
    int64_t previous_peak = 0, rest_at_8 = 0;
    for (const int64_t n : {8, 64, 512}) {
      const Plan plan = compile_zero3(m, n);
      ASSERT_EQ(plan.devices, n);
      const auto& cat = plan.memory.category_peak_bytes;
      const int64_t params = cat.at("params"), grads = cat.at("grads"), moments = cat.at("optimizer_state");
      const int64_t states = params + grads + moments + cat.at("master_weights");
      const double formula = 16.0 * static_cast<double>(m.params) / static_cast<double>(n);
      std::printf("[zero3] %s N=%lld: states %lld B (params %lld, grads %lld, moments %lld), 16Ψ/N %.0f B, peak %lld B, "
                  "DeepSpeed 4·largest + 18Ψ/N is beside it in bench/scale_zero3.sh\n",
                  m.file, static_cast<long long>(n), static_cast<long long>(states), static_cast<long long>(params),
                  static_cast<long long>(grads), static_cast<long long>(moments), formula,
                  static_cast<long long>(plan.memory.predicted_peak_bytes));
      // Parameters and moments: exactly 12Ψ/N but for padding. Each of a unit's state buffers has
      // under one element of the unit's padding and is rounded up to the memory plan's 64 bytes,
      // under 4 + 60 bytes per buffer, and these models have under 64 units.
      const double held = 12.0 * static_cast<double>(m.params) / static_cast<double>(n);
      EXPECT_GE(static_cast<double>(params + moments), held);
      EXPECT_LE(static_cast<double>(params + moments), held + 3 * 64.0 * 64);
      EXPECT_EQ(moments, 2 * params);
      EXPECT_EQ(cat.at("master_weights"), 0);  // the fp32 parameter is the master
      // Gradients: each unit's shard lives from its reduce-scatter to its update. At least the
      // largest unit's shard, and at most the three largest units': at the step's end, where
      // little else is live, the schedule may finish the last units' reduce-scatters before
      // their updates. Either way far below the whole 4Ψ/N.
      const std::vector<int64_t> blocks = plan.train.metadata().get_ints("memc.shard.blocks");
      ASSERT_GE(blocks.size(), 3u);
      std::vector<int64_t> sorted = blocks;
      std::sort(sorted.rbegin(), sorted.rend());
      EXPECT_GE(grads, 4 * sorted[0]);
      EXPECT_LE(grads, 4 * (sorted[0] + sorted[1] + sorted[2]) + 3 * 64);
      EXPECT_LT(static_cast<double>(grads), 0.15 * 4.0 * static_cast<double>(m.params) / static_cast<double>(n));
      EXPECT_LE(static_cast<double>(states), formula);  // within ZeRO's 16Ψ/N
      // The rest of the peak (activations, the gathered units, workspace) does not depend on N:
      // each rank runs the same step on its own samples.
      const int64_t rest = plan.memory.predicted_peak_bytes - plan.memory.breakdown.at("params") -
                           plan.memory.breakdown.at("optimizer_state") - plan.memory.breakdown.at("grads");
      if (n == 8) rest_at_8 = rest;
      EXPECT_NEAR(static_cast<double>(rest), static_cast<double>(rest_at_8), 0.01 * static_cast<double>(rest_at_8))
          << m.file << " N=" << n;
      if (previous_peak > 0) EXPECT_LT(plan.memory.predicted_peak_bytes, previous_peak);
      previous_peak = plan.memory.predicted_peak_bytes;
      // A step that communicates: its collectives are estimated and partly hidden by compute.
      EXPECT_GT(plan.estimated_comm_ms, 0);
      EXPECT_LE(plan.estimated_comm_exposed_ms, plan.estimated_comm_ms);
      EXPECT_EQ(plan.interconnect, "nvlink, 8 GPUs per node");
    }
  }
}

DeviceProfile h200(const std::string& interconnect = "nvlink") {
  DeviceProfile p = *device_profile("h200");
  EXPECT_TRUE(set_interconnect(p, interconnect, 8).ok());
  return p;
}

TEST(NcclModel, LargeMessagesRunAtTheBusBandwidth) {
  // nccl-tests' definition: bus bandwidth = bytes · (n−1)/n / time for all_gather and
  // reduce_scatter, · 2(n−1)/n for all_reduce. A 4 GiB buffer is far past every latency.
  const int64_t bytes = int64_t{4} << 30;
  for (const char* op : {"all_gather", "reduce_scatter", "all_reduce"}) {
    for (const int64_t n : {2, 8}) {
      const double factor = (std::string(op) == "all_reduce" ? 2.0 : 1.0) * static_cast<double>(n - 1) / static_cast<double>(n);
      const double busbw = static_cast<double>(bytes) * factor / collective_seconds(h200(), op, bytes, n);
      EXPECT_NEAR(busbw, 3.6e11, 0.01 * 3.6e11) << op << " on " << n;  // NVLink 4 within a node
      // Every rank over its own 400 Gb/s NIC: 90% of 50 GB/s.
      const double over_ib = static_cast<double>(bytes) * factor / collective_seconds(h200("ib"), op, bytes, n);
      EXPECT_NEAR(over_ib, 4.5e10, 0.01 * 4.5e10) << op << " on " << n;
    }
  }
  // Across nodes, a node's eight NICs carry what its NVLink does: 8 · 50 GB/s · 0.9 = 360 GB/s.
  const double across = static_cast<double>(bytes) * 63.0 / 64.0 / collective_seconds(h200(), "all_gather", bytes, 64);
  EXPECT_NEAR(across, 3.6e11, 0.03 * 3.6e11);  // 64 ranks' ring latency: 0.3 ms of 12
  // Four GPUs per node: four NICs, 180 GB/s.
  DeviceProfile four = *device_profile("h200");
  ASSERT_TRUE(set_interconnect(four, "nvlink", 4).ok());
  const double four_bw = static_cast<double>(bytes) * 63.0 / 64.0 / collective_seconds(four, "all_gather", bytes, 64);
  EXPECT_NEAR(four_bw, 1.8e11, 0.03 * 1.8e11);
}

TEST(NcclModel, SmallMessagesPayLatencyAndTreesScaleAsTheLogarithm) {
  // A ring's latency grows with the rank count; the tree's with log2 of the nodes: at 512 ranks
  // a small all_reduce takes the tree, and costs far less than 64 times its 8-rank time.
  const double t8 = collective_seconds(h200(), "all_reduce", 4096, 8);
  const double t512 = collective_seconds(h200(), "all_reduce", 4096, 512);
  EXPECT_GT(t8, 5e-6);  // NCCL's base latency, a few µs
  EXPECT_LT(t512 / t8, 10.0);
  // All-gather has only the ring: its small-message time grows with the ranks.
  const double g8 = collective_seconds(h200(), "all_gather", 4096, 8), g512 = collective_seconds(h200(), "all_gather", 4096, 512);
  EXPECT_GT(g512 / g8, 20.0);
  // One rank: nothing to do.
  EXPECT_EQ(collective_seconds(h200(), "all_reduce", 4096, 1), 0.0);
}

TEST(NcclModel, TheFlatModelIsTheWireBytesAndTheInterconnectIsChecked) {
  const DeviceProfile cpu = *device_profile("cpu");
  EXPECT_TRUE(cpu.interconnect.empty());
  EXPECT_DOUBLE_EQ(collective_seconds(cpu, "all_reduce", 1 << 20, 4), 2.0 * (1 << 20) * 3 / 4 / cpu.comm_bandwidth + cpu.comm_latency_s);
  DeviceProfile p = cpu;
  EXPECT_EQ(set_interconnect(p, "nvlink", 8).kind(), ErrorKind::kBadInput);  // not a GPU
  p = *device_profile("h100");
  EXPECT_EQ(set_interconnect(p, "ethernet", 8).kind(), ErrorKind::kBadInput);
  EXPECT_EQ(set_interconnect(p, "nvlink", 0).kind(), ErrorKind::kBadInput);
  EXPECT_EQ(interconnect_name(p), "nvlink, 8 GPUs per node");
  ASSERT_TRUE(set_interconnect(p, "ib", 8).ok());
  EXPECT_EQ(interconnect_name(p), "ib");
}

}  // namespace
}  // namespace memc
