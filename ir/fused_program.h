// fused_elementwise's program: a chain of elementwise ops evaluated per output element, as one
// kernel (passes/fuse_elementwise.h builds it; backends/cpu/fused.cc and the CUDA body run it).
//
// Slots: the node's inputs are slots 0..I-1; step s writes slot I+s. Each step names a
// registered elementwise op, its operand slots and its attributes ("key=value;key=value"); its type
// is what that op's shape function gives for its operands' types, so a step computes exactly
// what the op's own node computes, and rounds to its dtype as that node's store does. The node's
// outputs are the slots listed in `results`, each of the node's full shape, to which every
// input broadcasts.
//
// A dropout step draws element i's counter as the dropout node did for its own element i: the
// fused node's elements are the dropout's (every step has the node's shape or broadcasts to it,
// and a dropout step's operand is never broadcast; passes/fuse_elementwise.cc).
//
// Attributes: ops [S] names, args [3·S] operand slots (-1: unused), step_attrs [S] ("" or
// "key=value;..."), results [R] slots.
#pragma once
#include <string>
#include <vector>

#include "ir/attr.h"
#include "ir/graph.h"
#include "support/status.h"

namespace memc {

struct FusedStep {
  std::string op;
  std::vector<int> args;  // operand slots
  Attrs attrs;            // the op's attributes
  std::string attr_text;  // as stored: "" or "key=value;key=value"
};

struct FusedProgram {
  int inputs = 0;
  std::vector<FusedStep> steps;
  std::vector<int> results;
  std::vector<TensorType> types;  // every slot's (read_typed_fused_program; empty otherwise)
  int slots() const { return inputs + static_cast<int>(steps.size()); }
};

// The most inputs, steps and results one fused node holds (the CUDA body's fixed arrays).
constexpr int kFusedMaxInputs = 8;
constexpr int kFusedMaxSteps = 24;
constexpr int kFusedMaxResults = 2;
constexpr int kFusedMaxDropouts = 4;

// Whether a node of `op` may be a step: elementwise ops over float and bool values whose kernels
// both backends evaluate per element in f32 (the fused kernels in backends/cpu/elementwise.cc
// and backends/cuda/ops.h take the same ops).
bool is_fusable_op(const std::string& op);
// The attributes a fused step of `op` carries: gelu's and gelu_grad's approximate, leaky_relu's
// alpha, cast's to, dropout's ratio, seed, rng_offset and rng_row_stride.
const std::vector<std::string>& fusable_attr_keys(const std::string& op);
// A node's attributes of those keys as a step stores them ("key=value;...", "" if none).
std::string fused_step_attr_text(const std::string& op, const Attrs& attrs);

// Whether a step of `op` may read i1 operands: cast, where, not, the comparisons and the logical
// ops. The others compute on f32, bf16 or f16 only (the unfused kernels' arithmetic on i1 differs
// from the fused body's f32 arithmetic on 0 and 1).
bool fused_step_reads_i1(const std::string& op);

// Reads and checks the program from a node's attributes (`inputs`: the node's input count).
Expected<FusedProgram> read_fused_program(const Attrs& attrs, int inputs);
// Writes it back into attributes.
void write_fused_program(const FusedProgram& program, Attrs& attrs);
// The program of a node whose inputs have these types, with every slot's type in `types`: each
// step through its op's shape function. Fails naming the step when an op rejects its operands, a
// step is not elementwise over the output's shape, or an input does not broadcast to it.
Expected<FusedProgram> read_typed_fused_program(const Attrs& attrs, const std::vector<TensorType>& inputs);
// The dtypes a fused node's slots may have: f32, bf16, f16 and i1.
bool fusable_dtype(DType t);

// "add(%0, %1) → gelu(%2)": the program as one line, for messages and -v reports.
std::string fused_program_text(const FusedProgram& program);

}  // namespace memc
