// One op, one registry entry: shape function, cost counts, flags (and later, the gradient
// rule). Kernels live in backends/<name>/ and register against the same op names.
#pragma once
#include <deque>
#include <functional>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/graph.h"

namespace memc {

enum OpFlags : uint32_t {
  kOpNone = 0,
  kOpElementwise = 1u << 0,  // out[i] depends on in[i] only (after broadcasting)
  kOpView = 1u << 1,         // a pure relabelling of the input's bytes (reshape; a transfer's _done)
  kOpRandom = 1u << 2,       // uses the counter-based RNG (dropout)
  kOpComputeHeavy = 1u << 3, // matmul, conv, attention: never worth recomputing first
  kOpInplaceOk = 1u << 4,    // output may share its first input's buffer
  kOpReduction = 1u << 5,
  kOpNoGradient = 1u << 6,   // explicitly has no gradient (comparisons, argmax, casts to int)
  kOpOptimizerUpdate = 1u << 7,  // an optimizer step over one parameter (runs on the host when its state is there)
  kOpTransfer = 1u << 8,     // moves bytes between memory spaces (copy_to_host, copy_to_device)
  kOpCollective = 1u << 9,   // communicates across ranks (ir/ops/collective.cc); async pairs end in _start/_done
  kOpPartialRead = 1u << 10, // reads only the elements it writes from its first input (slice, gather)
};

struct ShapeContext {
  const Node& node;
  std::span<const TensorType> inputs;  // absent optional inputs are not passed here
  const std::vector<bool>& present;    // per declared input slot
};

// Fills `out` with the output types or returns a bad-input Status naming the problem.
using ShapeFn = std::function<Status(const ShapeContext&, std::vector<TensorType>& out)>;
// Floating-point operations for one execution of the node.
using FlopsFn = std::function<int64_t(const Node&, std::span<const TensorType> in,
                                      std::span<const TensorType> out)>;

class GradBuilder;  // ir/grad.h
// Emits the nodes computing the gradients of a node's inputs from its outputs' gradients.
using GradFn = std::function<Status(GradBuilder&)>;

struct OpDef {
  std::string name;
  int min_inputs = 0;
  int max_inputs = 0;   // -1: variadic
  int num_outputs = 1;  // -1: decided by the shape function (split)
  uint32_t flags = kOpNone;
  ShapeFn shape;
  FlopsFn flops;  // defaults to one per output element
  std::string doc;  // one line: what the op computes and its attributes
  GradFn grad;      // empty: no rule yet (autodiff fails naming the op) unless kOpNoGradient
};

class OpRegistry {
 public:
  static OpRegistry& get();
  void add(OpDef def);
  // By name, in constant time; entries never move (nodes hold pointers to them).
  const OpDef* find(const std::string& name) const;
  OpDef* find_mutable(const std::string& name);
  std::vector<std::string> names() const;

 private:
  std::deque<OpDef> defs_;  // a deque: adding an op never moves the others
  std::unordered_map<std::string, OpDef*> by_name_;
};

// Runs the shape function of `node` given its input types.
Status infer_types(const Node& node, const std::vector<TensorType>& input_types,
                   const std::vector<bool>& present, std::vector<TensorType>& out);
int64_t node_flops(const Module& m, const Node& node);
// Bytes a node reads plus writes (inputs + outputs; a kOpPartialRead op's first input counts as
// its output's size).
int64_t node_bytes(const Module& m, const Node& node);
// Bytes one rank sends for a collective under ring algorithms (all_gather and reduce_scatter
// (R−1)/R of the full buffer, all_reduce twice that, broadcast the buffer; _done counts 0);
// 0 for any other op.
int64_t collective_wire_bytes(const Module& m, const Node& node);

// Registers every op family once (idempotent); called by OpRegistry::get().
void register_all_ops(OpRegistry& registry);

}  // namespace memc
