// The collective ops of the IR (ir/ops/collective.cc): per-rank shapes in the rank-ordered block
// layout, refused attributes and shapes, async start/done pairs in the text form, the bytes one
// rank sends, and the SPMD gradient rules (all_gather ↔ reduce_scatter, all_reduce ↔ itself).
#include <gtest/gtest.h>

#include "ir/grad.h"
#include "ir/op_registry.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "passes/autodiff.h"

namespace memc {
namespace {

Attrs group(int64_t ranks) { return make_attrs({{"ranks", ranks}, {"group", std::string("world")}}); }

Expected<TensorType> result(const std::string& op, std::vector<TensorType> in, Attrs attrs) {
  Module m;
  std::vector<ValueId> args;
  for (const TensorType& t : in) args.push_back(m.add_argument("x", t, Role::kInput));
  auto out = m.add_node(op, args, attrs);
  if (!out.ok()) return out.status();
  return m.value((*out)[0]).type;
}

TEST(CollectiveOps, ShapesFollowTheRankOrderedBlocks) {
  const TensorType shard{DType::kBF16, {3, 5}}, full{DType::kBF16, {12, 5}};
  EXPECT_EQ(*result("all_gather", {shard}, group(4)), full);             // [3,5] → [4·3, 5]
  EXPECT_EQ(*result("reduce_scatter", {full}, group(4)), shard);         // [12,5] → [12/4, 5]
  EXPECT_EQ(*result("all_reduce", {full}, group(4)), full);
  EXPECT_EQ(*result("broadcast", {full}, make_attrs({{"ranks", int64_t{4}}, {"root", int64_t{3}}})), full);
  EXPECT_EQ(*result("all_gather_start", {shard}, group(4)), full);        // the pending buffer
  EXPECT_EQ(*result("all_gather_done", {full, shard}, group(4)), full);
  EXPECT_EQ(*result("reduce_scatter_done", {shard, full}, group(4)), shard);
  EXPECT_EQ(*result("all_gather", {TensorType{DType::kU8, {7}}}, group(1)), (TensorType{DType::kU8, {7}}));
}

TEST(CollectiveOps, RefusalsNameTheProblem) {
  auto expect_refused = [](const std::string& op, std::vector<TensorType> in, Attrs attrs, const std::string& fragment) {
    auto r = result(op, in, attrs);
    ASSERT_FALSE(r.ok()) << op;
    EXPECT_EQ(r.status().kind(), ErrorKind::kBadInput);
    EXPECT_NE(r.status().message().find(fragment), std::string::npos) << r.status().message();
  };
  const TensorType f{DType::kF32, {10}};
  expect_refused("reduce_scatter", {f}, group(4), "dim 0 is not a multiple of 4 ranks (pad the flat buffer)");
  expect_refused("all_gather", {f}, Attrs{}, "attribute 'ranks' 0 outside [1, 2^20]");
  expect_refused("all_gather", {TensorType{DType::kF32, {}}}, group(2), "rank >= 1");
  expect_refused("all_reduce", {f}, make_attrs({{"ranks", int64_t{2}}, {"reduce", std::string("mean")}}), "'mean', not sum or max");
  expect_refused("all_reduce", {TensorType{DType::kBool, {4}}}, group(2), "cannot reduce i1");
  expect_refused("broadcast", {f}, make_attrs({{"ranks", int64_t{2}}, {"root", int64_t{2}}}), "root 2 is not a rank");
  expect_refused("all_gather_done", {f, f}, group(2), "pending buffer is tensor<10xf32>, the collective of tensor<10xf32> gives tensor<20xf32>");
  expect_refused("all_gather", {f}, make_attrs({{"ranks", int64_t{2}}, {"group", int64_t{1}}}), "'group' must be a string");
  expect_refused("split_flat", {f}, make_attrs({{"sizes", std::vector<int64_t>{4, 4}}, {"offsets", std::vector<int64_t>{0, 3}}}),
                 "split_flat piece 1 at 3 overlaps the one before (ends at 4)");
  expect_refused("split_flat", {f}, make_attrs({{"sizes", std::vector<int64_t>{4, 4}}, {"offsets", std::vector<int64_t>{0, 8}}}),
                 "split_flat pieces end at 12, beyond the buffer's 10");
  expect_refused("split_flat", {f}, make_attrs({{"sizes", std::vector<int64_t>{4, 4}}, {"offsets", std::vector<int64_t>{0}}}),
                 "split_flat has 2 sizes and 1 offsets");
}

// A ZeRO-style step in text: gather a parameter shard asynchronously around other work, then
// reduce-scatter its gradient. Round-trips through the printer and parser.
TEST(CollectiveOps, AsyncPairsRoundTripInText) {
  const char* text = R"(func.func @main(%w: tensor<4x8xbf16> {memc.role = "param"}, %g: tensor<16x8xf32> {memc.role = "input"}) -> (tensor<16x8xbf16>, tensor<4x8xf32>, tensor<f32>) {
  %pending = "memc.all_gather_start"(%w) {group = "world", ranks = 4 : i64} : (tensor<4x8xbf16>) -> tensor<16x8xbf16>
  %norm = "memc.reduce_sum_square"(%g) {axes = array<i64>, keepdims = 0 : i64} : (tensor<16x8xf32>) -> tensor<f32>
  %full = "memc.all_gather_done"(%pending, %w) {group = "world", ranks = 4 : i64} : (tensor<16x8xbf16>, tensor<4x8xbf16>) -> tensor<16x8xbf16>
  %shard = "memc.reduce_scatter"(%g) {ranks = 4 : i64, reduce = "sum"} : (tensor<16x8xf32>) -> tensor<4x8xf32>
  %total = "memc.all_reduce"(%norm) {ranks = 4 : i64, reduce = "sum"} : (tensor<f32>) -> tensor<f32>
  "func.return"(%full, %shard, %total) : (tensor<16x8xbf16>, tensor<4x8xf32>, tensor<f32>) -> ()
}
)";
  auto parsed = parse_module(text);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  ASSERT_TRUE(verify(*parsed).ok()) << verify(*parsed).message();
  EXPECT_EQ(print_module(*parse_module(print_module(*parsed))), print_module(*parsed));
  // Bytes one rank sends (ring): all_gather (R−1)/R of 16·8·2 = 192; reduce_scatter (R−1)/R of
  // 16·8·4 = 384; all_reduce of one f32 2·(R−1)/R·4 = 6; the done op counts nothing.
  std::map<std::string, int64_t> sent;
  for (NodeId n : parsed->schedule()) sent[parsed->node(n).op] = collective_wire_bytes(*parsed, parsed->node(n));
  EXPECT_EQ(sent["all_gather_start"], 192);
  EXPECT_EQ(sent["all_gather_done"], 0);
  EXPECT_EQ(sent["reduce_scatter"], 384);
  EXPECT_EQ(sent["all_reduce"], 6);
  EXPECT_EQ(sent["reduce_sum_square"], 0);
  // Flops: the reductions' additions, (R−1) per reduced element.
  for (NodeId n : parsed->schedule()) {
    const Node& node = parsed->node(n);
    if (node.op == "reduce_scatter") {
      EXPECT_EQ(node_flops(*parsed, node), 3 * 32);
    }
    if (node.op == "all_gather_start" || node.op == "all_gather_done") {
      EXPECT_EQ(node_flops(*parsed, node), 0);
    }
    if (node.op.starts_with("all_") || node.op.starts_with("reduce_scatter")) {
      EXPECT_TRUE(OpRegistry::get().find(node.op)->flags & kOpCollective) << node.op;
    }
  }
  EXPECT_TRUE(OpRegistry::get().find("all_gather_done")->flags & kOpInplaceOk);
}

int count_op(const Module& m, const std::string& op) {
  int n = 0;
  for (NodeId id : m.schedule()) n += m.node(id).op == op;
  return n;
}

// FSDP in miniature: the loss reads the gathered parameter; its gradient is the reduce-scatter of
// the gathered gradient, which is again the shard's shape.
TEST(CollectiveOps, GradientOfAllGatherIsReduceScatter) {
  Module m;
  const ValueId shard = m.add_argument("w", {DType::kF32, {2, 3}}, Role::kParam);
  auto full = m.add_node("all_gather", {shard}, group(2));
  ASSERT_TRUE(full.ok());
  auto total = m.add_node("all_reduce", {(*full)[0]}, make_attrs({{"ranks", int64_t{2}}, {"reduce", std::string("sum")}}));
  ASSERT_TRUE(total.ok());
  auto loss = m.add_node("reduce_sum", {(*total)[0]}, make_attrs({{"axes", std::vector<int64_t>{}}, {"keepdims", int64_t{0}}}));
  ASSERT_TRUE(loss.ok());
  m.set_outputs({(*loss)[0]});
  auto grads = Autodiff().run(m, (*loss)[0], {shard});
  ASSERT_TRUE(grads.ok()) << grads.status().message();
  EXPECT_EQ(m.value((*grads)[0]).type, (TensorType{DType::kF32, {2, 3}}));
  EXPECT_EQ(count_op(m, "reduce_scatter"), 1);
  EXPECT_EQ(count_op(m, "all_reduce"), 2);  // forward, and its own gradient
  const NodeId producer = m.value((*grads)[0]).producer;
  EXPECT_EQ(m.node(producer).op, "reduce_scatter");
  EXPECT_EQ(m.node(producer).attrs.get_string("group", ""), "world");

  Module bad;
  const ValueId x = bad.add_argument("x", {DType::kF32, {4}}, Role::kParam);
  auto maxed = bad.add_node("all_reduce", {x}, make_attrs({{"ranks", int64_t{2}}, {"reduce", std::string("max")}}));
  auto sum = bad.add_node("reduce_sum", {(*maxed)[0]}, make_attrs({{"axes", std::vector<int64_t>{}}, {"keepdims", int64_t{0}}}));
  ASSERT_TRUE(sum.ok());
  auto refused = Autodiff().run(bad, (*sum)[0], {x});
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("reduce = max has no gradient rule"), std::string::npos) << refused.status().message();
}

}  // namespace
}  // namespace memc
