// Text form: print → parse → print is identical on a fixture covering every syntax feature and
// on a module that uses every registered op; the parser rejects broken text without crashing.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <random>

#include "ir/op_registry.h"
#include "ir/printer.h"
#include "ir/verifier.h"

namespace memc {
namespace {

// Every attribute kind, multi-result nodes, an absent optional input (linear's bias), host
// values, non-default result roles, metadata, escapes, scalars, 16-bit/i1/ui8 types and
// constants of each dtype. Hex: 1.0f = 0000803F, 2.0f = 00000040, 1.5f = 0000C03F,
// f16 1.0 = 003C, bf16 1.0 = 803F, f64 1.0 = 000000000000F03F, i1 [1,0,1] = 05 (bit-packed).
constexpr const char* kFixture = R"IR(func.func @main(%x: tensor<4x8xf32> {memc.role = "input", memc.name = "x:0 \"q\"\01\C3\A9"}, %w: tensor<8x8xf32> {memc.role = "param", memc.name = "head.weight"}, %scale: tensor<8xf32> {memc.role = "param", memc.name = "ln.scale"}, %lr: tensor<f32> {memc.role = "scalar", memc.name = "lr", memc.space = "host"}, %labels: tensor<4xi64> {memc.role = "input", memc.name = "labels"}, %h: tensor<2x4xf16> {memc.role = "input", memc.name = "h"}, %bh: tensor<2x4xbf16> {memc.role = "master_weight", memc.name = "bh"}, %flags: tensor<3xi1> {memc.role = "constant", memc.name = "flags"}, %q8: tensor<5xui8> {memc.role = "optimizer_state", memc.name = "q8", memc.space = "host"}) -> (tensor<f32>, tensor<4x8xf32>) attributes {"memc.odd key" = ["a", "b"], memc.opset = 17 : i64, memc.producer = "pytorch 2.3", memc.scales = array<f64: 0.5, 1.0e-05>} {
  %0 = "memc.linear"(%x, %w) {memc.absent = array<i64: 2>, memc.source = "/head/Gemm (Gemm)"} : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %y, %mean, %rstd = "memc.layernorm"(%0, %scale) {axis = 1 : i64, eps = 1.0e-05 : f64} : (tensor<4x8xf32>, tensor<8xf32>) -> (tensor<4x8xf32>, tensor<4x1xf32>, tensor<4x1xf32>)
  %d, %mask = "memc.dropout"(%y) {ratio = 0.1 : f64, seed = 42 : i64} : (tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xi1>)
  %loss = "memc.softmax_cross_entropy"(%d, %labels) : (tensor<4x8xf32>, tensor<4xi64>) -> tensor<f32>
  %g = "memc.mul"(%d, %d) {memc.result_roles = ["grad"], memc.result_spaces = ["host"]} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %kinds = "memc.copy"(%g) {a_int = 3 : i64, b_min = -9223372036854775808 : i64, c_float = 1.0e+20 : f64, d_inf = 0xFFF0000000000000 : f64, e_nan = 0x7FF8000000000000 : f64, f_str = "tab\there \"q\" back\\slash\n\01", g_ints = array<i64: 1, -2, 3>, h_ints_empty = array<i64>, i_floats = array<f64: -0.0, 2.5, 0x7FF0000000000000>, j_floats_empty = array<f64>, k_strs = ["", "x y"], l_strs_empty = [], m_tensor = dense<"0x0000803F00000040"> : tensor<2xf32>, "n key" = 0.25 : f64, memc.result_roles = ["grad"]} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %c_f32 = "memc.constant"() {value = dense<"0x0000803F00000040"> : tensor<2xf32>} : () -> tensor<2xf32>
  %c_scalar = "memc.constant"() {value = dense<"0x0000C03F"> : tensor<f32>} : () -> tensor<f32>
  %c_f16 = "memc.constant"() {value = dense<"0x003C0040"> : tensor<2xf16>} : () -> tensor<2xf16>
  %c_bf16 = "memc.constant"() {value = dense<"0x803F"> : tensor<1xbf16>} : () -> tensor<1xbf16>
  %c_f64 = "memc.constant"() {value = dense<"0x000000000000F03F"> : tensor<1xf64>} : () -> tensor<1xf64>
  %c_i64 = "memc.constant"() {value = dense<"0xFFFFFFFFFFFFFFFF0100000000000000"> : tensor<2xi64>} : () -> tensor<2xi64>
  %c_i32 = "memc.constant"() {value = dense<"0x07000000"> : tensor<1xi32>} : () -> tensor<1xi32>
  %c_i1 = "memc.constant"() {value = dense<"0x05"> : tensor<3xi1>} : () -> tensor<3xi1>
  %c_i1_wide = "memc.constant"() {value = dense<"0xFF01"> : tensor<9xi1>} : () -> tensor<9xi1>
  %c_u8 = "memc.constant"() {value = dense<"0xFF01"> : tensor<2xui8>} : () -> tensor<2xui8>
  %c_empty = "memc.constant"() {value = dense<"0x"> : tensor<0x3xf32>} : () -> tensor<0x3xf32>
  %c_act = "memc.constant"() {value = dense<"0x00000000"> : tensor<1xf32>, memc.result_roles = ["activation"]} : () -> tensor<1xf32>
  %5 = "memc.add"(%loss, %lr) : (tensor<f32>, tensor<f32>) -> tensor<f32>
  "func.return"(%5, %kinds) : (tensor<f32>, tensor<4x8xf32>) -> ()
}
)IR";

// tests/ir_mlir_test.sh sets MEMC_IR_DUMP_DIR and feeds these files to mlir-opt.
void dump_for_mlir_opt(const std::string& file, const std::string& text) {
  if (const char* dir = std::getenv("MEMC_IR_DUMP_DIR")) std::ofstream(std::string(dir) + "/" + file) << text;
}

Module parse_ok(std::string_view text) {
  auto parsed = parse_module(text);
  EXPECT_TRUE(parsed.ok()) << parsed.status().message();
  return parsed.ok() ? std::move(parsed).value() : Module();
}

TEST(IrText, FixtureRoundTripsByteForByte) {
  Module m = parse_ok(kFixture);
  EXPECT_EQ(print_module(m), kFixture);
  dump_for_mlir_opt("fixture.mlir", kFixture);
  EXPECT_TRUE(verify(m).ok()) << verify(m).message();
}

TEST(IrText, ParserRestoresFieldsFromReservedAttributes) {
  Module m = parse_ok(kFixture);
  const Value& x = m.value(m.find_value("x"));
  EXPECT_EQ(x.source_name, "x:0 \"q\"\x01\xC3\xA9");
  EXPECT_EQ(x.role, Role::kInput);
  EXPECT_EQ(m.value(m.find_value("lr")).space, MemSpace::kHost);
  EXPECT_EQ(m.value(m.find_value("q8")).role, Role::kOptimizerState);
  EXPECT_EQ(m.value(m.find_value("g")).role, Role::kGrad);
  EXPECT_EQ(m.value(m.find_value("g")).space, MemSpace::kHost);
  EXPECT_EQ(m.value(m.find_value("c_f32")).role, Role::kConstant);
  EXPECT_EQ(m.value(m.find_value("c_act")).role, Role::kActivation);

  const Node& linear = m.node(m.value(m.find_value("0")).producer);
  ASSERT_EQ(linear.inputs.size(), 3u);
  EXPECT_EQ(linear.inputs[2], kNoValue);
  EXPECT_EQ(linear.source, "/head/Gemm (Gemm)");
  EXPECT_TRUE(linear.attrs.items().empty());
  EXPECT_EQ(m.node(m.value(m.find_value("y")).producer).outputs.size(), 3u);

  const Attrs& kinds = m.node(m.value(m.find_value("kinds")).producer).attrs;
  EXPECT_EQ(kinds.get_int("b_min", 0), INT64_MIN);
  EXPECT_EQ(kinds.get_float("c_float", 0), 1e20);
  EXPECT_TRUE(std::isinf(kinds.get_float("d_inf", 0)) && kinds.get_float("d_inf", 0) < 0);
  EXPECT_TRUE(std::isnan(kinds.get_float("e_nan", 0)));
  EXPECT_EQ(kinds.get_string("f_str", ""), "tab\there \"q\" back\\slash\n\x01");
  EXPECT_EQ(kinds.get_ints("g_ints"), (std::vector<int64_t>{1, -2, 3}));
  EXPECT_TRUE(std::signbit(kinds.get_floats("i_floats")[0]));
  EXPECT_EQ(kinds.get_float("n key", 0), 0.25);
  EXPECT_FALSE(kinds.has(std::string(kResultRolesAttr)));

  const Tensor* bools = m.node(m.value(m.find_value("c_i1_wide")).producer).attrs.get_tensor("value");
  ASSERT_NE(bools, nullptr);
  for (int64_t i = 0; i < 9; ++i) EXPECT_EQ(bools->get_as_int(i), 1) << i;
  const Tensor* f16 = m.node(m.value(m.find_value("c_f16")).producer).attrs.get_tensor("value");
  EXPECT_EQ(f16->get_as_double(1), 2.0);
  EXPECT_EQ(m.metadata().get_int("opset", 0), 17);
  EXPECT_EQ(m.metadata().get_floats("scales")[1], 1e-05);
  EXPECT_EQ(m.outputs().size(), 2u);
}

// Doubles print with the fewest digits that read back exactly (and always a '.').
TEST(IrText, FloatsRoundTripExactly) {
  std::mt19937_64 rng(7);
  Module m;
  const ValueId x = m.add_argument("x", {DType::kF32, {2}}, Role::kInput);
  Attrs attrs;
  std::vector<double> values = {1e-5, static_cast<float>(1e-5), 0.1, -0.0, 3.0, 1e300, 5e-324, 1.0 / 3.0};
  for (int i = 0; i < 200; ++i) {
    const uint64_t bits = rng();
    double v;
    std::memcpy(&v, &bits, 8);
    values.push_back(v);  // includes NaNs with payloads and infinities
  }
  attrs.set("f", values);
  attrs.set("one", values[1]);
  ASSERT_TRUE(m.add_node("copy", {x}, attrs).ok());
  m.set_outputs({x});
  const std::string text = print_module(m);
  EXPECT_NE(text.find("9.999999747378752e-06 : f64"), std::string::npos) << text;
  Module back = parse_ok(text);
  ASSERT_EQ(back.nodes().size(), 1u);
  const auto parsed = back.node(0).attrs.get_floats("f");
  ASSERT_EQ(parsed.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(std::memcmp(&parsed[i], &values[i], 8), 0) << i;
  EXPECT_EQ(print_module(back), text);
}

// Input types that satisfy each op; ops not listed are tried with generic guesses below.
struct Recipe {
  std::vector<std::optional<TensorType>> inputs;  // nullopt: absent optional input
  Attrs attrs;
  int num_outputs = -1;
};

Attrs make_attrs(std::initializer_list<std::pair<const char*, Attr>> items) {
  Attrs a;
  for (const auto& [k, v] : items) a.set(k, v);
  return a;
}

std::map<std::string, std::vector<Recipe>> explicit_recipes() {
  const TensorType f{DType::kF32, {2, 3}}, i64{DType::kI64, {2, 3}};
  std::map<std::string, std::vector<Recipe>> r;
  r["linear"] = {{{f, TensorType{DType::kF32, {4, 3}}, std::nullopt}}};
  r["layernorm"] = {{{f, TensorType{DType::kF32, {3}}, TensorType{DType::kF32, {3}}}, make_attrs({{"axis", int64_t{1}}, {"eps", 1e-5}}), 3}};
  r["add_layernorm"] = {{{f, TensorType{DType::kBF16, {2, 3}}, TensorType{DType::kF32, {3}}, TensorType{DType::kF32, {3}}},
                         make_attrs({{"axis", int64_t{1}}, {"eps", 1e-5}})}};
  r["layernorm_grad"] = {{{f, f, TensorType{DType::kF32, {3}}, f}, make_attrs({{"axis", int64_t{1}}})}};
  r["dropout"] = {{{f}, make_attrs({{"ratio", 0.25}, {"seed", int64_t{3}}}), 2}};
  r["conv"] = {{{TensorType{DType::kF32, {1, 2, 5, 5}}, TensorType{DType::kF32, {4, 2, 3, 3}}, TensorType{DType::kF32, {4}}},
                make_attrs({{"strides", std::vector<int64_t>{2, 2}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}})}};
  r["attention"] = {{{TensorType{DType::kF32, {2, 4, 8}}, TensorType{DType::kF32, {2, 6, 8}}, TensorType{DType::kF32, {2, 6, 8}},
                      TensorType{DType::kF32, {4, 6}}}, make_attrs({{"scale", 0.125}})}};
  // The sum's first term (slot 0 absent) round-trips its absent slot; the other recipe is a term.
  r["matmul_acc"] = {{{std::nullopt, TensorType{DType::kBF16, {2, 3}}, TensorType{DType::kBF16, {3, 4}}}, make_attrs({{"dtype", std::string("f32")}})},
                     {{TensorType{DType::kF32, {2, 4}}, TensorType{DType::kBF16, {3, 2}}, TensorType{DType::kBF16, {3, 4}}},
                      make_attrs({{"transpose_a", int64_t{1}}})}};
  r["cast"] = {{{f}, make_attrs({{"to", std::string("bf16")}})}};
  r["fused_elementwise"] = {{{f, TensorType{DType::kF32, {3}}},
                             make_attrs({{"ops", std::vector<std::string>{"add", "gelu", "dropout"}},
                                         {"args", std::vector<int64_t>{0, 1, -1, 2, -1, -1, 3, -1, -1}},
                                         {"step_attrs", std::vector<std::string>{"", "approximate=tanh", "ratio=0.25;seed=3"}},
                                         {"results", std::vector<int64_t>{4}}})}};
  r["gather"] = {{{TensorType{DType::kF32, {10, 4}}, TensorType{DType::kI64, {2, 3}}}, make_attrs({{"axis", int64_t{0}}})}};
  r["softmax_cross_entropy"] = {{{f, TensorType{DType::kI64, {2}}}}};
  r["where"] = {{{TensorType{DType::kBool, {2, 3}}, f, f}}};
  r["slice"] = {{{f}, make_attrs({{"axes", std::vector<int64_t>{1}}, {"starts", std::vector<int64_t>{0}},
                                  {"ends", std::vector<int64_t>{3}}, {"steps", std::vector<int64_t>{2}}})}};
  r["concat"] = {{{f, f, f}, make_attrs({{"axis", int64_t{1}}})}};
  r["full"] = {{{}, make_attrs({{"shape", std::vector<int64_t>{2, 2}}, {"dtype", std::string("f16")}, {"value", 1.5}})}};
  Tensor value = Tensor::zeros(DType::kI32, {3});
  value.set_from_double(1, -4);
  r["constant"] = {{{}, make_attrs({{"value", value}})}};
  const TensorType scalar{DType::kF32, {}}, codes{DType::kU8, {2, 3}}, maxima{DType::kF32, {1}};
  r["adam8bit_update"] = {{{f, f, codes, maxima, codes, maxima, scalar, scalar}, make_attrs({{"block", int64_t{2048}}})}};
  r["adafactor_update"] = {{{f, f, TensorType{DType::kF32, {2}}, TensorType{DType::kF32, {3}}, scalar, scalar},
                            make_attrs({{"factored", int64_t{1}}}), 3},
                           {{f, f, f, scalar, scalar}, make_attrs({{"factored", int64_t{0}}}), 2}};
  // Collectives (ir/ops/collective.cc): 2 ranks of the group "world"; the async pairs'
  // done ops take (pending, x).
  const Attrs group = make_attrs({{"ranks", int64_t{2}}, {"group", std::string("world")}});
  const Attrs summed = make_attrs({{"ranks", int64_t{2}}, {"reduce", std::string("sum")}});
  const TensorType gathered{DType::kF32, {4, 3}}, scattered{DType::kBF16, {1, 3}}, h{DType::kBF16, {2, 3}};
  r["all_gather"] = r["all_gather_start"] = {{{f}, group}};
  r["all_gather_done"] = {{{gathered, f}, group}};
  r["reduce_scatter"] = r["reduce_scatter_start"] = {{{h}, summed}};
  r["reduce_scatter_done"] = {{{scattered, h}, summed}};
  r["all_reduce"] = r["all_reduce_start"] = {{{f}, make_attrs({{"ranks", int64_t{4}}, {"reduce", std::string("max")}})}};
  r["all_reduce_done"] = {{{f, f}, summed}};
  r["broadcast"] = r["broadcast_start"] = {{{i64}, make_attrs({{"ranks", int64_t{2}}, {"root", int64_t{1}}})}};
  r["broadcast_done"] = {{{i64, i64}, make_attrs({{"ranks", int64_t{2}}, {"root", int64_t{0}}})}};
  // Flat-buffer ops of the shard pass: a rank's block, and a unit's pieces (with padding).
  const TensorType flat{DType::kF32, {10}};
  r["shard_block"] = {{{flat}, make_attrs({{"ranks", int64_t{2}}})}};
  r["split_flat"] = {{{flat}, make_attrs({{"sizes", std::vector<int64_t>{6, 3}}}), 2}};
  return r;
}

// Guesses for ops the table does not know: shape attributes that fit [2, 3] operands, and a
// few dtype patterns (all float, float with integer indices, all bool, float with labels,
// tensors followed by one or two f32 scalars as optimizer updates take lr and step).
std::vector<Recipe> generic_recipes(const OpDef& def) {
  const TensorType f{DType::kF32, {2, 3}}, i{DType::kI64, {2, 3}}, b{DType::kBool, {2, 3}}, labels{DType::kI64, {2}},
      scalar{DType::kF32, {}};
  Attrs sink = make_attrs({{"shape", std::vector<int64_t>{2, 3}}, {"input_shape", std::vector<int64_t>{2, 3}},
                           {"weight_shape", std::vector<int64_t>{2, 3}}, {"perm", std::vector<int64_t>{1, 0}},
                           {"repeats", std::vector<int64_t>{2, 1}}, {"pads", std::vector<int64_t>{0, 1, 0, 1}},
                           {"axes", std::vector<int64_t>{1}}, {"axis", int64_t{0}}, {"to", std::string("f16")},
                           {"dtype", std::string("f32")}, {"transpose_b", int64_t{1}}});
  const int max_inputs = def.max_inputs < 0 ? def.min_inputs + 2 : std::min(def.max_inputs, def.min_inputs + 3);
  std::vector<Recipe> out;
  for (const Attrs& attrs : {sink, Attrs{}}) {
    for (int n = def.min_inputs; n <= max_inputs; ++n) {
      for (int pattern = 0; pattern < 6; ++pattern) {
        Recipe r{.attrs = attrs};
        for (int k = 0; k < n; ++k) {
          const TensorType pick[6] = {f, k == 0 ? f : i, b, k == n - 1 && n > 1 ? labels : f, k >= n - 1 ? scalar : f,
                                      k >= n - 2 ? scalar : f};
          r.inputs.push_back(pick[pattern]);
        }
        out.push_back(r);
      }
    }
  }
  return out;
}

// Adds one node of `op` (with fresh arguments as its inputs) from the first recipe that the
// shape function accepts.
bool add_any(Module& m, const std::string& op, std::vector<ValueId>& results) {
  const OpDef* def = OpRegistry::get().find(op);
  auto table = explicit_recipes();
  std::vector<Recipe> recipes = table.count(op) ? table[op] : generic_recipes(*def);
  for (const Recipe& recipe : recipes) {
    Node probe;
    probe.op = op;
    probe.attrs = recipe.attrs;
    if (recipe.num_outputs > 0) probe.outputs.assign(recipe.num_outputs, kNoValue);
    std::vector<TensorType> types, out;
    std::vector<bool> present;
    for (const auto& t : recipe.inputs) {
      present.push_back(t.has_value());
      if (t) types.push_back(*t);
    }
    if (!infer_types(probe, types, present, out).ok() || out.empty()) continue;
    std::vector<ValueId> inputs;
    for (const auto& t : recipe.inputs) {
      inputs.push_back(t ? m.add_argument(op + "_in", *t, Role::kInput) : kNoValue);
    }
    auto added = m.add_node(op, inputs, recipe.attrs, "test " + op, recipe.num_outputs);
    if (!added.ok()) continue;
    // Transfers cross memory spaces (the verifier checks which way).
    if (op.starts_with("copy_to_host")) {
      for (ValueId v : *added) m.value(v).space = MemSpace::kHost;
      if (op.ends_with("_done")) m.value(inputs[0]).space = MemSpace::kHost;  // the pending buffer
    }
    if (op.starts_with("copy_to_device")) m.value(inputs[op.ends_with("_done") ? 1 : 0]).space = MemSpace::kHost;
    results.insert(results.end(), added->begin(), added->end());
    return true;
  }
  return false;
}

TEST(IrText, EveryRegisteredOpRoundTrips) {
  Module m;
  std::vector<ValueId> outputs;
  for (const std::string& op : OpRegistry::get().names()) {
    EXPECT_TRUE(add_any(m, op, outputs)) << "no recipe builds memc." << op << "; add one to explicit_recipes()";
  }
  m.set_outputs(outputs);
  m.value(outputs.back()).role = Role::kGrad;
  m.value(outputs.front()).space = MemSpace::kHost;
  m.metadata().set("opset", int64_t{17});
  ASSERT_TRUE(verify(m).ok()) << verify(m).message();
  const std::string text = print_module(m);
  dump_for_mlir_opt("all_ops.mlir", text);
  Module back = parse_ok(text);
  EXPECT_EQ(print_module(back), text);
  EXPECT_TRUE(verify(back).ok()) << verify(back).message();
  ASSERT_EQ(back.nodes().size(), m.nodes().size());
  for (size_t n = 0; n < m.nodes().size(); ++n) {
    EXPECT_EQ(back.node(n).op, m.node(n).op);
    EXPECT_TRUE(back.node(n).attrs == m.node(n).attrs) << m.node(n).op;
    auto names = [](const Module& mod, const Node& node) {
      std::vector<std::string> out;
      for (ValueId v : node.inputs) out.push_back(v == kNoValue ? "<absent>" : mod.value(v).name);
      return out;
    };
    EXPECT_EQ(names(back, back.node(n)), names(m, m.node(n))) << m.node(n).op;
  }
}

TEST(IrText, DeadNodesAndEmptyModulesPrint) {
  Module empty;
  EXPECT_EQ(print_module(empty), "func.func @main() -> () {\n  \"func.return\"() : () -> ()\n}\n");
  EXPECT_EQ(print_module(parse_ok(print_module(empty))), print_module(empty));

  Module m;
  const ValueId x = m.add_argument("x", {DType::kF32, {2}}, Role::kInput);
  auto y = m.add_node("neg", {x});
  auto unused = m.add_node("exp", {x});
  ASSERT_TRUE(y.ok() && unused.ok());
  m.set_outputs({(*y)[0]});
  EXPECT_EQ(m.eliminate_dead_nodes(), 1);
  const std::string text = print_module(m);
  EXPECT_EQ(text.find("memc.exp"), std::string::npos);
  EXPECT_EQ(print_node(m, m.node(0)), "%1 = \"memc.neg\"(%x) : (tensor<2xf32>) -> tensor<2xf32>");
}

void expect_error(std::string_view text, const std::string& fragment) {
  auto parsed = parse_module(text);
  ASSERT_FALSE(parsed.ok()) << text;
  EXPECT_EQ(parsed.status().kind(), ErrorKind::kBadInput);
  EXPECT_NE(parsed.status().message().find(fragment), std::string::npos) << parsed.status().message();
}

std::string replace_once(std::string text, const std::string& from, const std::string& to) {
  const size_t at = text.find(from);
  EXPECT_NE(at, std::string::npos) << from;
  return at == std::string::npos ? text : text.replace(at, from.size(), to);
}

TEST(IrParse, ErrorsNameLineColumnAndWhatWasExpected) {
  auto parsed = parse_module("func.func @main(");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(), "1:17: expected a value name ('%name'), found end of input");
  parsed = parse_module("// a comment\nfunc.func @main() -> () {\n  \"func.return\"() : () -> ()\n} junk");
  ASSERT_FALSE(parsed.ok());
  EXPECT_EQ(parsed.status().message(), "4:3: expected end of input after the function, found 'j'");
}

TEST(IrParse, UnknownValue) {
  const std::string text = replace_once(kFixture, "(%loss, %lr)", "(%loss, %nope)");
  expect_error(text, "%nope is not defined above");
  expect_error(text, "20:26: expected a defined value");  // the add is on line 20
}

TEST(IrParse, TypeMismatch) {
  expect_error(replace_once(kFixture, "(tensor<f32>, tensor<f32>) -> tensor<f32>", "(tensor<f32>, tensor<1xf32>) -> tensor<f32>"),
               "operand 1 to have type tensor<f32> as defined, not tensor<1xf32>");
  expect_error(replace_once(kFixture, "-> (tensor<f32>, tensor<4x8xf32>) attributes", "-> (tensor<f32>) attributes"),
               "function's result types");
  expect_error(replace_once(kFixture, "dense<\"0x07000000\">", "dense<\"0x0700\">"), "4 bytes of dense data");
}

TEST(IrParse, RedefinitionAndBadReservedAttributes) {
  expect_error(replace_once(kFixture, "%c_u8 =", "%c_f32 ="), "%c_f32 is already defined");
  expect_error(replace_once(kFixture, "memc.absent = array<i64: 2>", "memc.absent = array<i64: 7>"), "memc.absent slots");
  expect_error(replace_once(kFixture, "memc.result_roles = [\"grad\"], memc.result_spaces", "memc.result_roles = [\"grad\", \"grad\"], memc.result_spaces"),
               "one string per result");
  expect_error(replace_once(kFixture, "\"memc.mul\"", "\"mul\""), "\"memc.<op>\"");
  expect_error(replace_once(kFixture, "b_min = -9223372036854775808", "b_min = -9223372036854775809"), "fits in i64");
  expect_error(replace_once(kFixture, "tensor<4x8xf32> {memc.role = \"input\"", "tensor<4x8xf32> {memc.role = \"bogus\""), "known role");
  expect_error(replace_once(kFixture, "tensor<2x4xf16> {", "tensor<2x4xf17> {"), "an element type");
  expect_error("func.func @main() -> (tensor<99999999999x99999999999xf32>) {", "elements");
}

TEST(IrParse, EveryTruncationFailsCleanly) {
  const std::string fixture = kFixture;
  // The last lines hold the closing brace (and a final newline, which is optional).
  const size_t body_end = fixture.rfind('}');
  for (size_t len = 0; len <= body_end; ++len) {
    auto parsed = parse_module(std::string_view(fixture).substr(0, len));
    EXPECT_FALSE(parsed.ok()) << "prefix of " << len << " bytes parsed";
    if (parsed.ok()) break;
  }
}

// Random byte edits of the fixture and random bytes: the parser must return (never crash),
// and whatever it accepts must round-trip.
TEST(IrParse, MutatedAndGarbageInputNeverCrash) {
  std::mt19937 rng(1234);
  const std::string fixture = kFixture;
  const std::string alphabet = "%\"{}()<>[],:=-x0123456789.e\\@ \nabfi";
  int accepted = 0;
  for (int iter = 0; iter < 3000; ++iter) {
    std::string text = fixture;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits && !text.empty(); ++e) {
      const size_t at = rng() % text.size();
      switch (rng() % 4) {
        case 0: text[at] = static_cast<char>(rng() % 256); break;
        case 1: text.erase(at, 1 + rng() % 8); break;
        case 2: text.insert(at, 1, alphabet[rng() % alphabet.size()]); break;
        default: text.insert(at, text.substr(rng() % text.size(), rng() % 16)); break;
      }
    }
    auto parsed = parse_module(text);
    if (!parsed.ok()) continue;
    ++accepted;
    const std::string printed = print_module(*parsed);
    auto again = parse_module(printed);
    ASSERT_TRUE(again.ok()) << again.status().message() << "\n" << printed;
    EXPECT_EQ(print_module(*again), printed);
    (void)verify(*parsed);  // must not crash either
  }
  for (int iter = 0; iter < 500; ++iter) {
    std::string garbage(rng() % 200, '\0');
    for (char& c : garbage) c = static_cast<char>(rng() % 256);
    if (iter % 2) garbage = "func.func @main(" + garbage;
    EXPECT_FALSE(parse_module(garbage).ok());
  }
  EXPECT_GT(accepted, 0);  // some edits only touch names or strings
}

}  // namespace
}  // namespace memc
