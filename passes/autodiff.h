// Reverse-mode autodiff over the core ops.
//
// Contract: given a Module whose forward nodes produce a scalar `loss`, appends the nodes that
// compute d loss / d v for every v in `wrt` (params, or any value), using each op's gradient
// rule from the registry. Only nodes on a path from `wrt` to `loss` are differentiated, and a
// rule is asked only for the input gradients somebody needs. Gradients reaching a value from
// several uses are summed. A `wrt` value that does not reach the loss gets an explicit zero.
// Preconditions: the module verifies; shapes are static. Run before any memory pass.
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

  // Returns the gradient value of each entry of `wrt`, in order.
  Expected<std::vector<ValueId>> run(Module& module, ValueId loss, const std::vector<ValueId>& wrt);

 private:
  Options options_;
};

}  // namespace memc
