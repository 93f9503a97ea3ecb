// Verifier: a valid module passes; each structural or type error is caught with a message
// that names the node (as print_node shows it) and the problem.
#include <gtest/gtest.h>

#include "ir/printer.h"
#include "ir/verifier.h"

namespace memc {
namespace {

constexpr const char* kValid = R"IR(func.func @main(%x: tensor<4x8xf32> {memc.role = "input", memc.name = "x"}, %w: tensor<8x8xf32> {memc.role = "param", memc.name = "w"}) -> (tensor<4x8xf32>) {
  %h = "memc.matmul"(%x, %w) : (tensor<4x8xf32>, tensor<8x8xf32>) -> tensor<4x8xf32>
  %y = "memc.relu"(%h) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  "func.return"(%y) : (tensor<4x8xf32>) -> ()
}
)IR";

Module valid_module() {
  auto parsed = parse_module(kValid);
  EXPECT_TRUE(parsed.ok()) << parsed.status().message();
  return parsed.ok() ? std::move(parsed).value() : Module();
}

// Verifies and checks that the message holds every fragment.
void expect_invalid(const Module& m, std::initializer_list<std::string> fragments) {
  Status st = verify(m);
  ASSERT_FALSE(st.ok());
  for (const std::string& f : fragments) EXPECT_NE(st.message().find(f), std::string::npos) << st.message();
}

TEST(Verifier, ValidModulePasses) {
  Module m = valid_module();
  EXPECT_TRUE(verify(m).ok()) << verify(m).message();
}

TEST(Verifier, UseBeforeDefinition) {
  Module m = valid_module();
  m.set_schedule({1, 0});  // relu before the matmul that defines %h
  expect_invalid(m, {"node %y = \"memc.relu\"(%h)", "input 0 %h is used before its definition"});
}

TEST(Verifier, WrongDeclaredOutputType) {
  Module m = valid_module();
  m.value(m.find_value("y")).type = TensorType{DType::kF32, {8, 4}};
  expect_invalid(m, {"%y = \"memc.relu\"", "result 0 %y is declared tensor<8x4xf32> but the op infers tensor<4x8xf32>"});
  Module bf = valid_module();
  bf.value(bf.find_value("h")).type.dtype = DType::kBF16;  // now relu's input is bf16 too
  expect_invalid(bf, {"memc.matmul", "declared tensor<4x8xbf16> but the op infers tensor<4x8xf32>"});
}

TEST(Verifier, UnknownOp) {
  Module m = valid_module();
  m.node(1).op = "frobnicate";
  expect_invalid(m, {"\"memc.frobnicate\"(%h)", "unknown op memc.frobnicate"});
}

// A node's op renamed behind its back: the registry entry it holds is another op's.
TEST(Verifier, StaleRegistryEntry) {
  Module m = valid_module();
  const std::string op = m.node(1).op;
  m.node(1).op = "add";
  expect_invalid(m, {"holds the registry entry of memc." + op + ", not of memc.add"});
}

TEST(Verifier, DuplicateDefinition) {
  Module m = valid_module();
  const ValueId x = m.find_value("x");
  m.node(0).outputs[0] = x;  // the matmul claims to define the argument %x
  expect_invalid(m, {"%x = \"memc.matmul\"", "%x is defined twice"});
}

TEST(Verifier, DeadProducerAndUndefinedOutput) {
  Module m = valid_module();
  m.node(0).dead = true;  // relu still reads %h
  expect_invalid(m, {"input 0 %h is produced by a dead node"});
  Module out = valid_module();
  out.node(1).dead = true;
  expect_invalid(out, {"module output %y is not defined"});
}

TEST(Verifier, ArgumentRolesAndReservedAttributes) {
  Module m = valid_module();
  m.value(m.find_value("w")).role = Role::kActivation;
  expect_invalid(m, {"argument %w: role activation cannot be a function argument"});
  Module r = valid_module();
  r.node(1).attrs.set("memc.source", std::string("x"));
  expect_invalid(r, {"memc.source is reserved"});
}

TEST(Verifier, TypesAndNamesMustFitTheTextForm) {
  Module m = valid_module();
  m.value(m.find_value("x")).type.shape = {-1, 8};
  expect_invalid(m, {"%x has type tensor<-1x8xf32>, outside what the text form holds"});
  Module names = valid_module();
  names.value(names.find_value("y")).name = "has space";
  expect_invalid(names, {"value name 'has space' is not an MLIR suffix-id"});
}

TEST(Verifier, BrokenIdsGiveMessagesNotCrashes) {
  Module m = valid_module();
  m.node(1).inputs[0] = 999;
  m.node(0).outputs.push_back(-7);
  expect_invalid(m, {"input 0 is value id 999", "%<bad:-7>", "value id -7"});
}

TEST(Verifier, OpShapeErrorsAreReported) {
  Module m;
  const ValueId a = m.add_argument("a", {DType::kF32, {2, 3}}, Role::kInput);
  const ValueId b = m.add_argument("b", {DType::kF32, {4, 5}}, Role::kInput);
  const NodeId n = m.add_node_typed("add", {a, b}, {}, {TensorType{DType::kF32, {2, 3}}}, {"c"}, "/Add (Add)");
  m.set_outputs({m.node(n).outputs[0]});
  expect_invalid(m, {"memc.source = \"/Add (Add)\"", "do not broadcast"});
}

TEST(Verifier, ReportsEveryProblemAtOnce) {
  Module m = valid_module();
  m.node(0).op = "nope1";
  m.node(1).op = "nope2";
  expect_invalid(m, {"verify: 2 problems", "memc.nope1", "memc.nope2"});
}

}  // namespace
}  // namespace memc

namespace memc {
namespace {

// Transfers move their input into the other memory space; a copy_to_host whose result stays on
// the device, or whose input is already on the host, is named.
TEST(Verifier, TransfersCrossMemorySpaces) {
  Module m = valid_module();
  const ValueId y = m.outputs()[0];
  auto host = m.add_node("copy_to_host", {y});
  ASSERT_TRUE(host.ok());
  m.set_outputs({(*host)[0]});
  expect_invalid(m, {"memc.copy_to_host", "is not in host memory"});
  m.value((*host)[0]).space = MemSpace::kHost;
  EXPECT_TRUE(verify(m).ok()) << verify(m).message();
  auto twice = m.add_node("copy_to_host", {(*host)[0]});
  ASSERT_TRUE(twice.ok());
  m.value((*twice)[0]).space = MemSpace::kHost;
  m.set_outputs({(*twice)[0]});
  expect_invalid(m, {"is already in host memory"});
}

}  // namespace
}  // namespace memc
