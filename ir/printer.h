// Text form of a Module in MLIR generic op syntax; print → parse → print is identical.
//   func.func @main(%x: tensor<4x1x8x8xf32> {memc.role = "input", memc.name = "x"}, ...) -> (tensor<4x10xf32>) {
//     %0 = "memc.matmul"(%a, %b) {transpose_b = 1 : i64} : (tensor<..>, tensor<..>) -> tensor<..>
//     "func.return"(%0) : (tensor<4x10xf32>) -> ()
//   }
#pragma once
#include <string>
#include <string_view>

#include "ir/graph.h"

namespace memc {

std::string print_module(const Module& module);
// One node as a single line (for messages and -vv logs).
std::string print_node(const Module& module, const Node& node);
// Parses the printer's output; errors give line and column.
Expected<Module> parse_module(std::string_view text);

}  // namespace memc
