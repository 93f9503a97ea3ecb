// The budget search (`memc compile --budget`): among the combinations of precision (fp32 and
// the mixed modes the target offers, fp16-mixed only where bf16 is not; -true modes only when
// the user pins them), micro-batch
// count, rematerialization limit and attention kernel, the plan with the least estimated step
// time (planner/cost_model.h) whose planned peak fits the budget. The optimizer is never
// changed. Decisions the user pinned stay as given.
//
// Branch and bound: for each precision, micro-batch counts are tried in increasing order (more
// micro-batches never make a step faster in the model); the plan without remat is a lower bound
// on the time of every remat plan at that count, so the remat limit is searched (binary, in
// bytes held from forward to backward, for the largest limit that fits) only while that bound
// beats the best plan found. The first bound is the fastest plan without micro-batches or remat
// that fits, so slow many-micro-batch plans are not compiled when it already beats them; a
// precision and offload level whose persistent bytes alone exceed the budget is skipped whole.
// Deterministic: the same model and options give the same plan.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "planner/compile.h"

namespace memc {

struct SearchSpace {  // true: the search chooses; false: pinned to the base options
  bool precision = true;
  bool micro_batches = true;
  bool remat = true;
  bool attention = true;
  bool offload = true;
  bool loss_chunks = true;  // a language model's head in chunks (passes/loss_chunks.h), where auto finds some
  // Also compile the technique ladder (--explain, --json show it); it never changes the choice.
  bool ladder = true;
};

struct Candidate {
  PrecisionKind precision = PrecisionKind::kFp32;
  int64_t micro_batches = 1;
  RematOptions remat;
  AttentionKernel attention = AttentionKernel::kTiled;
  OffloadLevel offload = OffloadLevel::kNone;
  int64_t loss_chunks = 1;  // passes/loss_chunks.h
  int64_t peak_bytes = 0;
  double step_ms = 0;
  std::string largest;  // the largest category at the peak
  int64_t largest_bytes = 0;
  int64_t activation_bytes = 0;  // the activations' own peak over the step
  int64_t persistent_bytes = 0;  // live across steps (weights, optimizer state): the same at every micro-batch count and remat
  ShardStage shard = ShardStage::kNone;  // the search's (one stage per search: tools' search over stages runs one each)
  int64_t devices = 1;
  // "bf16-mixed, 4 micro-batches, remat 2 GB, tiled attention[, offload optimizer][, zero3 over 4 devices]"
  std::string label() const;
};

// One shard stage's answer in a search over stages (--devices N, a budget, no --shard): its
// fastest fitting plan, or why none fits.
struct ShardRung {
  ShardStage stage = ShardStage::kNone;
  std::optional<Candidate> best;
  std::string why;  // when no plan of the stage fits
};

struct SearchResult {
  CompileOptions chosen;
  Candidate best;
  std::vector<Candidate> explored;  // every candidate compiled, in order
  std::vector<Candidate> ladder;    // the articles' order: each technique added in turn
  std::vector<Candidate> pareto;    // (peak, time) front of the explored candidates
  std::vector<ShardRung> shard_rungs;  // a search over shard stages: each stage's answer
  int compiles = 0;
};

// budget 0: the fastest plan. A budget below every candidate: a budget error naming the
// smallest peak memc can reach and what dominates it.
Expected<SearchResult> search_plan(ModelCompiler& compiler, const CompileOptions& base, const SearchSpace& space);

}  // namespace memc
