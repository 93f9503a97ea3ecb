// Text form of a Module in MLIR generic op syntax; print → parse → print is identical.
//   func.func @main(%x: tensor<4x1x8x8xf32> {memc.role = "input", memc.name = "x"}, ...) -> (tensor<4x10xf32>) attributes {memc.opset = 17 : i64} {
//     %0 = "memc.matmul"(%a, %b) {transpose_b = 1 : i64} : (tensor<..>, tensor<..>) -> tensor<..>
//     %y, %mask = "memc.dropout"(%x) {ratio = 1.0e-01 : f64} : (tensor<..>) -> (tensor<..>, tensor<..xi1>)
//     "func.return"(%0) : (tensor<4x10xf32>) -> ()
//   }
// Conventions (all accepted by `mlir-opt --allow-unregistered-dialect`, MLIR ≥ 16):
// - Arguments: {memc.role, memc.name = Value::source_name, memc.space = "host" only when host}.
// - Module metadata key k prints as func attribute memc.k.
// - Node fields without an MLIR equivalent are reserved attributes, printed after the node's own
//   (sorted) attributes, only when non-default, and stripped back by the parser:
//     memc.absent = array<i64: slot...>   absent optional inputs (kNoValue), by input slot
//     memc.result_roles = ["grad", ...]   when any result's role is not the default
//                                         (constant for memc.constant, activation otherwise)
//     memc.result_spaces = ["host", ...]  when any result lives on the host
//     memc.source = "..."                 Node::source
// - Attribute values: int `3 : i64`; float `1.0e-05 : f64` (shortest exact digits, always with
//   '.'; inf/nan as `0x7FF0000000000000 : f64`); string "..." (\" \\ \n \t, other bytes \XX);
//   ints `array<i64: 1, 2>`; floats `array<f64: 0.5>`; strings `["a", "b"]`;
//   tensor `dense<"0xHEX"> : tensor<2x3xf32>` (raw little-endian bytes; i1 bit-packed as MLIR
//   stores it: element i is bit i%8 of byte i/8).
// - Node results are named `%a, %b = ...`; dead nodes and weights are not printed.
#pragma once
#include <string>
#include <string_view>

#include "ir/graph.h"

namespace memc {

std::string print_module(const Module& module);
// One node as a single line (for messages and -vv logs). Safe on malformed nodes (ids out of
// range print as %<bad:N>), so the verifier can use it.
std::string print_node(const Module& module, const Node& node);
// Parses the printer's output; errors give line and column.
Expected<Module> parse_module(std::string_view text);

// Building blocks shared by printer and parser (and handy in messages).
std::string print_attr(const Attr& attr);      // `3 : i64`, `array<i64: 1>`, ...
std::string quote_string(std::string_view s);  // MLIR string literal with escapes

// Types the parser accepts (the verifier enforces them, so every verified module round-trips):
// rank ≤ 64, dims in [0, 2^40], at most 2^48 elements — far from int64 overflow in byte counts.
inline constexpr size_t kMaxTextRank = 64;
inline constexpr int64_t kMaxTextDim = int64_t{1} << 40;
inline constexpr int64_t kMaxTextElements = int64_t{1} << 48;
bool type_fits_text(const TensorType& type);

// Reserved attribute names of the text form.
inline constexpr std::string_view kAbsentAttr = "memc.absent";
inline constexpr std::string_view kResultRolesAttr = "memc.result_roles";
inline constexpr std::string_view kResultSpacesAttr = "memc.result_spaces";
inline constexpr std::string_view kSourceAttr = "memc.source";

}  // namespace memc
