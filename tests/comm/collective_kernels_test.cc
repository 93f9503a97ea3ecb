// The collective ops' kernels (backends/collective_kernels.h) as this job's ranks: the CPU
// backend's, and the CUDA op table's run on the host (tests/cuda/host_cuda_backend.h: the
// same kernel code a GPU rank runs, its copies as host copies), both over the MPI communicator,
// give the expected blocks, and the same bits as each other. Every op: the blocking forms,
// the async pairs (the result held by the start and taken by the done), broadcast and
// shard_block.
#include <gtest/gtest.h>

#include <cstring>

#include "backends/cpu/kernels.h"
#include "ir/grad.h"
#include "ir/graph.h"
#include "ir/ops/ops.h"
#include "tests/comm/mpi_test_util.h"
#include "tests/cuda/host_cuda_backend.h"

namespace memc::comm::testing {
namespace {

// Runs `node`'s kernel from `kernel` on `inputs` into fresh outputs of the node's types.
std::vector<Tensor> run(const Module& m, const Node& node, const Kernel* kernel, const std::vector<const Tensor*>& inputs,
                        std::vector<Tensor> outputs = {}) {
  if (outputs.empty()) {
    for (ValueId v : node.outputs) outputs.push_back(Tensor::zeros(m.value(v).type.dtype, m.value(v).type.shape));
  }
  KernelContext ctx{.node = node, .inputs = inputs, .outputs = {}};
  for (Tensor& t : outputs) ctx.outputs.push_back(&t);
  ctx.comm = g_comm;
  EXPECT_NE(kernel, nullptr) << node.op;
  if (kernel) {
    const Status st = (*kernel)(ctx);
    EXPECT_TRUE(st.ok()) << node.op << ": " << st.message();
  }
  return outputs;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.nbytes() == b.nbytes() && std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

TEST(CollectiveKernels, CudaTableOnTheHostMatchesTheCpuBackend) {
  const int r = g_comm->rank(), n = g_comm->size();
  const int64_t block = 5;
  Module m;
  const Attrs group = make_attrs({{"ranks", int64_t{n}}});
  const Attrs sum = make_attrs({{"ranks", int64_t{n}}, {"reduce", std::string("sum")}});
  const ValueId small = m.add_argument("small", TensorType{DType::kF32, {block, 3}}, Role::kInput);
  const ValueId flat = m.add_argument("flat", TensorType{DType::kF32, {n * block, 3}}, Role::kInput);
  auto node = [&](const std::string& op, std::vector<ValueId> in, const Attrs& attrs) -> NodeId {
    Expected<std::vector<ValueId>> out = m.add_node(op, std::move(in), attrs);
    EXPECT_TRUE(out.ok()) << op << ": " << out.status().message();
    return m.value((*out)[0]).producer;
  };
  Attrs root = group;
  root.set("root", int64_t{n - 1});
  const NodeId gather = node("all_gather", {small}, group), scatter = node("reduce_scatter", {flat}, sum),
               reduce = node("all_reduce", {small}, sum), bcast = node("broadcast", {small}, root),
               shard = node("shard_block", {flat}, group), gather_start = node("all_gather_start", {small}, group),
               scatter_start = node("reduce_scatter_start", {flat}, sum);
  const NodeId gather_done = node("all_gather_done", {m.node(gather_start).outputs[0], small}, group);
  const NodeId scatter_done = node("reduce_scatter_done", {m.node(scatter_start).outputs[0], flat}, sum);

  // Rank r's inputs: element i of `small` is 100·r + i, of `flat` 1000·r + i.
  Tensor x = Tensor::zeros(DType::kF32, {block, 3}), y = Tensor::zeros(DType::kF32, {n * block, 3});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = static_cast<float>(100 * r + i);
  for (int64_t i = 0; i < y.numel(); ++i) y.data<float>()[i] = static_cast<float>(1000 * r + i);

  struct Backend {
    const char* name;
    const Kernel* (*find)(std::string_view);
  };
  const Backend backends[] = {{"cpu", cpu::find_kernel}, {"cuda (host-run)", cuda::ops::find_kernel<memc::testing::HostRunner>}};
  std::vector<std::vector<Tensor>> results;
  for (const Backend& b : backends) {
    SCOPED_TRACE(b.name);
    std::vector<Tensor> got;
    for (NodeId id : {gather, scatter, reduce, bcast, shard}) {
      const Node& nd = m.node(id);
      got.push_back(std::move(run(m, nd, b.find(nd.op), {nd.inputs[0] == small ? &x : &y})[0]));
    }
    // The async pairs: done reads the start's pending result (here done writes over it).
    for (auto [start, done] : {std::pair{gather_start, gather_done}, std::pair{scatter_start, scatter_done}}) {
      const Node& s = m.node(start);
      const Tensor* in = s.inputs[0] == small ? &x : &y;
      std::vector<Tensor> pending = run(m, s, b.find(s.op), {in});
      Tensor borrowed = Tensor::borrow(pending[0].dtype(), pending[0].shape(), pending[0].raw());
      std::vector<Tensor> out;
      out.push_back(std::move(borrowed));
      const Node& d = m.node(done);
      run(m, d, b.find(d.op), {&pending[0], in}, std::move(out));
      got.push_back(std::move(pending[0]));
    }
    // Expected: all_gather's block q is rank q's small; reduce_scatter's element i is
    // Σ_q (1000·q + r·block·3 + i); all_reduce Σ_q (100·q + i); broadcast rank n−1's small;
    // shard_block this rank's block of its own flat.
    const int64_t per = block * 3;
    const double ranks_sum = n * (n - 1) / 2.0;
    for (int64_t i = 0; i < n * per; ++i) EXPECT_EQ(got[0].data<float>()[i], 100 * (i / per) + i % per) << "all_gather " << i;
    for (int64_t i = 0; i < per; ++i) {
      EXPECT_EQ(got[1].data<float>()[i], 1000 * ranks_sum + n * (r * per + i)) << "reduce_scatter " << i;
      EXPECT_EQ(got[2].data<float>()[i], 100 * ranks_sum + n * i) << "all_reduce " << i;
      EXPECT_EQ(got[3].data<float>()[i], 100 * (n - 1) + i) << "broadcast " << i;
      EXPECT_EQ(got[4].data<float>()[i], 1000 * r + r * per + i) << "shard_block " << i;
    }
    EXPECT_TRUE(same_bits(got[5], got[0])) << "all_gather_start/done against all_gather";
    EXPECT_TRUE(same_bits(got[6], got[1])) << "reduce_scatter_start/done against reduce_scatter";
    results.push_back(std::move(got));
  }
  for (size_t i = 0; i < results[0].size(); ++i) EXPECT_TRUE(same_bits(results[0][i], results[1][i])) << "result " << i;
}

}  // namespace
}  // namespace memc::comm::testing
