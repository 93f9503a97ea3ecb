// The optimizers a training step can use, one registry entry each: how its update node is
// built for one parameter (or one rank's block of a flat unit), which optimizer states it
// keeps, and the facts the CLI, the shard pass and the plan reader need. Adding an optimizer
// is one entry (and its builder) in passes/optimizers.cc, plus its kernel and a test.
//
// Every update node reads (weight, gradient, states..., lr, step[, skip]) and returns the
// weight's and each state's next value, in `updated` order; TrainingStep writes them back in
// place (Module::add_update). States are Role::kOptimizerState arguments named
// "<state>.<target>", zero at the first step.
#pragma once
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace memc {

struct OptimizerOptions;

// What a builder is given: one target, the step's scalars, and a way to declare states.
struct UpdateContext {
  Module& module;
  const OptimizerOptions& options;
  ValueId weight = kNoValue, grad = kNoValue;
  std::string target;                       // the states' suffix: a parameter's or a unit's name
  ValueId lr = kNoValue, step = kNoValue;   // runtime scalars
  ValueId skip = kNoValue;                  // loss scaling's found_inf, or kNoValue
  // A new optimizer-state argument "<prefix>.<target>".
  ValueId state(const std::string& prefix, TensorType type) const;
  TensorType weight_type() const { return module.value(weight).type; }
};

// What a builder returns: the update op, its inputs and attributes, and the values its
// outputs replace (updated[0] is the weight).
struct UpdateNode {
  std::string op;
  std::vector<ValueId> inputs;
  Attrs attrs;
  std::vector<ValueId> updated;
  int outputs = -1;  // -1: the op's shape function decides
};

struct OptimizerDef {
  std::string_view name;          // --optimizer NAME; the plan's optimizer.kind
  std::string_view help;          // its line in --optimizer's help
  double default_weight_decay;    // when --weight-decay is not given
  // Its states on a flat buffer of units (sharded, streamed; passes/shard.h): each parameter and
  // each rank's share aligned to this many elements (1: elementwise states; adam8bit: its
  // quantization block), or 0: a state spans a parameter's rows and columns, no flat units (on
  // zero1/zero2 its states stay whole and replicated; zero3 and streaming refuse it).
  int64_t flat_align;
  UpdateNode (*build)(const UpdateContext& context);
};

// In the order the CLI lists them.
const std::vector<OptimizerDef>& optimizers();
const OptimizerDef* find_optimizer(std::string_view name);
// "sgd, momentum, adam" (flat_only: those whose states work on flat units), for messages.
std::string optimizer_names(bool flat_only = false, std::string_view last_separator = ", ");

}  // namespace memc
