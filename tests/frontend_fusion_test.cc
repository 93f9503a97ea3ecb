// Fusions (pattern in → fused op out, numerics equal to the unfused import), shape folding
// with a dynamic batch, and error cases (garbage, truncation, unsupported ops, skeletons).
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include <gtest/gtest.h>

#include "frontend/onnx_weights.h"
#include "frontend/param_audit.h"
#include "tests/frontend_onnx_builder.h"
#include "tests/test_util.h"

namespace memc {
namespace {

using testing::OnnxBuilder;
using testing::make_tensor;

// Imports with and without fusion, checks the fused op count and equal outputs.
void check_fusion(const OnnxBuilder& b, const std::string& op, int expected, const std::map<std::string, Tensor>& feeds) {
  auto fused = b.import();
  ASSERT_TRUE(fused.ok()) << fused.status().message();
  ImportOptions raw;
  raw.fuse = false;
  auto plain = b.import(raw);
  ASSERT_TRUE(plain.ok()) << plain.status().message();
  EXPECT_EQ(testing::count_op(*fused, op), expected);
  EXPECT_EQ(testing::count_op(*plain, op), 0);
  EXPECT_LT(fused->schedule().size(), plain->schedule().size());
  auto a = execute(*fused, feeds);
  auto r = execute(*plain, feeds);
  ASSERT_TRUE(a.ok()) << a.status().message();
  ASSERT_TRUE(r.ok()) << r.status().message();
  for (size_t i = 0; i < r->size(); ++i) EXPECT_LE(testing::rel_error(a->at(i), r->at(i)), 1e-5);
}

Tensor random(Shape s, int seed) {
  std::mt19937 rng(seed);
  return testing::random_tensor(DType::kF32, s, rng, -2, 2);
}

TEST(FrontendFusion, ErfGeluInEveryOrder) {
  OnnxBuilder b;
  b.input("x", {2, 8}).output("y1").output("y2").output("y3");
  b.scalar("sqrt2", std::sqrt(2.0)).scalar("one", 1).scalar("half", 0.5).scalar("inv", 1 / std::sqrt(2.0));
  // torch: ((x · (erf(x/√2) + 1)) · 0.5)
  b.node("Div", {"x", "sqrt2"}, {"d"});
  b.node("Erf", {"d"}, {"e"});
  b.node("Add", {"e", "one"}, {"p"});
  b.node("Mul", {"x", "p"}, {"m"});
  b.node("Mul", {"m", "half"}, {"y1"});
  // x · (0.5 · (1 + erf(x·(1/√2))))  (x·Φ)
  b.node("Mul", {"inv", "x"}, {"d2"});
  b.node("Erf", {"d2"}, {"e2"});
  b.node("Add", {"one", "e2"}, {"p2"});
  b.node("Mul", {"p2", "half"}, {"phi"});
  b.node("Mul", {"phi", "x"}, {"y2"});
  // (1 + erf) · (x · 0.5)
  b.node("Div", {"x", "sqrt2"}, {"d3"});
  b.node("Erf", {"d3"}, {"e3"});
  b.node("Add", {"e3", "one"}, {"p3"});
  b.node("Mul", {"x", "half"}, {"h3"});
  b.node("Mul", {"p3", "h3"}, {"y3"});
  check_fusion(b, "gelu", 3, {{"x", random({2, 8}, 1)}});
}

// The tanh approximation as GPT-2 (NewGELUActivation), FastGELUActivation and Bloom write it.
TEST(FrontendFusion, TanhGeluInTheModelsAssociations) {
  OnnxBuilder b;
  b.input("x", {2, 8}).output("y1").output("y2").output("y3");
  b.scalar("half", 0.5).scalar("one", 1).scalar("three", 3).scalar("k", 0.044715).scalar("c", std::sqrt(2 / M_PI)).scalar("c8", 0.79788456);
  // GPT-2: 0.5·x · (1 + tanh(c·(x + k·x³)))
  b.node("Mul", {"half", "x"}, {"a"});
  b.node("Pow", {"x", "three"}, {"x3"});
  b.node("Mul", {"k", "x3"}, {"kx3"});
  b.node("Add", {"x", "kx3"}, {"in"});
  b.node("Mul", {"c", "in"}, {"u"});
  b.node("Tanh", {"u"}, {"t"});
  b.node("Add", {"one", "t"}, {"p"});
  b.node("Mul", {"a", "p"}, {"y1"});
  // FastGELU: 0.5·x · (1 + tanh(x·c·(1 + k·x·x)))
  b.node("Mul", {"half", "x"}, {"a2"});
  b.node("Mul", {"x", "c"}, {"xc"});
  b.node("Mul", {"k", "x"}, {"kx"});
  b.node("Mul", {"kx", "x"}, {"kxx"});
  b.node("Add", {"one", "kxx"}, {"q"});
  b.node("Mul", {"xc", "q"}, {"u2"});
  b.node("Tanh", {"u2"}, {"t2"});
  b.node("Add", {"one", "t2"}, {"p2"});
  b.node("Mul", {"a2", "p2"}, {"y2"});
  // Bloom: x·0.5·(1 + tanh(0.79788456·x·(1 + k·x·x)))  (c to 8 digits)
  b.node("Mul", {"c8", "x"}, {"cx"});
  b.node("Mul", {"k", "x"}, {"kx3b"});
  b.node("Mul", {"kx3b", "x"}, {"kxxb"});
  b.node("Add", {"one", "kxxb"}, {"qb"});
  b.node("Mul", {"cx", "qb"}, {"u3"});
  b.node("Tanh", {"u3"}, {"t3"});
  b.node("Add", {"one", "t3"}, {"p3"});
  b.node("Mul", {"x", "half"}, {"xh"});
  b.node("Mul", {"xh", "p3"}, {"y3"});
  // GPT-2's form on a linear's output, the bias added last (an add the walk must stop at)
  b.init("bias", random({8}, 5));
  b.node("Add", {"x", "bias"}, {"z"});
  b.node("Mul", {"half", "z"}, {"a4"});
  b.node("Pow", {"z", "three"}, {"z3"});
  b.node("Mul", {"k", "z3"}, {"kz3"});
  b.node("Add", {"z", "kz3"}, {"in4"});
  b.node("Mul", {"c", "in4"}, {"u4"});
  b.node("Tanh", {"u4"}, {"t4"});
  b.node("Add", {"one", "t4"}, {"p4"});
  b.node("Mul", {"a4", "p4"}, {"y4"});
  b.output("y4");
  check_fusion(b, "gelu", 4, {{"x", random({2, 8}, 4)}});
  auto fused = b.import();
  ASSERT_TRUE(fused.ok());
  for (const Node& n : fused->nodes()) {
    if (!n.dead && n.op == "gelu") {
      EXPECT_EQ(n.attrs.get_string("approximate", ""), "tanh");
    }
  }
}

// Another function, or an intermediate read elsewhere, stays as it is.
TEST(FrontendFusion, TanhGeluNeedsTheFunctionAndItsOwnIntermediates) {
  OnnxBuilder b;
  b.input("x", {2, 8}).output("y1").output("y2").output("t2");
  b.scalar("half", 0.5).scalar("one", 1).scalar("three", 3).scalar("k", 0.05).scalar("k0", 0.044715).scalar("c", std::sqrt(2 / M_PI));
  b.node("Mul", {"half", "x"}, {"a"});
  b.node("Pow", {"x", "three"}, {"x3"});
  b.node("Mul", {"k", "x3"}, {"kx3"});  // 0.05, not 0.044715
  b.node("Add", {"x", "kx3"}, {"in"});
  b.node("Mul", {"c", "in"}, {"u"});
  b.node("Tanh", {"u"}, {"t"});
  b.node("Add", {"one", "t"}, {"p"});
  b.node("Mul", {"a", "p"}, {"y1"});
  b.node("Mul", {"half", "x"}, {"a2"});
  b.node("Pow", {"x", "three"}, {"x3b"});
  b.node("Mul", {"k0", "x3b"}, {"kx3b"});
  b.node("Add", {"x", "kx3b"}, {"in2"});
  b.node("Mul", {"c", "in2"}, {"u2"});
  b.node("Tanh", {"u2"}, {"t2"});  // also a graph output
  b.node("Add", {"one", "t2"}, {"p2"});
  b.node("Mul", {"a2", "p2"}, {"y2"});
  auto m = b.import();
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(testing::count_op(*m, "gelu"), 0);
  EXPECT_EQ(testing::count_op(*m, "tanh"), 2);
}

TEST(FrontendFusion, LayerNormReduceMeanForm) {
  OnnxBuilder b(13);
  b.input("x", {2, 3, 8}).output("y");
  b.init("gamma", random({8}, 2)).init("beta", random({8}, 3));
  b.scalar("two", 2).scalar("eps", 1e-5);
  auto& m1 = b.node("ReduceMean", {"x"}, {"mean"});
  testing::attr_ints(m1, "axes", {-1});
  b.node("Sub", {"x", "mean"}, {"d"});
  b.node("Pow", {"d", "two"}, {"sq"});
  auto& m2 = b.node("ReduceMean", {"sq"}, {"var"});
  testing::attr_ints(m2, "axes", {-1});
  b.node("Add", {"var", "eps"}, {"ve"});
  b.node("Sqrt", {"ve"}, {"std"});
  b.node("Div", {"d", "std"}, {"n"});
  b.node("Mul", {"n", "gamma"}, {"s"});
  b.node("Add", {"s", "beta"}, {"y"});
  check_fusion(b, "layernorm", 1, {{"x", random({2, 3, 8}, 4)}});
}

TEST(FrontendFusion, LinearFromTransposeMatMulAddAndGemm) {
  OnnxBuilder b;
  b.input("x", {2, 3, 4}).input("x2", {5, 4}).output("y").output("g");
  b.init("w", random({6, 4}, 5)).init("bias", random({6}, 6)).init("w2", random({3, 4}, 7)).init("b2", random({3}, 8));
  auto& t = b.node("Transpose", {"w"}, {"wt"});
  testing::attr_ints(t, "perm", {1, 0});
  b.node("MatMul", {"x", "wt"}, {"mm"});
  b.node("Add", {"bias", "mm"}, {"y"});
  auto& g = b.node("Gemm", {"x2", "w2", "b2"}, {"g"});
  testing::attr_i(g, "transB", 1);
  check_fusion(b, "linear", 2, {{"x", random({2, 3, 4}, 9)}, {"x2", random({5, 4}, 10)}});
}

// torch's MHA export: q·√s and kᵀ·√s, masked softmax, dropout, ·v.
TEST(FrontendFusion, AttentionWithSplitScaleMaskAndDropout) {
  OnnxBuilder b;
  b.input("q", {2, 2, 5, 4}).input("k", {2, 2, 5, 4}).input("v", {2, 2, 5, 4}).output("y");
  b.init("mask", make_tensor(DType::kF32, {1, 1, 1, 5}, {0, 0, 0, -1e9, -1e9}));
  b.scalar("rs", std::sqrt(0.5)).scalar("ratio", 0.1);
  Tensor t = Tensor::zeros(DType::kBool, {});
  t.data<bool>()[0] = true;
  b.init("train", t);
  b.node("Mul", {"q", "rs"}, {"qs"});
  auto& tr = b.node("Transpose", {"k"}, {"kt"});
  testing::attr_ints(tr, "perm", {0, 1, 3, 2});
  b.node("Mul", {"kt", "rs"}, {"ks"});
  b.node("MatMul", {"qs", "ks"}, {"s"});
  b.node("Add", {"s", "mask"}, {"sm"});
  auto& sm = b.node("Softmax", {"sm"}, {"p"});
  testing::attr_i(sm, "axis", -1);
  b.node("Dropout", {"p", "ratio", "train"}, {"pd", "pmask"});
  b.node("MatMul", {"pd", "v"}, {"y"});
  check_fusion(b, "attention", 1, {{"q", random({2, 2, 5, 4}, 11)}, {"k", random({2, 2, 5, 4}, 12)}, {"v", random({2, 2, 5, 4}, 13)}});
  auto m = b.import();
  for (NodeId n : m->schedule()) {
    if (m->node(n).op != "attention") continue;
    EXPECT_NEAR(m->node(n).attrs.get_float("scale", 0), 0.5, 1e-6);
    EXPECT_NEAR(m->node(n).attrs.get_float("dropout_ratio", 0), 0.1, 1e-6);
    EXPECT_EQ(m->node(n).inputs.size(), 4u);
  }
}

// HF style: (q·kᵀ)/√d + mask → softmax → ·v, kᵀ from a 4-D transpose.
TEST(FrontendFusion, AttentionWithDivAfterMatMul) {
  OnnxBuilder b;
  b.input("q", {1, 2, 3, 4}).input("kr", {1, 3, 2, 4}).input("v", {1, 2, 3, 4}).output("y");
  b.scalar("sd", 2.0);
  auto& tr = b.node("Transpose", {"kr"}, {"kt"});
  testing::attr_ints(tr, "perm", {0, 2, 3, 1});
  b.node("MatMul", {"q", "kt"}, {"s"});
  b.node("Div", {"s", "sd"}, {"sc"});
  auto& sm = b.node("Softmax", {"sc"}, {"p"});
  testing::attr_i(sm, "axis", 3);
  b.node("MatMul", {"p", "v"}, {"y"});
  check_fusion(b, "attention", 1, {{"q", random({1, 2, 3, 4}, 14)}, {"kr", random({1, 3, 2, 4}, 15)}, {"v", random({1, 2, 3, 4}, 16)}});
}

// Shape → Gather → Unsqueeze → Concat → Reshape with a dynamic batch: static at 3 and 5.
TEST(FrontendFolding, ShapeChainWithDynamicBatch) {
  OnnxBuilder b;
  b.input("x", {-1, 4, 3}).output("y");
  b.node("Shape", {"x"}, {"shape"});
  b.ints("zero", {0}).scalar("i0", 0, DType::kI64);
  b.node("Gather", {"shape", "i0"}, {"batch"});
  b.node("Unsqueeze", {"batch", "zero"}, {"b1"});
  b.ints("rest", {-1});
  auto& c = b.node("Concat", {"b1", "rest"}, {"target"});
  testing::attr_i(c, "axis", 0);
  b.node("Reshape", {"x", "target"}, {"y"});
  for (int64_t batch : {3, 5}) {
    ImportOptions o;
    o.batch = batch;
    auto m = b.import(o);
    ASSERT_TRUE(m.ok()) << m.status().message();
    EXPECT_EQ(m->value(m->outputs()[0]).type.shape, (Shape{batch, 12}));
    EXPECT_EQ(testing::count_op(*m, "reshape"), 1);
    EXPECT_EQ(m->schedule().size(), 1u);  // the shape chain folded away
  }
}

TEST(FrontendFolding, RuntimeReshapeTargetIsAClearError) {
  OnnxBuilder b;
  b.input("x", {2, 3}).input("t", {2}, onnx::TensorProto::INT64).output("y");
  b.node("Reshape", {"x", "t"}, {"y"}, "the_reshape");
  auto m = b.import();
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("the_reshape"), std::string::npos) << m.status().message();
  EXPECT_NE(m.status().message().find("runtime data"), std::string::npos);
}

TEST(FrontendFolding, TokenInputNeedsSeq) {
  OnnxBuilder b;
  b.input("input_ids", {-1, -1}, onnx::TensorProto::INT64).output("y");
  b.node("Identity", {"input_ids"}, {"y"});
  auto m = b.import();
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("input 'input_ids' dim 1 ('seq') is dynamic; pass --seq"), std::string::npos)
      << m.status().message();
  ImportOptions o;
  o.seq = 7;
  o.batch = 2;
  auto ok = b.import(o);
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->value(ok->arguments()[0]).type.shape, (Shape{2, 7}));
}

TEST(FrontendErrors, GarbageTruncatedAndEmpty) {
  auto g = import_onnx_bytes("\xff\xff\xff\xff garbage", "", {}, "bad.onnx");
  ASSERT_FALSE(g.ok());
  EXPECT_EQ(g.status().message(), "bad.onnx: not a valid ONNX model (protobuf parse failed)");
  OnnxBuilder b;
  b.input("x", {2}).output("y").node("Relu", {"x"}, {"y"});
  const std::string bytes = b.bytes();
  for (size_t cut = 1; cut < bytes.size(); ++cut) {
    auto m = import_onnx_bytes(std::string_view(bytes).substr(0, cut), "", {}, "t.onnx");
    if (!m.ok()) {
      EXPECT_EQ(m.status().message().find('\n'), std::string::npos);
    }
  }
  auto missing = import_onnx("/nonexistent/model.onnx");
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.status().message().find("no such file"), std::string::npos);
  auto empty = import_onnx_bytes("", "", {}, "e.onnx");
  EXPECT_FALSE(empty.ok());
}

TEST(FrontendErrors, RandomBytesNeverCrash) {
  std::mt19937 rng(7);
  OnnxBuilder b;
  b.input("x", {-1, 3}).output("y").ints("s", {0, -1, 1});
  b.node("Reshape", {"x", "s"}, {"r"});
  b.node("Softmax", {"r"}, {"y"});
  std::string bytes = b.bytes();
  for (int trial = 0; trial < 2000; ++trial) {
    std::string mutated = bytes;
    for (int k = 0; k < 1 + trial % 4; ++k) mutated[rng() % mutated.size()] = static_cast<char>(rng());
    (void)import_onnx_bytes(mutated, "", {}, "fuzz.onnx");
  }
}

TEST(FrontendErrors, UnsupportedOpNamesNodeOpAndOpset) {
  OnnxBuilder b(15);
  b.input("x", {1, 1, 4, 4}).output("y").node("MaxRoiPool", {"x"}, {"y"}, "pool");
  auto m = b.import();
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.status().message(), "test.onnx: node 'pool' (MaxRoiPool, opset 15): unsupported op");
}

TEST(FrontendErrors, UndefinedInputAndUnsortedGraph) {
  OnnxBuilder b;
  b.input("x", {2}).output("y");
  b.node("Relu", {"h"}, {"y"});  // uses h before it is produced: gets sorted
  b.node("Neg", {"x"}, {"h"});
  auto m = b.import();
  ASSERT_TRUE(m.ok()) << m.status().message();
  OnnxBuilder bad;
  bad.input("x", {2}).output("y").node("Relu", {"nowhere"}, {"y"}, "r");
  auto e = bad.import();
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("input 'nowhere' is not defined"), std::string::npos);
}

TEST(FrontendErrors, UnsupportedElementType) {
  OnnxBuilder b;
  b.input("x", {2}, onnx::TensorProto::STRING).output("y").node("Identity", {"x"}, {"y"});
  auto m = b.import();
  ASSERT_FALSE(m.ok());
  EXPECT_NE(m.status().message().find("STRING"), std::string::npos) << m.status().message();
}

TEST(FrontendErrors, SkeletonWeightsAreShapesOnly) {
  OnnxBuilder b;
  b.input("x", {2, 4}).output("y");
  b.init("w", make_tensor(DType::kF32, {3, 4}, {1}), /*strip_data=*/true);
  b.init("b", make_tensor(DType::kF32, {3}, {1}), true);
  auto& g = b.node("Gemm", {"x", "w", "b"}, {"y"});
  testing::attr_i(g, "transB", 1);
  auto m = b.import();
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(m->metadata().get_int("skeleton", 0), 1);
  EXPECT_TRUE(m->weights().empty());
  auto run = execute(*m, {{"x", make_tensor(DType::kF32, {2, 4}, {1})}});
  ASSERT_FALSE(run.ok());
  EXPECT_NE(run.status().message().find("skeleton"), std::string::npos) << run.status().message();
}

TEST(FrontendImport, WeightsVsConstantsAndMetadata) {
  OnnxBuilder b;
  b.input("x", {2}).output("y");
  b.init("layer.weight", make_tensor(DType::kF32, {2}, {1, 2}));
  b.scalar("onnx::Div_12", 2.0);
  b.node("Mul", {"x", "layer.weight"}, {"m"});
  b.node("Div", {"m", "onnx::Div_12"}, {"y"});
  auto m = b.import();
  ASSERT_TRUE(m.ok()) << m.status().message();
  int params = 0;
  for (ValueId a : m->arguments()) {
    if (m->value(a).role == Role::kParam) {
      ++params;
      EXPECT_EQ(m->value(a).source_name, "layer.weight");
    }
  }
  EXPECT_EQ(params, 1);
  EXPECT_EQ(m->metadata().get_int("opset", 0), 17);
  EXPECT_EQ(m->metadata().get_string("producer", ""), "memc-test");
}

// The initializers a module trains, in argument order.
// A node's metadata_props entry as the dynamo exporter writes it (field 9, which Debian's
// onnx.proto does not know: an unknown field holding a StringStringEntryProto).
void add_metadata(onnx::NodeProto& node, const std::string& key, const std::string& value) {
  onnx::StringStringEntryProto entry;
  entry.set_key(key);
  entry.set_value(value);
  node.GetReflection()->MutableUnknownFields(&node)->AddLengthDelimited(9, entry.SerializeAsString());
}
void add_fx_node(onnx::NodeProto& node, const std::string& fx_node) { add_metadata(node, "pkg.torch.onnx.fx_node", fx_node); }

std::vector<std::string> trained_names(const Module& m) {
  std::vector<std::string> names;
  for (ValueId a : m.arguments())
    if (m.value(a).role == Role::kParam) names.push_back(m.value(a).source_name);
  return names;
}

std::vector<std::string> sorted_trained_names(const Module& m) {
  std::vector<std::string> names = trained_names(m);
  std::sort(names.begin(), names.end());
  return names;
}

// Imports with the parameter audit's findings collected in `findings` instead of printed.
Expected<Module> import_with_findings(OnnxBuilder& b, std::vector<std::string>& findings) {
  ImportOptions options;
  options.param_findings = &findings;
  return b.import(options);
}

bool has_finding(const std::vector<std::string>& findings, const std::string& text) {
  return std::any_of(findings.begin(), findings.end(), [&](const std::string& f) { return f.find(text) != std::string::npos; });
}

void add_value_metadata(onnx::ModelProto& model, const std::string& name, const std::string& key, const std::string& value) {
  onnx::ValueInfoProto* info = model.mutable_graph()->add_value_info();
  info->set_name(name);
  onnx::StringStringEntryProto entry;
  entry.set_key(key);
  entry.set_value(value);
  info->GetReflection()->MutableUnknownFields(info)->AddLengthDelimited(4, entry.SerializeAsString());
}

// Today's dynamo exporter records, in value_info metadata (ValueInfoProto field 4, newer than
// Debian's onnx.proto), which initializers are the module's buffers and which it folded from a
// parameter. A buffer stays constant (PyTorch never trains it: Llama's rotary inv_freq), and the
// folded copies of one shared parameter (ALBERT's feed-forward weights, folded once per layer)
// train as one tensor; a copy with other values does not.

TEST(FrontendImport, ExportedBuffersStayConstantAndFoldedCopiesOfOneParameterTrainAsOne) {
  OnnxBuilder b(18);
  b.input("x", {2, 2}).output("y");
  const Tensor w = make_tensor(DType::kF32, {2, 2}, {1, 2, 3, 4});
  b.init("val_1", w).init("val_2", w).init("val_3", make_tensor(DType::kF32, {2, 2}, {1, 2, 3, 5}));
  b.init("rotary.inv_freq", make_tensor(DType::kF32, {2}, {1, 0.5}));
  b.node("MatMul", {"x", "val_1"}, {"a"});
  b.node("MatMul", {"a", "val_2"}, {"b"});
  b.node("MatMul", {"b", "val_3"}, {"c"});
  b.node("Mul", {"c", "rotary.inv_freq"}, {"y"});
  const std::string folded = "pkg.onnxscript.optimizer.folded_from";
  add_value_metadata(b.proto(), "val_1", folded, "['layer.ffn.weight']");
  add_value_metadata(b.proto(), "val_2", folded, "['layer.ffn.weight']");
  add_value_metadata(b.proto(), "val_3", folded, "['layer.ffn.weight']");  // another value: not tied
  add_value_metadata(b.proto(), "rotary.inv_freq", "pkg.torch.export.graph_signature.InputSpec.kind", "BUFFER");
  std::vector<std::string> findings;
  auto m = import_with_findings(b, findings);
  ASSERT_TRUE(m.ok()) << m.status().message();
  const std::vector<std::string> params = trained_names(*m);
  EXPECT_EQ(params, (std::vector<std::string>{"val_1", "val_3"}));
  auto tied = m->metadata().find("tied_copies");
  ASSERT_NE(tied, nullptr);
  EXPECT_EQ(std::get<std::vector<std::string>>(*tied), (std::vector<std::string>{"val_2", "val_1"}));
  auto has = [&](const std::string& text) { return has_finding(findings, text); };
  EXPECT_TRUE(has("initializers 'val_1' and 'val_2' are the exporter's folded copies of one parameter 'layer.ffn.weight'"));
  EXPECT_TRUE(has("initializer 'rotary.inv_freq' is a buffer of the PyTorch module"));
  EXPECT_FALSE(has("initializer 'val_2' ["));  // its "trains it as 'val_2'" line is superseded
  // The forward reads one tensor twice: x·W·W·W3·inv_freq.
  auto out = execute(*m, {{"x", make_tensor(DType::kF32, {2, 2}, {1, 0, 0, 1})}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  // W·W = [[7, 10], [15, 22]]; · W3 = [[37, 64], [81, 140]]; · [1, 0.5]
  const std::vector<double> want = {37, 32, 81, 70};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out->at(0).get_as_double(i), want[i], 1e-4) << i;
}

// The dynamo exporter's optimizer folds constants that PyTorch never trains into initializers:
// Bloom's ALiBi slopes (from arange and pow), GPT-J's rotary table (its buffer, renamed). Their
// onnxscript folded_from lists no parameter, so memc keeps them constant; a folded value whose
// sources may hold a parameter (a module path, a root attribute like 'cls_token') still trains.
TEST(FrontendImport, ConstantsFoldedFromNoParameterStayConstant) {
  OnnxBuilder b(18);
  b.input("x", {2, 2}).output("y");
  b.init("val_1", make_tensor(DType::kF32, {2, 2}, {1, 2, 3, 4}));
  b.init("unsqueeze_1", make_tensor(DType::kF32, {2, 1}, {0.5, 0.25}));
  b.init("val_37", make_tensor(DType::kF32, {2, 2}, {1, 1, 1, 1}));
  b.init("val_9", make_tensor(DType::kF32, {2}, {2, 2}));
  b.init("val_10", make_tensor(DType::kF32, {2}, {3, 3}));
  b.init("val_83", make_tensor(DType::kF32, {2, 2}, {0}));  // an attention mask HF builds from positions
  b.node("MatMul", {"x", "val_1"}, {"a"});
  b.node("Mul", {"a", "unsqueeze_1"}, {"m"});
  auto& index = b.node("Add", {"m", "val_37"}, {"c"});  // the FX graph read the buffer here
  add_fx_node(index, "%index_1 : [num_users=1] = call_function[target=torch.ops.aten.index.Tensor](args = (%b_rotary_embed_positions, [%m]), kwargs = {})");
  b.node("Mul", {"c", "val_9"}, {"d"});
  b.node("Add", {"d", "val_10"}, {"e"});
  b.node("Add", {"e", "val_83"}, {"y"});
  const std::string folded = "pkg.onnxscript.optimizer.folded_from";
  add_value_metadata(b.proto(), "val_1", folded, "['layer.weight']");
  add_value_metadata(b.proto(), "unsqueeze_1", folded, "['arange', 'full', 'pow_1', 'val_4', 'x']");
  // The first FX node of an op is named after it ('ge', 'expand'): the exporter's values too.
  add_value_metadata(b.proto(), "val_83", folded, "['add_2', 'arange_2', 'expand_2', 'ge', 'unsqueeze_6', 'val_0']");
  add_value_metadata(b.proto(), "val_37", folded, "['rotary.embed_positions']");
  add_value_metadata(b.proto(), "val_9", folded, "['ln.weight', 'val_8']");
  add_value_metadata(b.proto(), "val_10", folded, "['cls_token']");
  std::vector<std::string> findings;
  auto m = import_with_findings(b, findings);
  ASSERT_TRUE(m.ok()) << m.status().message();
  const std::vector<std::string> params = trained_names(*m);
  EXPECT_EQ(params, (std::vector<std::string>{"val_1", "val_9", "val_10"}));
  auto has = [&](const std::string& text) { return has_finding(findings, text); };
  EXPECT_TRUE(has("initializer 'unsqueeze_1' is a constant the exporter folded from values the exporter computed ('arange', 'full', 'pow_1', …), no parameter"));
  EXPECT_TRUE(has("initializer 'val_37' is a constant the exporter folded from the module's buffer 'rotary.embed_positions', no parameter"));
  EXPECT_TRUE(has("initializer 'val_83' is a constant the exporter folded from values the exporter computed"));
  EXPECT_FALSE(has("initializer 'val_9' is a constant"));
  EXPECT_FALSE(has("initializer 'val_10' is a constant"));
  // The forward is unchanged: (x·W ⊙ slopes + 1) ⊙ 2 + 3.
  auto out = execute(*m, {{"x", make_tensor(DType::kF32, {2, 2}, {1, 0, 0, 1})}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  const std::vector<double> want = {6, 7, 6.5, 7};
  for (int i = 0; i < 4; ++i) EXPECT_NEAR(out->at(0).get_as_double(i), want[i], 1e-6) << i;
}

// Tied maxima (a channel a ReLU zeroed, max-pooled) take PyTorch's gradient: amax shares it (and
// a ReduceMax without an FX node is read as amax), max(dim) and adaptive max pooling give it
// to the first, which the dynamo exporter's FX node names. torch 2.15's gradients at zeros.
TEST(FrontendImport, TiesTakePyTorchsGradientAsTheFxNodeSays) {
  struct Case {
    const char* op;
    const char* fx;  // "" for none (a TorchScript export)
    bool first;
  };
  const Case cases[] = {
      {"ReduceMax", "", false},
      {"ReduceMax", "%amax : [num_users=1] = call_function[target=torch.ops.aten.amax.default](args = (%x, [2, 3]), kwargs = {})", false},
      {"ReduceMax", "%max_1 : [num_users=1] = call_function[target=torch.ops.aten.max.dim](args = (%view, 2), kwargs = {})", true},
      {"ReduceMax", "%adaptive_max_pool2d : [num_users=1] = call_function[target=torch.ops.aten.adaptive_max_pool2d.default](args = (%x, [1, 1]), kwargs = {})", true},
      {"GlobalMaxPool", "", true},
  };
  for (const Case& c : cases) {
    OnnxBuilder b(18);
    b.input("x", {1, 1, 2, 2}).output("y");
    if (std::string(c.op) == "ReduceMax") {
      b.ints("axes", {2, 3});
      auto& n = b.node("ReduceMax", {"x", "axes"}, {"y"});
      if (*c.fx) add_fx_node(n, c.fx);
    } else {
      b.node(c.op, {"x"}, {"y"});
    }
    auto m = b.import();
    ASSERT_TRUE(m.ok()) << m.status().message();
    auto dx = testing::input_gradients(*m, {"x"}, {{"x", make_tensor(DType::kF32, {1, 1, 2, 2}, {0})}});
    ASSERT_TRUE(dx.ok()) << dx.status().message();
    for (int64_t i = 0; i < 4; ++i) {
      const double want = c.first ? (i == 0 ? 1.0 : 0.0) : 0.25;
      EXPECT_EQ(dx->at(0).get_as_double(i), want) << c.op << " " << c.fx << " at " << i;
    }
  }
  // A Clip from a clamp to a 0-d tensor bound (the dynamo exporter's clamp_min.Tensor) splits the
  // tie as PyTorch's clamp does there; from relu6, hardtanh or a clamp to numbers the bound takes it.
  for (const bool tensor_bound : {false, true}) {
    OnnxBuilder b(18);
    b.input("x", {2}).output("y");
    auto& n = b.scalar("lo", 0).node("Clip", {"x", "lo"}, {"y"});
    if (tensor_bound) {
      add_fx_node(n, "%clamp_min : [num_users=1] = call_function[target=torch.ops.aten.clamp_min.Tensor](args = (%x, %lo), kwargs = {})");
    }
    auto m = b.import();
    ASSERT_TRUE(m.ok()) << m.status().message();
    auto dx = testing::input_gradients(*m, {"x"}, {{"x", make_tensor(DType::kF32, {2}, {0, 1})}});
    ASSERT_TRUE(dx.ok()) << dx.status().message();
    EXPECT_EQ(dx->at(0).get_as_double(0), tensor_bound ? 0.5 : 0.0);
    EXPECT_EQ(dx->at(0).get_as_double(1), 1.0);
  }
}

// torch.export's graph signature as the dynamo exporter writes it: graph metadata (field 16,
// unknown to Debian's onnx.proto).
void add_graph_signature(OnnxBuilder& b, const std::string& signature) {
  onnx::StringStringEntryProto entry;
  entry.set_key("pkg.torch.export.ExportedProgram.graph_signature");
  entry.set_value(signature);
  onnx::GraphProto* graph = b.proto().mutable_graph();
  graph->GetReflection()->MutableUnknownFields(graph)->AddLengthDelimited(16, entry.SerializeAsString());
}

// The folded_from names alone cannot tell an FX value ('reciprocal', 'convert_element_type_default':
// MPT's ALiBi slopes) from a root parameter ('cls_token'). torch.export's graph signature, which
// the dynamo exporter writes on the graph, lists every parameter, those folded away included:
// with it the sources are read exactly.
TEST(FrontendImport, TheGraphSignatureSaysWhichFoldedSourcesAreParameters) {
  for (const bool signed_graph : {false, true}) {
    OnnxBuilder b(18);
    b.input("x", {2}).output("y");
    b.init("squeeze", make_tensor(DType::kF32, {2}, {-4, -2}));
    b.init("val_3", make_tensor(DType::kF32, {2}, {3, 3}));
    b.node("Add", {"x", "squeeze"}, {"a"});
    b.node("Mul", {"a", "val_3"}, {"y"});
    const std::string folded = "pkg.onnxscript.optimizer.folded_from";
    add_value_metadata(b.proto(), "squeeze", folded, "['arange', 'convert_element_type_default', 'reciprocal', 'val_9']");
    add_value_metadata(b.proto(), "val_3", folded, "['cls_token', 'val_2']");
    if (signed_graph) {
      add_graph_signature(b, "\n# inputs\np_cls_token: PARAMETER target='cls_token'\nb_mask: BUFFER target='mask' persistent=True\n"
                             "x: USER_INPUT\n\n# outputs\nmul: USER_OUTPUT\n");
    }
    std::vector<std::string> findings;
    auto m = import_with_findings(b, findings);
    ASSERT_TRUE(m.ok()) << m.status().message();
    // Unsigned: 'reciprocal' might be a root parameter, so 'squeeze' trains (the old reading).
    const std::vector<std::string> want = signed_graph ? std::vector<std::string>{"val_3"} : std::vector<std::string>{"squeeze", "val_3"};
    EXPECT_EQ(trained_names(*m), want);
    EXPECT_EQ(has_finding(findings, "initializer 'squeeze' is a constant the exporter folded from values the exporter computed"),
              signed_graph);
  }
}

// An integer the dynamo optimizer merged by value (`val_24`, a 0) read as Range's start, a static
// input, and as data elsewhere: never trained, so no constant copy and no finding about
// running statistics (87 of the fresh sweep's dynamo exports said so for a while).
TEST(FrontendImport, AnIntegerReadAsRangesStartAndAsDataIsNoRunningStatistic) {
  OnnxBuilder b(18);
  b.input("ids", {4}, onnx::TensorProto::INT64).output("y");
  b.init("val_24", make_tensor(DType::kI64, {}, {0}));
  b.init("val_5", make_tensor(DType::kI64, {}, {4}));
  b.init("val_6", make_tensor(DType::kI64, {}, {1}));
  b.node("Range", {"val_24", "val_5", "val_6"}, {"r"}).set_name("node_arange");
  b.node("Add", {"ids", "val_24"}, {"a"}).set_name("node_add");
  b.node("Add", {"a", "r"}, {"y"}).set_name("node_add_1");
  std::vector<std::string> findings;
  auto m = import_with_findings(b, findings);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_FALSE(has_finding(findings, "constant input"));
  auto out = execute(*m, {{"ids", make_tensor(DType::kI64, {4}, {5, 6, 7, 8})}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->at(0).get_as_int(3), 11);
}

// A 0-d nn.Parameter (CLIP's logit_scale, a ReZero gate) trains, as in PyTorch. The dynamo
// export's graph signature says which scalars are parameters, and which the exporter folded from
// parameters (DiffLlama's lambda_full, `add_6`); without it (TorchScript), a scalar under a
// module's name is taken for a parameter and said, and the exporter's own scalars stay constant.
// A file another producer wrote keeps its scalars constant (ErfGeluInEveryOrder's "half").
TEST(FrontendImport, ScalarParametersTrain) {
  for (const bool signed_graph : {false, true}) {
    OnnxBuilder b(18);
    b.input("x", {2}).output("y");
    b.init("alpha", make_tensor(DType::kF32, {}, {0.7}));
    b.init("beta", make_tensor(DType::kF32, {}, {2}));
    b.init("add_6", make_tensor(DType::kF32, {}, {0.1}));
    b.init("val_3", make_tensor(DType::kF32, {}, {3}));
    b.node("Mul", {"x", "alpha"}, {"a"});
    b.node("Mul", {"a", "beta"}, {"c"});
    b.node("Mul", {"c", "add_6"}, {"d"});
    b.node("Mul", {"d", "val_3"}, {"y"});
    add_value_metadata(b.proto(), "add_6", "pkg.onnxscript.optimizer.folded_from", "['exp', 'layer.lambda_q1', 'layer.lambda_k1', 'sub']");
    b.proto().set_producer_name("pytorch");  // another producer's scalars are its constants ("eps", "half")
    if (signed_graph) {
      add_graph_signature(b, "\n# inputs\np_alpha: PARAMETER target='alpha'\np_layer_lambda_q1: PARAMETER target='layer.lambda_q1'\n"
                             "p_layer_lambda_k1: PARAMETER target='layer.lambda_k1'\nb_beta: BUFFER target='beta' persistent=True\n"
                             "x: USER_INPUT\n\n# outputs\nmul_3: USER_OUTPUT\n");
    }
    std::vector<std::string> findings;
    auto m = import_with_findings(b, findings);
    ASSERT_TRUE(m.ok()) << m.status().message();
    const std::vector<std::string> want = signed_graph ? std::vector<std::string>{"add_6", "alpha"} : std::vector<std::string>{"alpha", "beta"};
    EXPECT_EQ(sorted_trained_names(*m), want) << (signed_graph ? "signed" : "unsigned");
    EXPECT_EQ(has_finding(findings, "initializer 'alpha' is a scalar under a module's name: memc trains it as a parameter"), !signed_graph);
    EXPECT_EQ(has_finding(findings, "initializer 'add_6' [] is a value the exporter computed from parameters"), signed_graph);
  }
}

// torch 2.15's dynamo exporter writes a module in train() with a BatchNormalization node that
// has no training_mode (ONNX's default: running statistics); only its FX node says PyTorch
// normalizes with the batch's there. memc does: the running statistics become buffers, updated
// after each step (ONNX's biased variance for a file torch did not write), and the evaluation
// forward (ImportOptions::running_statistics) reads them; the same node from eval() trains with
// its running statistics as constants. The optimizer's BatchNorm fused into a Conv is named.
TEST(FrontendImport, BatchNormFromTrainModeUpdatesItsRunningStatisticsAndAFusedOneIsNamed) {
  auto model = [](const std::string& fx) {
    OnnxBuilder b(18);
    b.input("x", {2, 3, 2, 2}).output("y");
    for (const char* name : {"bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"})
      b.init(name, make_tensor(DType::kF32, {3}, {0.5, 1.5, 2}));
    add_fx_node(b.node("BatchNormalization", {"x", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"}, {"y"}), fx);
    return b;
  };
  const std::string train_fx = "%getitem : [num_users=1] = call_function[target=torch.ops.aten._native_batch_norm_legit_functional.default](args = (%conv2d, %p_bn_weight))";
  std::vector<double> xs(24);
  for (int i = 0; i < 24; ++i) xs[i] = (i % 4) + (i / 12);  // channel c of sample n: n, n+1, n+2, n+3
  const Tensor x = make_tensor(DType::kF32, {2, 3, 2, 2}, xs);
  auto train = model(train_fx).import();
  ASSERT_TRUE(train.ok()) << train.status().message();
  EXPECT_EQ(trained_names(*train), (std::vector<std::string>{"bn.weight", "bn.bias"}));
  ASSERT_EQ(train->outputs().size(), 3u);  // y, then the running mean's and variance's updates
  EXPECT_EQ(train->value(train->output_updates()[1]).source_name, "bn.running_mean");
  EXPECT_EQ(train->value(train->output_updates()[2]).role, Role::kBuffer);
  auto stepped = execute(*train, {{"x", x}});
  ASSERT_TRUE(stepped.ok()) << stepped.status().message();
  // channel 0 holds 0..3 and 1..4: mean 2, biased variance 1.5
  EXPECT_NEAR(stepped->at(0).get_as_double(0), (0 - 2) * 0.5 / std::sqrt(1.5 + 1e-5) + 0.5, 1e-5);
  EXPECT_NEAR(stepped->at(1).get_as_double(0), 0.5 * 0.9 + 2 * 0.1, 1e-6);
  EXPECT_NEAR(stepped->at(2).get_as_double(0), 0.5 * 0.9 + 1.5 * 0.1, 1e-6);
  ImportOptions evaluation;
  evaluation.running_statistics = true;
  auto read = model(train_fx).import(evaluation);
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->outputs().size(), 1u);
  auto running = execute(*read, {{"x", x}});
  ASSERT_TRUE(running.ok()) << running.status().message();
  EXPECT_NEAR(running->at(0).get_as_double(0), (0 - 0.5) * 0.5 / std::sqrt(0.5 + 1e-5) + 0.5, 1e-5);

  auto eval = model("%getitem : [num_users=1] = call_function[target=torch.ops.aten._native_batch_norm_legit_no_training.default](args = (%conv2d,))").import();
  ASSERT_TRUE(eval.ok()) << eval.status().message();
  EXPECT_EQ(trained_names(*eval), (std::vector<std::string>{"bn.weight", "bn.bias"}));  // the running statistics stay constant
  EXPECT_EQ(eval->outputs().size(), 1u);
  // y = (x − mean)·w/√(var + ε) + b, channel 0: (1 − 0.5)·0.5/√(0.5 + 1e-5) + 0.5
  auto out = execute(*eval, {{"x", make_tensor(DType::kF32, {2, 3, 2, 2}, std::vector<double>(24, 1.0))}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_NEAR(out->at(0).get_as_double(0), 0.5 * 0.5 / std::sqrt(0.5 + 1e-5) + 0.5, 1e-6);

  // Running statistics the graph computes cannot be updated: one line.
  OnnxBuilder computed(18);
  computed.input("x", {2, 3, 2, 2}).output("y");
  for (const char* name : {"bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"})
    computed.init(name, make_tensor(DType::kF32, {3}, {0.5, 1.5, 2}));
  computed.node("Identity", {"bn.running_mean"}, {"m"});
  add_fx_node(computed.node("BatchNormalization", {"x", "bn.weight", "bn.bias", "m", "bn.running_var"}, {"y"}), train_fx);
  auto refused = computed.import();
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("running statistics ('m', 'bn.running_var') of a BatchNorm in train() mode are neither initializers"),
            std::string::npos)
      << refused.status().message();

  // Batch statistics whose running statistics never change (momentum 1: F.batch_norm with none,
  // BiT's weight standardization) are supported: each channel of y is normalized over the batch.
  OnnxBuilder standardize(15);
  standardize.input("x", {2, 2, 2}).output("y");
  standardize.init("w", make_tensor(DType::kF32, {2}, {1, 1})).init("b", make_tensor(DType::kF32, {2}, {0, 0}));
  standardize.init("m", make_tensor(DType::kF32, {2}, {0, 0})).init("v", make_tensor(DType::kF32, {2}, {1, 1}));
  auto& node = standardize.node("BatchNormalization", {"x", "w", "b", "m", "v"}, {"y"});
  testing::attr_i(node, "training_mode", 1);
  auto* momentum = node.add_attribute();
  momentum->set_name("momentum");
  momentum->set_type(onnx::AttributeProto::FLOAT);
  momentum->set_f(1.0f);
  auto batch = standardize.import();
  ASSERT_TRUE(batch.ok()) << batch.status().message();
  auto normalized = execute(*batch, {{"x", make_tensor(DType::kF32, {2, 2, 2}, {1, 3, 10, 20, 5, 7, 30, 40})}});
  ASSERT_TRUE(normalized.ok()) << normalized.status().message();
  // channel 0 holds 1, 3, 5, 7: mean 4, variance 5
  EXPECT_NEAR(normalized->at(0).get_as_double(0), -3 / std::sqrt(5 + 1e-5), 1e-5);
  EXPECT_NEAR(normalized->at(0).get_as_double(5), 3 / std::sqrt(5 + 1e-5), 1e-5);

  OnnxBuilder fused(18);
  fused.input("x", {2, 1, 4, 4}).output("y");
  fused.init("c.weight", make_tensor(DType::kF32, {2, 1, 1, 1}, {1, 2})).init("c.bias", make_tensor(DType::kF32, {2}, {0, 1}));
  add_fx_node(fused.node("Conv", {"x", "c.weight", "c.bias"}, {"y"}),
              "%bn : [num_users=1] = call_function[target=torch.ops.aten._native_batch_norm_legit_no_training.default](args = (%conv2d,))");
  std::vector<std::string> findings;
  ASSERT_TRUE(import_with_findings(fused, findings).ok());
  ASSERT_EQ(findings.size(), 1u);
  EXPECT_NE(findings[0].find("is the exporter's fusion of a layer and the BatchNorm after it (_native_batch_norm_legit_no_training.default): "
                             "its weights 'c.weight', 'c.bias' hold the layer scaled"),
            std::string::npos)
      << findings[0];
}

// TorchScript's EVAL export merges equal-valued initializers and reaches the others through
// Identity nodes: a fresh BatchNorm's running mean (zeros) and variance (ones) become aliases of
// its bias and weight. PyTorch trains the bias and weight and never the statistics: memc keeps
// each statistic a constant copy of the value, and `memc export` writes it back as its own
// initializer. A group read only as statistics is constant as a whole.
TEST(FrontendImport, RunningStatisticsMergedWithWeightsByValueStayConstant) {
  OnnxBuilder b(17);
  b.input("x", {2, 3}).output("y");
  b.init("bn.weight", make_tensor(DType::kF32, {3}, {1})).init("bn.bias", make_tensor(DType::kF32, {3}, {0}));
  b.node("Identity", {"bn.bias"}, {"bn.running_mean"});
  b.node("Identity", {"bn.weight"}, {"bn.running_var"});
  b.node("BatchNormalization", {"x", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"}, {"y"});
  auto m = b.import();
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(trained_names(*m), (std::vector<std::string>{"bn.weight", "bn.bias"}));
  const Attr* copies = m->metadata().find("untied_uses");
  ASSERT_NE(copies, nullptr);
  EXPECT_EQ(std::get<std::vector<std::string>>(*copies),
            (std::vector<std::string>{"bn.running_mean", "bn.bias", "", "-1", "bn.running_var", "bn.weight", "", "-1"}));
  // Trained weight 2 and bias 0.5: y = (x − 0)·2/√(1 + ε) + 0.5 (tied, the statistics would
  // have moved with them: (x − 0.5)·2/√(2 + ε) + 0.5).
  for (ValueId a : m->arguments()) {
    if (m->value(a).source_name == "bn.weight") m->weights()[a] = make_tensor(DType::kF32, {3}, {2});
    if (m->value(a).source_name == "bn.bias") m->weights()[a] = make_tensor(DType::kF32, {3}, {0.5});
  }
  auto out = execute(*m, {{"x", make_tensor(DType::kF32, {2, 3}, {1})}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_NEAR(out->at(0).get_as_double(0), 2 / std::sqrt(1 + 1e-5) + 0.5, 1e-5);

  // The export writes each statistic as its own initializer with the model's value.
  const std::string in = testing::scratch_path("merged_bn.onnx"), exported = testing::scratch_path("merged_bn_trained.onnx");
  {
    std::ofstream f(in, std::ios::binary);
    f << b.bytes();
  }
  ASSERT_TRUE(write_onnx_with_weights(in, exported, {{"bn.bias", make_tensor(DType::kF32, {3}, {0.5})}}, untied_uses(m->metadata())).ok());
  std::ifstream f(exported, std::ios::binary);
  onnx::ModelProto written;
  ASSERT_TRUE(written.ParseFromIstream(&f));
  std::map<std::string, double> first;
  for (const auto& init : written.graph().initializer()) {
    auto t = tensor_from_proto(init, "");
    ASSERT_TRUE(t.ok());
    first[init.name()] = t->get_as_double(0);
  }
  EXPECT_EQ(first, (std::map<std::string, double>{{"bn.bias", 0.5}, {"bn.weight", 1}, {"bn.running_mean", 0}, {"bn.running_var", 1}}));
  for (const auto& n : written.graph().node()) EXPECT_NE(n.op_type(), "Identity");

  // The dynamo exporter points the statistics at the weights themselves: BatchNormalization(x, w,
  // b, b, w). The node reads constant copies there, and the export writes them as its own inputs.
  OnnxBuilder direct(18);
  direct.input("x", {2, 3}).output("y");
  direct.init("bn.weight", make_tensor(DType::kF32, {3}, {1})).init("bn.bias", make_tensor(DType::kF32, {3}, {0}));
  direct.node("BatchNormalization", {"x", "bn.weight", "bn.bias", "bn.bias", "bn.weight"}, {"y"}).set_name("node_bn");
  auto d = direct.import();
  ASSERT_TRUE(d.ok()) << d.status().message();
  EXPECT_EQ(trained_names(*d), (std::vector<std::string>{"bn.weight", "bn.bias"}));
  for (ValueId a : d->arguments()) {
    if (d->value(a).source_name == "bn.weight") d->weights()[a] = make_tensor(DType::kF32, {3}, {2});
    if (d->value(a).source_name == "bn.bias") d->weights()[a] = make_tensor(DType::kF32, {3}, {0.5});
  }
  auto dy = execute(*d, {{"x", make_tensor(DType::kF32, {2, 3}, {1})}});
  ASSERT_TRUE(dy.ok()) << dy.status().message();
  EXPECT_NEAR(dy->at(0).get_as_double(0), 2 / std::sqrt(1 + 1e-5) + 0.5, 1e-5);
  const std::string direct_in = testing::scratch_path("direct_bn.onnx"), direct_out = testing::scratch_path("direct_bn_trained.onnx");
  {
    std::ofstream df(direct_in, std::ios::binary);
    df << direct.bytes();
  }
  ASSERT_TRUE(write_onnx_with_weights(direct_in, direct_out, {{"bn.bias", make_tensor(DType::kF32, {3}, {0.5})}}, untied_uses(d->metadata())).ok());
  std::ifstream dfile(direct_out, std::ios::binary);
  onnx::ModelProto dwritten;
  ASSERT_TRUE(dwritten.ParseFromIstream(&dfile));
  const auto& bn = dwritten.graph().node(0);
  EXPECT_EQ(std::vector<std::string>(bn.input().begin(), bn.input().end()),
            (std::vector<std::string>{"x", "bn.weight", "bn.bias", "bn.running_mean", "bn.running_var"}));

  // Statistics alone: one BatchNorm reads the initializer, another its alias; nothing trains.
  OnnxBuilder statistics(17);
  statistics.input("x", {2, 3}).output("z");
  statistics.init("w", make_tensor(DType::kF32, {3}, {2})).init("c", make_tensor(DType::kF32, {3}, {0.25}));
  statistics.init("bn1.running_mean", make_tensor(DType::kF32, {3}, {0.5})).init("v", make_tensor(DType::kF32, {3}, {4}));
  statistics.node("Identity", {"bn1.running_mean"}, {"bn2.running_mean"});
  statistics.node("BatchNormalization", {"x", "w", "c", "bn1.running_mean", "v"}, {"y"}).set_name("node_bn1");
  statistics.node("BatchNormalization", {"y", "w", "c", "bn2.running_mean", "v"}, {"z"}).set_name("node_bn2");
  std::vector<std::string> findings;
  auto constant = import_with_findings(statistics, findings);
  ASSERT_TRUE(constant.ok()) << constant.status().message();
  EXPECT_EQ(trained_names(*constant), (std::vector<std::string>{"w", "c"}));
  // No copy and no line: the Identity is no read of its own (TorchScript's mobilevit said "12
  // constant inputs read trained initializers" of statistics nothing trains).
  EXPECT_EQ(constant->metadata().find("untied_uses"), nullptr);
  EXPECT_FALSE(has_finding(findings, "constant input")) << findings.front();
  // Read through an alias that trains (a zero bias merged with a zero running mean), the
  // initializer is trained, and the statistic reads a constant copy of it.
  OnnxBuilder aliased(17);
  aliased.input("x", {2, 3}).output("z");
  aliased.init("w", make_tensor(DType::kF32, {3}, {2})).init("c", make_tensor(DType::kF32, {3}, {0.25}));
  aliased.init("a.bias", make_tensor(DType::kF32, {3}, {0})).init("v", make_tensor(DType::kF32, {3}, {4}));
  aliased.node("Identity", {"a.bias"}, {"b.bias"});
  aliased.node("BatchNormalization", {"x", "w", "c", "a.bias", "v"}, {"y"}).set_name("bn");
  aliased.node("Add", {"y", "b.bias"}, {"z"}).set_name("add");
  findings.clear();
  auto trained = import_with_findings(aliased, findings);
  ASSERT_TRUE(trained.ok()) << trained.status().message();
  EXPECT_TRUE(has_finding(findings, "1 constant input (running statistics) read trained initializers the exporter merged them with by value "
                                    "('a.bias' as 'a.running_mean')"))
      << (findings.empty() ? "" : findings.front());
}

// The dynamo exporter's optimizer removes a Gemm's or Conv's bias input that is all zeros (a fresh
// Linear's); the node's FX metadata still names the parameter. memc trains it from zeros under
// that name, and `memc export` gives the node its bias input back.
TEST(FrontendImport, BiasTheExporterRemovedForBeingZeroIsTrained) {
  OnnxBuilder b(18);
  b.input("x", {2, 3}).output("y");
  b.init("fc.weight", make_tensor(DType::kF32, {4, 3}, {1, 0, 0, 0, 1, 0, 0, 0, 1, 1, 1, 1}));
  onnx::NodeProto& gemm = b.node("Gemm", {"x", "fc.weight"}, {"y"});
  gemm.set_name("node_Gemm_0");
  testing::attr_i(gemm, "transB", 1);
  add_metadata(gemm, "pkg.torch.onnx.name_scopes", "['', 'fc', 'linear']");
  add_metadata(gemm, "pkg.torch.onnx.fx_node", "%linear : [num_users=1] = call_function[target=torch.ops.aten.linear.default](args = (%x, %p_fc_weight, %p_fc_bias))");
  std::vector<std::string> findings;
  auto m = import_with_findings(b, findings);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(trained_names(*m), (std::vector<std::string>{"fc.weight", "fc.bias"}));
  EXPECT_TRUE(has_finding(findings, "the exporter removed 1 bias whose elements were all zero ('fc.bias')")) << (findings.empty() ? "" : findings[0]);
  // Trained to 0.5, the bias adds to every row.
  for (ValueId a : m->arguments()) {
    if (m->value(a).source_name != "fc.bias") continue;
    EXPECT_EQ(m->weights().at(a).get_as_double(3), 0);
    m->weights()[a] = make_tensor(DType::kF32, {4}, {0.5});
  }
  auto out = execute(*m, {{"x", make_tensor(DType::kF32, {2, 3}, {1, 2, 3, 4, 5, 6})}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->at(0).get_as_double(3), 6.5);

  // The export gives node_Gemm_0 the bias input back, with the trained value.
  const std::string in = testing::scratch_path("removed_bias.onnx"), exported = testing::scratch_path("removed_bias_trained.onnx");
  {
    std::ofstream f(in, std::ios::binary);
    f << b.bytes();
  }
  ASSERT_TRUE(write_onnx_with_weights(in, exported, {{"fc.bias", make_tensor(DType::kF32, {4}, {0.5})}}, untied_uses(m->metadata())).ok());
  std::ifstream f(exported, std::ios::binary);
  onnx::ModelProto written;
  ASSERT_TRUE(written.ParseFromIstream(&f));
  ASSERT_EQ(written.graph().node(0).input_size(), 3);
  EXPECT_EQ(written.graph().node(0).input(2), "fc.bias");
  auto again = import_onnx(exported, {});
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(trained_names(*again), (std::vector<std::string>{"fc.weight", "fc.bias"}));
  EXPECT_EQ(again->metadata().find("untied_uses"), nullptr);
}

// TorchScript's constant folding stores a tied output projection as a new initializer (the
// embedding transposed) and records no name: memc finds the parameter by value and trains the
// two as one tensor, as the module ties them. A copy whose elements are all equal is no evidence
// of a tie, and trains as its own.
TEST(FrontendImport, FoldedTransposeOfATiedEmbeddingFoundByValue) {
  for (const bool constant : {false, true}) {
    OnnxBuilder b(17);
    b.input("ids", {2}, onnx::TensorProto::INT64).output("logits");
    const std::vector<double> emb = constant ? std::vector<double>{0.5} : std::vector<double>{1, 2, 3, 4, 5, 6};
    b.init("emb.weight", make_tensor(DType::kF32, {3, 2}, emb));
    b.init("onnx::MatMul_7", make_tensor(DType::kF32, {2, 3}, constant ? emb : std::vector<double>{1, 3, 5, 2, 4, 6}));
    b.node("Gather", {"emb.weight", "ids"}, {"h"});
    b.node("MatMul", {"h", "onnx::MatMul_7"}, {"logits"});
    std::vector<std::string> findings;
    auto m = import_with_findings(b, findings);
    ASSERT_TRUE(m.ok()) << m.status().message();
    if (constant) {
      EXPECT_EQ(trained_names(*m), (std::vector<std::string>{"emb.weight", "onnx::MatMul_7"}));
      EXPECT_TRUE(has_finding(findings, "the parameter's name is lost"));
    } else {
      EXPECT_EQ(trained_names(*m), (std::vector<std::string>{"emb.weight"}));
      EXPECT_TRUE(has_finding(findings, "initializer 'onnx::MatMul_7' [2x3] is the exporter's folded transpose of parameter 'emb.weight', "
                                        "which the graph also reads (tied weights)"))
          << (findings.empty() ? "" : findings[0]);
    }
  }
}

// Merged by value as torch.equal compares: -0 equals 0 (a BatchNorm folded with a zero gamma
// leaves zeros of both signs), and one element is merged where module paths name the uses
// (StarReLU's scale across blocks); a name that is no module path is no such evidence.
TEST(FrontendImport, MergedZerosOfBothSignsAndSingleElementsAreUntied) {
  auto trained = [](double first, double second, const std::string& kept, const std::string& alias, int64_t n) {
    OnnxBuilder b(17);
    b.input("x", {2, n}).output("z");
    b.init(kept, make_tensor(DType::kF32, {n}, {first, second}));
    b.node("Mul", {"x", kept}, {"y"}).set_name("mul_0");
    b.node("Identity", {kept}, {alias}).set_name("id_1");
    b.node("Add", {"y", alias}, {"z"}).set_name("add_1");
    auto m = b.import();
    EXPECT_TRUE(m.ok()) << m.status().message();
    return m.ok() ? trained_names(*m) : std::vector<std::string>{};
  };
  EXPECT_EQ(trained(0.0, -0.0, "a.conv.weight", "b.conv.weight", 2), (std::vector<std::string>{"a.conv.weight", "b.conv.weight"}));
  EXPECT_EQ(trained(1, 1, "s.act.scale", "t.act.scale", 1), (std::vector<std::string>{"s.act.scale", "t.act.scale"}));
  EXPECT_EQ(trained(2, 2, "scale", "onnx::Mul_5", 1), (std::vector<std::string>{"scale"}));
}

// HF DeiT, fresh, through the dynamo exporter: the class and distillation tokens (both zeros) are
// merged into one initializer, their two Expands into one, and the Concat reads it twice; its FX
// node still names two values. The second gets a copy of the Expand reading a parameter of its
// own, which `memc export` writes back, and which trains apart. A Concat whose FX node names one
// value twice (one parameter read twice) stays as it is.
TEST(FrontendImport, EqualTokensTheExporterComputedOnceTrainApart) {
  for (const bool merged : {true, false}) {
    OnnxBuilder b(18);
    b.input("x", {2, 1, 2}).output("y");
    b.init("emb.cls_token", make_tensor(DType::kF32, {1, 1, 2}, {0}));
    b.init("val_3", make_tensor(DType::kI64, {3}, {2, 1, 2}));
    onnx::NodeProto& expand = b.node("Expand", {"emb.cls_token", "val_3"}, {"expand"});
    expand.set_name("node_Expand_1");
    add_fx_node(expand, "%expand : [num_users=1] = call_function[target=torch.ops.aten.expand.default](args = (%p_emb_cls_token, [2, -1, -1]), kwargs = {})");
    onnx::NodeProto& cat = b.node("Concat", {"expand", "expand", "x"}, {"y"});
    cat.set_name("node_Concat_2");
    testing::attr_i(cat, "axis", 1);
    add_fx_node(cat, str_cat("%cat : [num_users=1] = call_function[target=torch.ops.aten.cat.default](args = ([%expand, %expand", merged ? "_1" : "",
                             ", %x], 1), kwargs = {})"));
    std::vector<std::string> findings;
    auto m = import_with_findings(b, findings);
    ASSERT_TRUE(m.ok()) << m.status().message();
    if (!merged) {
      EXPECT_EQ(trained_names(*m), (std::vector<std::string>{"emb.cls_token"}));
      continue;
    }
    EXPECT_EQ(trained_names(*m), (std::vector<std::string>{"emb.cls_token", "emb.cls_token@expand_1"}));
    EXPECT_TRUE(has_finding(findings, "the exporter computed 1 value once for two, after merging their parameters by value; memc computes each and trains 'emb.cls_token@expand_1' as a parameter of its own")) << (findings.empty() ? "" : findings[0]);
    const std::map<std::string, Tensor> trained = {{"emb.cls_token", make_tensor(DType::kF32, {1, 1, 2}, {1, 2})},
                                                   {"emb.cls_token@expand_1", make_tensor(DType::kF32, {1, 1, 2}, {3, 4})}};
    for (ValueId a : m->arguments())
      if (trained.count(m->value(a).source_name)) m->weights()[a] = trained.at(m->value(a).source_name);
    const std::map<std::string, Tensor> feeds = {{"x", make_tensor(DType::kF32, {2, 1, 2}, {5, 6, 7, 8})}};
    auto out = execute(*m, feeds);
    ASSERT_TRUE(out.ok()) << out.status().message();
    EXPECT_EQ(out->at(0).get_as_double(1), 2);   // y[0, 0, 1]: the class token
    EXPECT_EQ(out->at(0).get_as_double(3), 4);   // y[0, 1, 1]: the other one
    EXPECT_EQ(out->at(0).get_as_double(9), 4);   // y[1, 1, 1]

    // The export copies the Expand for the Concat's second input, and the model reads back the same.
    const std::string in = testing::scratch_path("merged_tokens.onnx"), exported = testing::scratch_path("merged_tokens_trained.onnx");
    {
      std::ofstream f(in, std::ios::binary);
      f << b.bytes();
    }
    Status written = write_onnx_with_weights(in, exported, trained, untied_uses(m->metadata()));
    ASSERT_TRUE(written.ok()) << written.message();
    auto again = import_onnx(exported, {});
    ASSERT_TRUE(again.ok()) << again.status().message();
    EXPECT_EQ(trained_names(*again), (std::vector<std::string>{"emb.cls_token", "emb.cls_token@expand_1"}));
    auto out_again = execute(*again, feeds);
    ASSERT_TRUE(out_again.ok()) << out_again.status().message();
    for (int64_t i = 0; i < out->at(0).numel(); ++i) EXPECT_EQ(out_again->at(0).get_as_double(i), out->at(0).get_as_double(i)) << i;

    // A model file changed since the compile (the Concat renamed, or reading the Expand no more
    // at that input) has no place for the copy: one line naming it, and nothing written.
    for (const bool renamed : {true, false}) {
      onnx::ModelProto changed;
      ASSERT_TRUE(changed.ParseFromString(b.bytes()));
      for (onnx::NodeProto& node : *changed.mutable_graph()->mutable_node()) {
        if (node.name() != "node_Concat_2") continue;
        if (renamed) node.set_name("node_Concat_9");
        else node.set_input(1, "x");
      }
      const std::string edited = testing::scratch_path("merged_tokens_edited.onnx"), refused = testing::scratch_path("merged_tokens_refused.onnx");
      {
        std::ofstream f(edited, std::ios::binary);
        ASSERT_TRUE(changed.SerializeToOstream(&f));
      }
      std::filesystem::remove(refused);
      Status status = write_onnx_with_weights(edited, refused, trained, untied_uses(m->metadata()));
      ASSERT_FALSE(status.ok());
      EXPECT_EQ(status.kind(), ErrorKind::kBadInput);
      EXPECT_EQ(status.message(), edited + ": no node 'node_Concat_2' reading node 'node_Expand_1' at input 1 to give a copy 'expand_1'");
      EXPECT_FALSE(std::filesystem::exists(refused));
    }
  }
}

// GPT-NeoX's parallel residual: two fresh LayerNorms of one input (weights of ones, biases of
// zeros) become one, read by the attention and by the MLP's first linear, which the exporter
// decomposed into a MatMul with a folded weight: its FX node names three arguments, its ONNX node
// two inputs. The computed inputs pair with the FX arguments that are no placeholders, in order:
// the MatMul read `%layer_norm_1`, which no node computes, and gets a LayerNorm of its own.
TEST(FrontendImport, ADecomposedLinearsMergedInputIsComputedAgain) {
  OnnxBuilder b(18);
  b.input("x", {2, 2}).output("y").output("z");
  b.init("ln1.weight", make_tensor(DType::kF32, {2}, {1})).init("ln1.bias", make_tensor(DType::kF32, {2}, {0}));
  b.init("val_9", make_tensor(DType::kF32, {2, 2}, {1, 2, 3, 4}));
  onnx::NodeProto& norm = b.node("LayerNormalization", {"x", "ln1.weight", "ln1.bias"}, {"layer_norm"});
  norm.set_name("node_layer_norm");
  add_fx_node(norm, "%layer_norm : [num_users=1] = call_function[target=torch.ops.aten.layer_norm.default](args = (%x, [2], %p_ln1_weight, %p_ln1_bias, 1e-05), kwargs = {})");
  onnx::NodeProto& attn = b.node("Relu", {"layer_norm"}, {"y"});
  attn.set_name("node_relu");
  add_fx_node(attn, "%relu : [num_users=1] = call_function[target=torch.ops.aten.relu.default](args = (%layer_norm,), kwargs = {})");
  onnx::NodeProto& mm = b.node("MatMul", {"layer_norm", "val_9"}, {"z"});
  mm.set_name("node_linear");
  add_fx_node(mm, "%linear : [num_users=1] = call_function[target=torch.ops.aten.linear.default](args = (%layer_norm_1, %p_mlp_weight, %p_mlp_bias), kwargs = {})");
  std::vector<std::string> findings;
  auto m = import_with_findings(b, findings);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(sorted_trained_names(*m), (std::vector<std::string>{"ln1.bias", "ln1.bias@layer_norm_1", "ln1.weight", "ln1.weight@layer_norm_1", "val_9"}));
  int norms = 0;
  for (const Node& n : m->nodes()) norms += !n.dead && n.op == "layernorm";
  EXPECT_EQ(norms, 2);
  // The Add of the decomposed bias reads no FX value it names: nothing to copy there.
  OnnxBuilder plain(18);
  plain.input("x", {2, 2}).output("z");
  plain.init("val_9", make_tensor(DType::kF32, {2, 2}, {1, 2, 3, 4})).init("b", make_tensor(DType::kF32, {2}, {0}));
  plain.node("MatMul", {"x", "val_9"}, {"val_10"}).set_name("node_mm");
  onnx::NodeProto& bias = plain.node("Add", {"val_10", "b"}, {"z"});
  bias.set_name("node_linear");
  add_fx_node(bias, "%linear : [num_users=1] = call_function[target=torch.ops.aten.linear.default](args = (%x, %p_mlp_weight, %p_mlp_bias), kwargs = {})");
  auto p = plain.import();
  ASSERT_TRUE(p.ok()) << p.status().message();
  EXPECT_EQ(p->metadata().find("untied_copies"), nullptr);
}

// Two zero-initialised heads: the optimizer merges their weights, removes their zero biases and
// computes the one Gemm left for both. The copy for the second head trains a weight and a bias of
// its own (the restored bias too, from zeros), and `memc export` writes both back.
TEST(FrontendImport, TwoZeroHeadsTheExporterComputedOnceTrainApartWithTheirBiases) {
  OnnxBuilder b(18);
  b.input("x", {2, 3}).output("y");
  b.init("head.weight", make_tensor(DType::kF32, {2, 3}, {0}));
  onnx::NodeProto& gemm = b.node("Gemm", {"x", "head.weight"}, {"linear"});
  gemm.set_name("node_linear");
  testing::attr_i(gemm, "transB", 1);
  add_metadata(gemm, "pkg.torch.onnx.name_scopes", "['', 'head', 'linear']");
  add_fx_node(gemm, "%linear : [num_users=1] = call_function[target=torch.ops.aten.linear.default](args = (%x, %p_head_weight, %p_head_bias), kwargs = {})");
  onnx::NodeProto& add = b.node("Add", {"linear", "linear"}, {"y"});
  add.set_name("node_add");
  add_fx_node(add, "%add : [num_users=1] = call_function[target=torch.ops.aten.add.Tensor](args = (%linear, %linear_1), kwargs = {})");
  std::vector<std::string> findings;
  auto m = import_with_findings(b, findings);
  ASSERT_TRUE(m.ok()) << m.status().message();
  EXPECT_EQ(sorted_trained_names(*m), (std::vector<std::string>{"head.bias", "head.bias@linear_1", "head.weight", "head.weight@linear_1"}));
  EXPECT_TRUE(has_finding(findings, "memc computes each and trains 'head.weight@linear_1', 'head.bias@linear_1' as parameters of their own"))
      << (findings.empty() ? "" : findings.back());
  const std::map<std::string, Tensor> trained = {{"head.weight", make_tensor(DType::kF32, {2, 3}, {1, 0, 0, 0, 1, 0})},
                                                 {"head.bias", make_tensor(DType::kF32, {2}, {10, 20})},
                                                 {"head.weight@linear_1", make_tensor(DType::kF32, {2, 3}, {0, 0, 1, 1, 1, 1})},
                                                 {"head.bias@linear_1", make_tensor(DType::kF32, {2}, {100, 200})}};
  for (ValueId a : m->arguments()) {
    const std::string& name = m->value(a).source_name;
    if (!trained.count(name)) continue;
    if (name.find("bias") != std::string::npos) {
      EXPECT_EQ(m->weights().at(a).get_as_double(1), 0) << name;  // restored from zeros
    }
    m->weights()[a] = trained.at(name);
  }
  const std::map<std::string, Tensor> feeds = {{"x", make_tensor(DType::kF32, {2, 3}, {1, 2, 3, 4, 5, 6})}};
  auto out = execute(*m, feeds);
  ASSERT_TRUE(out.ok()) << out.status().message();
  const std::vector<double> want = {114, 228, 120, 240};  // x·W1ᵀ + b1 + x·W2ᵀ + b2
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(out->at(0).get_as_double(static_cast<int64_t>(i)), want[i]) << i;

  const std::string in = testing::scratch_path("zero_heads.onnx"), exported = testing::scratch_path("zero_heads_trained.onnx");
  {
    std::ofstream f(in, std::ios::binary);
    f << b.bytes();
  }
  Status written = write_onnx_with_weights(in, exported, trained, untied_uses(m->metadata()));
  ASSERT_TRUE(written.ok()) << written.message();
  auto again = import_onnx(exported, {});
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(sorted_trained_names(*again), (std::vector<std::string>{"head.bias", "head.bias@linear_1", "head.weight", "head.weight@linear_1"}));
  auto out_again = execute(*again, feeds);
  ASSERT_TRUE(out_again.ok()) << out_again.status().message();
  for (size_t i = 0; i < want.size(); ++i) EXPECT_EQ(out_again->at(0).get_as_double(static_cast<int64_t>(i)), want[i]) << i;
}

// HF Reformer's reversible layers call their submodules where torch.export's scopes stop at the
// layer: a LayerNorm node's scope is `encoder.layers.1`, its placeholder
// `%p_encoder_layers_1_attention_layer_norm_weight`. The path after the scope is split into the
// components the model's names use, where exactly one split exists, so a merged LayerNorm weight
// read by four layers is named per layer, and a bias read by a decomposed linear by its own.
TEST(FrontendImport, PlaceholdersUnderAScopeThatStopsAtTheLayerAreNamedByComponents) {
  const std::map<std::string, std::string> components = {
      {"encoder", "encoder"}, {"layers", "layers"}, {"0", "0"}, {"1", "1"}, {"attention", "attention"}, {"layer_norm", "layer_norm"},
      {"feed_forward", "feed_forward"}, {"output", "output"}, {"dense", "dense"}, {"weight", "weight"}, {"bias", "bias"},
      {"layernorm", "LayerNorm"}, {"self", "self"}};
  EXPECT_EQ(dotted_path("attention_layer_norm_weight", components), "attention.layer_norm.weight");
  EXPECT_EQ(dotted_path("feed_forward_output_dense_bias", components), "feed_forward.output.dense.bias");
  EXPECT_EQ(dotted_path("attention_layernorm_weight", components), "attention.LayerNorm.weight");  // the model's spelling
  EXPECT_EQ(dotted_path("attention_unknown_weight", components), "");  // a component the names never use
  std::map<std::string, std::string> ambiguous = components;
  ambiguous["layer"] = "layer", ambiguous["norm"] = "norm";
  EXPECT_EQ(dotted_path("attention_layer_norm_weight", ambiguous), "");  // layer_norm or layer.norm: no name
  ambiguous = components;
  ambiguous["attention"] = "";  // spelt two ways in the model
  EXPECT_EQ(dotted_path("attention_layer_norm_weight", ambiguous), "");

  OnnxBuilder b(18);
  onnx::NodeProto& norm = b.node("LayerNormalization", {"x", "encoder.layers.0.attention.layer_norm.weight", "encoder.layers.0.attention.layer_norm.bias"}, {"y"});
  add_metadata(norm, "pkg.torch.onnx.name_scopes", "['', 'encoder', 'encoder.layers.1', 'layer_norm_2']");
  add_fx_node(norm, "%layer_norm_2 : [num_users=1] = call_function[target=torch.ops.aten.layer_norm.default](args = (%add_6, [32], "
                    "%p_encoder_layers_1_attention_layer_norm_weight, %p_encoder_layers_1_attention_layer_norm_bias, 1e-12, False), kwargs = {})");
  const std::vector<std::string> inputs = {"encoder.layers.0.attention.layer_norm.weight", "encoder.layers.0.attention.layer_norm.bias"};
  EXPECT_TRUE(parameters_by_place(norm, inputs).empty());  // without the components: no evidence of the order
  EXPECT_EQ(parameters_by_place(norm, inputs, &components),
            (std::vector<std::string>{"encoder.layers.1.attention.layer_norm.weight", "encoder.layers.1.attention.layer_norm.bias"}));
  // The places' last components are the inputs' own, in order: swapped, they show nothing.
  EXPECT_TRUE(parameters_by_place(norm, {inputs[1], inputs[0]}, &components).empty());

  onnx::NodeProto& add = b.node("Add", {"val_212", "encoder.layers.0.attention.layer_norm.bias"}, {"z"});
  add_metadata(add, "pkg.torch.onnx.name_scopes", "['', 'encoder', 'encoder.layers.0', 'linear_5']");
  add_fx_node(add, "%linear_5 : [num_users=1] = call_function[target=torch.ops.aten.linear.default](args = (%relu, "
                   "%p_encoder_layers_0_feed_forward_output_dense_weight, %p_encoder_layers_0_feed_forward_output_dense_bias), kwargs = {})");
  EXPECT_EQ(parameter_read(add, "bias"), "");
  EXPECT_EQ(parameter_read(add, "bias", &components), "encoder.layers.0.feed_forward.output.dense.bias");
  EXPECT_EQ(parameter_read(add, "gamma", &components), "");
}

// nn.Embedding(padding_idx=p): the lookup's gather carries p (its gradient skips row p,
// GradRules.AnEmbeddingsPaddingRowGetsNoGradientFromItsLookup). The dynamo exporter's FX node
// names it as aten.embedding's third argument; without metadata (TorchScript), a table's one row
// of zeros is taken for it, and said.
TEST(FrontendImport, AnEmbeddingsPaddingIndexReachesItsGather) {
  OnnxBuilder parse(18);
  onnx::NodeProto& lookup = parse.node("Gather", {"w", "ids"}, {"y"});
  const std::string head = "%embedding : [num_users=1] = call_function[target=torch.ops.aten.embedding.default](args = ";
  add_fx_node(lookup, head + "(%p_emb_weight, %input_ids, 0), kwargs = {})");
  EXPECT_EQ(embedding_padding_index(lookup), 0);
  onnx::NodeProto& more = parse.node("Gather", {"w", "ids"}, {"y2"});
  add_fx_node(more, head + "(%p_emb_weight, %input_ids, 17, True), kwargs = {})");
  EXPECT_EQ(embedding_padding_index(more), 17);
  onnx::NodeProto& none = parse.node("Gather", {"w", "ids"}, {"y3"});
  add_fx_node(none, head + "(%p_emb_weight, %input_ids), kwargs = {})");
  EXPECT_EQ(embedding_padding_index(none), -1);
  onnx::NodeProto& other = parse.node("Gather", {"w", "ids"}, {"y4"});
  add_fx_node(other, "%index : [num_users=1] = call_function[target=torch.ops.aten.index_select.default](args = (%p_w, 0, %ids), kwargs = {})");
  EXPECT_EQ(embedding_padding_index(other), -1);

  // The gather's attribute, by metadata or by the row of zeros.
  auto padding_of = [](const std::vector<double>& table, const std::string& fx, std::vector<std::string>* findings) -> int64_t {
    OnnxBuilder b(17);
    b.input("ids", {2}, onnx::TensorProto::INT64).output("y");
    b.init("emb.weight", make_tensor(DType::kF32, {3, 2}, table));
    onnx::NodeProto& g = b.node("Gather", {"emb.weight", "ids"}, {"y"});
    g.set_name("lookup");
    if (!fx.empty()) add_fx_node(g, fx);
    std::vector<std::string> local;
    auto m = import_with_findings(b, findings ? *findings : local);
    EXPECT_TRUE(m.ok()) << m.status().message();
    for (const Node& n : m->nodes())
      if (!n.dead && n.op == "gather") return n.attrs.get_int("padding_idx", -1);
    return -2;
  };
  std::vector<std::string> findings;
  EXPECT_EQ(padding_of({1, 2, 0, 0, 3, 4}, "", &findings), 1);
  EXPECT_TRUE(has_finding(findings, "embedding 'emb.weight' has one row of zeros (row 1), nn.Embedding's padding row: memc gives it no gradient "
                                    "from the lookup, as PyTorch does (TorchScript's export keeps no padding index)"))
      << (findings.empty() ? "" : findings.front());
  EXPECT_EQ(padding_of({0, 0, 1, 2, 0, 0}, "", nullptr), -1);  // two rows of zeros: no evidence
  EXPECT_EQ(padding_of({1, 2, 0, 3, 4, 5}, "", nullptr), -1);  // no row of zeros
  EXPECT_EQ(padding_of({1, 2, 0, 0, 3, 4}, head + "(%p_emb_weight, %ids), kwargs = {})", nullptr), -1);  // the metadata says none
  EXPECT_EQ(padding_of({1, 2, 3, 4, 5, 6}, head + "(%p_emb_weight, %ids, 2), kwargs = {})", nullptr), 2);
  // A table looked up at constant indices (a relative-position table) is no embedding's lookup.
  OnnxBuilder fixed(17);
  fixed.input("x", {2}).output("y");
  fixed.init("table", make_tensor(DType::kF32, {3, 2}, {1, 2, 0, 0, 3, 4})).init("at", make_tensor(DType::kI64, {2}, {1, 2}));
  fixed.node("Gather", {"table", "at"}, {"rows"}).set_name("lookup");
  fixed.node("Add", {"rows", "x"}, {"y"}).set_name("add");
  auto f = fixed.import();
  ASSERT_TRUE(f.ok()) << f.status().message();
  int lookups = 0;
  for (const Node& n : f->nodes()) {
    if (n.dead || n.op != "gather") continue;
    ++lookups;
    EXPECT_EQ(n.attrs.get_int("padding_idx", -1), -1);
  }
  EXPECT_EQ(lookups, 1);
}

// --freeze names parameters: one the importer untied from a merged initializer, or the merged
// initializer's own, stays a constant at the model's value while the others train.
TEST(FrontendImport, FreezeNamesOneParameterOfAMergedInitializer) {
  OnnxBuilder b(17);
  b.input("x", {2, 3}).output("z");
  b.init("a.weight", make_tensor(DType::kF32, {3}, {1}));
  b.node("Mul", {"x", "a.weight"}, {"y"}).set_name("mul_a");
  b.node("Identity", {"a.weight"}, {"b.weight"}).set_name("id_b");
  b.node("Mul", {"y", "b.weight"}, {"z"}).set_name("mul_b");
  auto trained_with = [&](std::set<std::string> frozen) -> Expected<std::vector<std::string>> {
    ImportOptions o;
    o.frozen = std::move(frozen);
    MEMC_ASSIGN_OR_RETURN(Module m, b.import(o));
    return trained_names(m);
  };
  EXPECT_EQ(*trained_with({}), (std::vector<std::string>{"a.weight", "b.weight"}));
  EXPECT_EQ(*trained_with({"b.weight"}), (std::vector<std::string>{"a.weight"}));
  EXPECT_EQ(*trained_with({"a.weight"}), (std::vector<std::string>{"b.weight"}));
  EXPECT_TRUE(trained_with({"a.weight", "b.weight"})->empty());
  auto wrong = trained_with({"c.weight"});
  ASSERT_FALSE(wrong.ok());
  EXPECT_EQ(wrong.status().message(), "test.onnx: --freeze names 'c.weight', which is no initializer of the model");

  // The frozen parameter keeps the value: z = x·a·1 with a trained to 2.
  ImportOptions o;
  o.frozen = {"b.weight"};
  auto m = b.import(o);
  ASSERT_TRUE(m.ok()) << m.status().message();
  for (ValueId a : m->arguments())
    if (m->value(a).source_name == "a.weight") m->weights()[a] = make_tensor(DType::kF32, {3}, {2});
  auto out = execute(*m, {{"x", make_tensor(DType::kF32, {2, 3}, {3})}});
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->at(0).get_as_double(0), 6);
}

// gpt-oss through the dynamo exporter: the zero expert biases of two layers are merged into one
// initializer under the exporter's own name (`val_189`), each layer's read by a GatherND whose FX
// node indexes that layer's parameter. They train apart; the first keeps the initializer.
TEST(FrontendImport, ZeroBiasesMergedUnderTheExportersNameTrainApartByTheirReaders) {
  auto trained = [](const std::vector<std::string>& layers) {
    OnnxBuilder b(18);
    b.input("i", {2, 1}, onnx::TensorProto::INT64).input("x", {2, 4}).output("z");
    b.init("val_189", make_tensor(DType::kF32, {3, 4}, {0}));
    std::vector<std::string> reads;
    for (size_t k = 0; k < layers.size(); ++k) {
      const std::string& l = layers[k];
      onnx::NodeProto& g = b.node("GatherND", {"val_189", "i"}, {"y" + std::to_string(k)});
      g.set_name("node_GatherND_" + std::to_string(k));
      add_metadata(g, "pkg.torch.onnx.name_scopes", "['', 'model', 'model.layers." + l + "', 'model.layers." + l + ".experts', 'index_" + l + "']");
      add_fx_node(g, "%index_" + l + " : [num_users=1] = call_function[target=torch.ops.aten.index.Tensor](args = (%p_model_layers_" + l +
                         "_experts_down_proj_bias, [%view_9]), kwargs = {})");
      reads.push_back("y" + std::to_string(k));
    }
    b.node("Add", {reads[0], reads[1]}, {"s"});
    b.node("Mul", {"s", "x"}, {"z"});
    auto m = b.import();
    EXPECT_TRUE(m.ok()) << m.status().message();
    return m.ok() ? sorted_trained_names(*m) : std::vector<std::string>{};
  };
  EXPECT_EQ(trained({"0", "1"}), (std::vector<std::string>{"model.layers.1.experts.down_proj_bias", "val_189"}));
  EXPECT_EQ(trained({"0", "0"}), (std::vector<std::string>{"val_189"}));  // one parameter read twice
}

// Which parameter a dynamo node reads: torch.export lower-cases its placeholders
// (HF BERT's "LayerNorm" is "%p_..._layernorm_weight"), the name keeps the module's case, and the
// attribute must end the token ("weight" is not "weight_g").
TEST(FrontendImport, ParameterReadByADynamoNode) {
  OnnxBuilder b(18);
  onnx::NodeProto& n = b.node("LayerNormalization", {"x", "w", "b"}, {"y"});
  auto meta = [&](const std::string& key, const std::string& value) { add_metadata(n, key, value); };
  meta("pkg.torch.onnx.name_scopes", "['', 'm', 'm.bert.encoder.layer.0.output.LayerNorm', 'layer_norm_2']");
  meta("pkg.torch.onnx.fx_node", "%layer_norm_2 : [num_users=4] = call_function[target=torch.ops.aten.layer_norm.default](args = "
                                 "(%add_5, [32], %p_m_bert_encoder_layer_0_output_layernorm_weight_g, %p_m_bert_encoder_layer_0_output_layernorm_bias, 1e-12))");
  EXPECT_EQ(parameter_read(n, "bias"), "m.bert.encoder.layer.0.output.LayerNorm.bias");
  EXPECT_EQ(parameter_read(n, "weight"), "");
  EXPECT_EQ(parameter_read(n, "weight_g"), "m.bert.encoder.layer.0.output.LayerNorm.weight_g");
  // Whatever the attribute (a merge of different attributes): the one placeholder not accounted for.
  EXPECT_EQ(single_parameter_read(n), "");
  EXPECT_EQ(single_parameter_read(n, {"m.bert.encoder.layer.0.output.LayerNorm.bias"}), "m.bert.encoder.layer.0.output.LayerNorm.weight_g");
  OnnxBuilder scale(18);
  onnx::NodeProto& mul = scale.node("Mul", {"inner.m.blocks.0.gamma_1", "h"}, {"y"});
  add_metadata(mul, "pkg.torch.onnx.name_scopes", "['', 'inner', 'inner.m', 'inner.m.blocks_token_only.0', 'mul_73']");
  add_metadata(mul, "pkg.torch.onnx.fx_node", "%mul_73 : [num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%p_inner_m_blocks_token_only_0_gamma_2, %linear_17))");
  EXPECT_EQ(parameter_read(mul, "gamma_1"), "");
  EXPECT_EQ(single_parameter_read(mul), "inner.m.blocks_token_only.0.gamma_2");
  // A folded value merged by value (Gemma's `1 + weight`, one per RMSNorm): the FX value each use reads.
  OnnxBuilder merged(18);
  onnx::NodeProto& norm = merged.node("Mul", {"mul_63", "add_4"}, {"mul_64"});
  add_fx_node(norm, "%mul_64 : [num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul_63, %add_9), kwargs = {})");
  EXPECT_EQ(folded_value_read(norm, 1), "add_9");
  EXPECT_EQ(folded_value_read(norm, 0), "");
  // Or a view folded to a value of its own, whatever its op (timm's Scale: `scale.view(shape)`).
  onnx::NodeProto& scaled = merged.node("Mul", {"mul_63", "blocks.0.norm1.weight"}, {"mul_12"});
  add_fx_node(scaled, "%mul_12 : [num_users=1] = call_function[target=torch.ops.aten.mul.Tensor](args = (%mul_63, %view_5), kwargs = {})");
  EXPECT_EQ(folded_value_read(scaled, 1), "view_5");
  // The Add of a decomposed linear reads its input under another name (Swin V2's qkv bias,
  // `cat(q_bias, k_bias, v_bias)` folded): the FX value a node still computes is not the one.
  onnx::NodeProto& biased = merged.node("Add", {"val_173", "cat"}, {"linear_6"});
  add_fx_node(biased, "%linear_6 : [num_users=1] = call_function[target=torch.ops.aten.linear.default](args = (%view_14, %p_b_qkv_weight, %cat_1), kwargs = {})");
  EXPECT_EQ(folded_value_read(biased, 1), "");
  EXPECT_EQ(folded_value_read(biased, 1, {"view_14"}), "cat_1");
  // timm's GRN: addcmul(bias view, weight view, x) decomposed to Mul(weight view, x) and Add(bias view, product),
  // both views zeros merged into `view`: the Mul reads tensor1, the Add the input.
  const std::string addcmul = "%addcmul : [num_users=1] = call_function[target=torch.ops.aten.addcmul.default](args = (%view, %view_1, %mul), kwargs = {})";
  onnx::NodeProto& product = merged.node("Mul", {"view", "mul"}, {"tmp_0"});
  add_fx_node(product, addcmul);
  onnx::NodeProto& sum = merged.node("Add", {"view", "tmp_0"}, {"addcmul"});
  add_fx_node(sum, addcmul);
  EXPECT_EQ(folded_value_read(product, 0, {"mul"}), "view_1");
  EXPECT_EQ(folded_value_read(sum, 0, {"mul"}), "");  // its own name: the initializer keeps it

  // By place: LeViT's BatchNorm reads zeros (named after another module's weight) as its weight,
  // bias and mean, and ones (named after this other module's weight) as its variance.
  OnnxBuilder placed(18);
  onnx::NodeProto& bn = placed.node("BatchNormalization", {"x", "a.bn.weight", "a.bn.weight", "a.bn.weight", "b.bn.weight"}, {"y"});
  add_metadata(bn, "pkg.torch.onnx.name_scopes", "['', 'c', 'c.bn', 'bn_5']");
  add_fx_node(bn, "%bn_5 : [num_users=1] = call_function[target=torch.ops.aten._native_batch_norm_legit_no_training.default](args = "
                  "(%x, %p_c_bn_weight, %p_c_bn_bias, %b_c_bn_running_mean, %b_c_bn_running_var, 0.1, 1e-05))");
  const std::vector<std::string> inputs = {"a.bn.weight", "a.bn.weight", "a.bn.weight", "b.bn.weight"};
  EXPECT_EQ(parameters_by_place(bn, inputs), (std::vector<std::string>{"c.bn.weight", "c.bn.bias", "c.bn.running_mean", "c.bn.running_var"}));
  // An input that is another place's own name says the FX order is not the ONNX order (addmm's bias first).
  EXPECT_TRUE(parameters_by_place(bn, {"c.bn.bias", "c.bn.weight", "u", "v"}).empty());
  // Distinct inputs named after no place: no evidence.
  EXPECT_TRUE(parameters_by_place(bn, {"a.bn.weight", "b.bn.weight", "u", "v"}).empty());
  EXPECT_EQ(parameters_by_place(bn, {"c.bn.weight", "b.bn.weight", "u", "v"})[1], "c.bn.bias");
  EXPECT_TRUE(parameters_by_place(bn, {"c.bn.weight", "b.bn.weight"}).empty());

  // A folded transpose is named after its parameter the same way (T5's "SelfAttention").
  OnnxBuilder folded(18);
  folded.input("x", {2, 2}).output("y");
  folded.init("val_7", make_tensor(DType::kF32, {2, 2}, {1, 2, 3, 4}));
  onnx::NodeProto& mm = folded.node("MatMul", {"x", "val_7"}, {"y"});
  add_metadata(mm, "pkg.torch.onnx.name_scopes", "['', 'enc.SelfAttention.q', 'linear']");
  add_metadata(mm, "pkg.torch.onnx.fx_node", "%linear : [num_users=1] = call_function[target=torch.ops.aten.linear.default](args = (%x, %p_enc_selfattention_q_weight))");
  std::vector<std::string> findings;
  ASSERT_TRUE(import_with_findings(folded, findings).ok());
  EXPECT_TRUE(has_finding(findings, "initializer 'val_7' [2x2] is the exporter's folded transpose of parameter 'enc.SelfAttention.q.weight'"))
      << (findings.empty() ? "" : findings[0]);
}

// A model-local function (as the dynamo exporter writes) is inlined.
TEST(FrontendImport, InlinesLocalFunctions) {
  OnnxBuilder b(18);
  auto& proto = b.proto();
  auto* op = proto.add_opset_import();
  op->set_domain("local");
  op->set_version(1);
  auto* f = proto.add_functions();
  f->set_name("Twice");
  f->set_domain("local");
  f->add_input("a");
  f->add_output("out");
  auto* n = f->add_node();
  n->set_op_type("Add");
  n->add_input("a");
  n->add_input("a");
  n->add_output("out");
  b.input("x", {3}).output("y");
  auto& call = b.node("Twice", {"x"}, {"y"});
  call.set_domain("local");
  auto m = b.import();
  ASSERT_TRUE(m.ok()) << m.status().message();
  auto out = execute(*m, {{"x", make_tensor(DType::kF32, {3}, {1, 2, 3})}});
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->at(0).get_as_double(2), 6);
}

}  // namespace
}  // namespace memc
