// Reverse-mode autodiff over the core ops.
//
// Contract: given a Module whose forward nodes produce a scalar `loss`, appends the nodes that
// compute d loss / d v for every v in `wrt` (params, or any value), using each op's gradient
// rule from the registry. Only nodes on a path from `wrt` to `loss` are differentiated, and a
// rule is asked only for the input gradients somebody needs. Gradients reaching a value from
// several uses are summed. A `wrt` value that does not reach the loss gets an explicit zero.
// Preconditions: the module verifies; shapes are static. Run before any memory pass.
//
// The general form starts from given cotangents instead of a scalar loss: seeds (v, dv) say
// that d loss / d v = dv for a loss whose dependence on the rest of the graph passes through
// the seeded values only (passes/loss_chunks.h: a language model's head differentiated chunk by
// chunk in the forward seeds its input and weights). Only nodes on a path from `wrt` to a seed
// are differentiated.
#pragma once
#include <string>
#include <vector>

#include "ir/graph.h"

namespace memc {

class Autodiff {
 public:
  struct Options {
    bool mark_roles = true;  // give gradients of params Role::kGrad
  };
  explicit Autodiff(Options options) : options_(options) {}
  Autodiff() : Autodiff(Options{}) {}
  std::string name() const { return "autodiff"; }

  struct Seed {
    ValueId value = kNoValue;
    ValueId grad = kNoValue;  // of value's type
  };

  // (loss, 1): what run(module, loss, wrt) starts from.
  static Seed unit_seed(Module& module, ValueId loss);

  // Returns the gradient value of each entry of `wrt`, in order.
  Expected<std::vector<ValueId>> run(Module& module, ValueId loss, const std::vector<ValueId>& wrt);
  Expected<std::vector<ValueId>> run(Module& module, const std::vector<Seed>& seeds, const std::vector<ValueId>& wrt);

 private:
  Options options_;
};

}  // namespace memc
