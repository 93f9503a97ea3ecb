#include "planner/search.h"

#include <algorithm>
#include <chrono>
#include <limits>
#include <map>
#include <optional>

#include "support/log.h"
#include "support/size.h"

namespace memc {

std::string Candidate::label() const {
  std::string s(precision_name(precision));
  s += micro_batches > 1 ? str_cat(", ", micro_batches, " micro-batches") : std::string(", 1 micro-batch");
  s += ", remat " + describe_remat(remat);
  s += str_cat(", ", attention_kernel_name(attention), " attention");
  if (offload != OffloadLevel::kNone) s += str_cat(", offload ", offload_level_name(offload));
  if (loss_chunks != 1) s += loss_chunks == 0 ? std::string(", loss in chunks") : str_cat(", loss in ", loss_chunks, " chunks");
  if (devices > 1) s += str_cat(", ", shard_stage_name(shard), " over ", devices, " devices");
  return s;
}

namespace {

// Within a third of the budget (peak ≤ 4/3·budget, in integers as peak/4 ≤ budget/3): near
// enough that scheduling, or another remat limit, may still bring the plan under it.
bool within_a_third(int64_t peak, int64_t budget) { return peak / 4 <= budget / 3; }

// An attention kernel, offload level and loss chunking tried together.
struct Variant {
  AttentionKernel attention;
  OffloadLevel offload;
  int64_t loss_chunks = 1;
};

class Searcher {
 public:
  Searcher(ModelCompiler& compiler, const CompileOptions& base, int64_t budget) : compiler_(compiler), base_(base), budget_(budget) {}

  // Compiles (memoized) and records a candidate.
  Expected<Candidate> evaluate(PrecisionKind precision, int64_t k, const RematOptions& remat, const Variant& v) {
    Candidate c{precision, k, remat, v.attention, v.offload};
    c.loss_chunks = v.loss_chunks;
    c.shard = base_.shard.stage;
    c.devices = base_.shard.devices;
    const std::string key = c.label();
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    if (!streamable(c)) {  // never compiled nor explored: no peak and no time fit any budget
      c.peak_bytes = c.persistent_bytes = std::numeric_limits<int64_t>::max();
      c.step_ms = std::numeric_limits<double>::infinity();
      return c;
    }
    CompileOptions o = options_for(c);
    o.budget_bytes = 0;
    const auto start = std::chrono::steady_clock::now();
    MEMC_ASSIGN_OR_RETURN(Plan plan, compiler_.compile(o, /*quiet=*/true));
    ++compiles_;
    // Candidates skip the schedule pass (it never raises the peak). A near miss is compiled
    // again with it, so a plan that fits once scheduled is not refused.
    if (plan.memory.predicted_peak_bytes > budget_ && within_a_third(plan.memory.predicted_peak_bytes, budget_)) {
      CompileOptions scheduled = o;
      scheduled.budget_bytes = budget_;  // a prefetching order over it gives way to one without
      MEMC_ASSIGN_OR_RETURN(plan, compiler_.schedule(std::move(plan), scheduled));
      ++compiles_;
    }
    measure(c, plan);
    const double compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    log(2, str_cat("search: ", key, ": peak ", format_size(c.peak_bytes), ", ", c.step_ms, " ms (compiled in ", compile_ms, " ms)"));
    explored_.push_back(c);
    memo_.emplace(key, c);
    return c;
  }

  // Parameter streaming runs over several devices on zero3 only (TrainingStep refuses the rest).
  bool streamable(const Candidate& c) const { return c.offload != OffloadLevel::kParams || base_.shard.can_stream(); }

  CompileOptions options_for(const Candidate& c) const {
    CompileOptions o = base_;
    o.precision = c.precision;
    o.micro_batches = c.micro_batches;
    o.remat = c.remat;
    o.attention = c.attention;
    o.offload = c.offload;
    o.loss_chunks = c.loss_chunks;
    o.after_pass = nullptr;
    return o;
  }

  // The remat solver at the lowest limit the search tries, 1/16 of the activations. Per-block
  // checkpointing is not always the least memory: where a block's tape is large next to the
  // checkpoints, finer ones hold less (a DistilBERT token classifier, b8 × 64, bf16-mixed, 8
  // micro-batches, offload params: 386 KB per block, 374 KB under a 70.5 KB limit).
  Expected<Candidate> finest_remat(PrecisionKind p, int64_t k, const Variant& var, int64_t activation_bytes) {
    RematOptions r = base_.remat;
    r.policy = RematPolicy::kLimit;
    r.limit_bytes = std::max<int64_t>(activation_bytes / 16, 1);
    return evaluate(p, k, r, var);
  }

  // The fastest remat limit (the largest, least recompute) whose plan fits `budget`; nullopt if
  // none does. Per-block checkpointing (one extra forward) first; the limits below 1/16 of the
  // activations are not searched: there the binomial schedules recompute each block many times,
  // and more micro-batches are cheaper.
  Expected<std::optional<Candidate>> fit_remat(PrecisionKind p, int64_t k, const Variant& var, int64_t budget, int64_t activation_bytes) {
    RematOptions r = base_.remat;  // keeps the user's pins
    r.policy = RematPolicy::kBlocks;
    std::optional<Candidate> best;
    MEMC_ASSIGN_OR_RETURN(Candidate least, evaluate(p, k, r, var));
    if (least.peak_bytes > budget) {  // checkpoints finer than the blocks can hold less
      MEMC_ASSIGN_OR_RETURN(least, finest_remat(p, k, var, activation_bytes));
      // Scheduled peaks do not fall with the limit everywhere (streamed parameters reorder
      // around the recomputation), so a near miss here still searches the limits.
      if (!within_a_third(least.peak_bytes, budget)) return best;
    }
    if (least.peak_bytes <= budget) best = least;
    // Binary search for the largest limit that fits, between 1/16 of the activations and all
    // of them, to 1/64 of the activations.
    r.policy = RematPolicy::kLimit;
    int64_t lo = std::max<int64_t>(activation_bytes / 16, 1), hi = std::max<int64_t>(activation_bytes, 2);
    const int64_t resolution = std::max<int64_t>(hi / 64, 1);
    while (hi - lo > resolution) {
      const int64_t mid = lo + (hi - lo) / 2;
      r.limit_bytes = mid;
      MEMC_ASSIGN_OR_RETURN(Candidate c, evaluate(p, k, r, var));
      if (c.peak_bytes <= budget) {
        lo = mid;
        if (!best || c.step_ms < best->step_ms) best = c;
      } else {
        hi = mid;
      }
    }
    return best;
  }

  // The candidate's peak with the schedule pass (what the written plan would report).
  Expected<Candidate> scheduled(Candidate c) {
    MEMC_ASSIGN_OR_RETURN(Plan plan, compiler_.compile(options_for(c), /*quiet=*/true, /*schedule_quiet=*/true));
    measure(c, plan);
    return c;
  }

  const std::vector<Candidate>& explored() const { return explored_; }
  int compiles() const { return compiles_; }

 private:
  // The candidate's figures from its compiled plan; the largest category is the one at the
  // plan's own peak, so a scheduled plan names what dominates its peak, not the unscheduled one's.
  static void measure(Candidate& c, const Plan& plan) {
    c.peak_bytes = plan.memory.predicted_peak_bytes;
    c.persistent_bytes = plan.memory.persistent_bytes;
    c.step_ms = plan.estimated_step_ms;
    if (auto it = plan.memory.category_peak_bytes.find("activations"); it != plan.memory.category_peak_bytes.end()) {
      c.activation_bytes = it->second;
    }
    c.largest.clear();
    c.largest_bytes = 0;
    for (const auto& [name, bytes] : plan.memory.breakdown) {
      if (bytes > c.largest_bytes) c.largest = name, c.largest_bytes = bytes;
    }
  }

  ModelCompiler& compiler_;
  CompileOptions base_;
  int64_t budget_;
  std::map<std::string, Candidate> memo_;
  std::vector<Candidate> explored_;
  int compiles_ = 0;
};

// What the search ranges over; each axis pinned to the base options when the user gave it.
struct SearchAxes {
  std::vector<PrecisionKind> precisions;
  std::vector<int64_t> ks;        // micro-batch counts, increasing
  std::vector<Variant> variants;  // the last one saves the most memory
  RematOptions no_remat;          // the remat of plans "without remat" (the user's, when pinned)
  RematOptions least_remat;       // per-block checkpointing, with the user's pins
  bool remat_searched = false;    // remat is the search's to choose (else pinned)
};

Expected<SearchAxes> search_axes(ModelCompiler& compiler, const CompileOptions& base, const SearchSpace& space, const DeviceProfile& profile) {
  SearchAxes axes;
  axes.precisions = {base.precision};
  if (space.precision) {
    axes.precisions = {PrecisionKind::kFp32};
    if (profile.bf16) axes.precisions.push_back(PrecisionKind::kBf16Mixed);
    // fp16-mixed is bf16-mixed plus loss scaling at the same width and the same rate (one
    // low_flops per profile): never less memory or time, so it is searched only where bf16 is
    // not offered (ViT-L/16 at 2 GB: none of its 10 candidates planned below its bf16 twin, and
    // each was 6–17 % slower; bench/journal/2026.md §24).
    if (profile.fp16 && !profile.bf16) axes.precisions.push_back(PrecisionKind::kFp16Mixed);
  }
  axes.ks = {base.micro_batches};
  if (space.micro_batches) {
    // Micro-batches re-import the model at smaller batches: an export that fixes its batch
    // allows none, nor one whose BatchNorms normalize with the batch's statistics, and no count
    // exceeds the batch.
    MEMC_ASSIGN_OR_RETURN(const int64_t fixed_batch, compiler.fixed_batch(base));
    MEMC_ASSIGN_OR_RETURN(const bool batch_statistics, compiler.updates_buffers(base));
    const int64_t batch = base.rank_batch();  // each rank micro-batches its own slice
    const bool splits = fixed_batch < 0 && !batch_statistics;
    axes.ks = {1};
    for (int64_t k = 2; splits && k < batch; k *= 2) axes.ks.push_back(k);
    if (splits && batch > 1) axes.ks.push_back(batch);
  }
  // Attention kernel and offload level: tiled attention (it can need more memory, as on the
  // block-sparse BigBird export: bench/journal/2026.md §20); offload is tried after the plans
  // without it, the optimizer state first, then the parameters (they cross the host link twice
  // a step).
  const std::vector<OffloadLevel> levels = space.offload ? std::vector<OffloadLevel>{OffloadLevel::kNone, OffloadLevel::kOptimizer, OffloadLevel::kParams}
                                                         : std::vector<OffloadLevel>{base.offload};
  // A language model's head in chunks (passes/loss_chunks.h) costs a few sums of the head's
  // weight gradient: tried right after the plan without it, and kept under every offload level.
  const AttentionKernel attention = space.attention ? AttentionKernel::kTiled : base.attention;
  // auto (0): each micro-batch count chunks its own positions.
  int64_t chunks = base.loss_chunks;
  if (space.loss_chunks) {
    MEMC_ASSIGN_OR_RETURN(const int64_t whole_batch, compiler.auto_loss_chunks(base));
    if (whole_batch > 1) chunks = 0;
  }
  if (chunks != base.loss_chunks) axes.variants.push_back({attention, levels.front(), base.loss_chunks});
  for (OffloadLevel off : levels) axes.variants.push_back({attention, off, chunks});
  axes.no_remat = space.remat ? RematOptions{} : base.remat;
  axes.least_remat = base.remat;
  if (space.remat) axes.least_remat.policy = RematPolicy::kBlocks;
  axes.remat_searched = space.remat;
  return axes;
}

// The floor: the least-memory settings (per-block checkpointing or finer checkpoints, the last offload level) at
// every precision and micro-batch count — more micro-batches do not always save memory, their
// f32 gradient accumulators cost some — and everything compiled on the way, scheduled.
Expected<Candidate> compute_floor(Searcher& s, const SearchAxes& axes) {
  // The last variant offloads the most; where it cannot run (streaming on zero1/zero2), the
  // one before it (the optimizer state offloaded, or with the offload pinned, the same level
  // without loss chunks) is tried too.
  const size_t from = axes.variants.size() > 1 && axes.variants.back().offload == OffloadLevel::kParams ? axes.variants.size() - 2 : axes.variants.size() - 1;
  for (size_t v = from; v < axes.variants.size(); ++v) {
    const Variant& least = axes.variants[v];
    for (PrecisionKind p : axes.precisions) {
      int64_t previous = std::numeric_limits<int64_t>::max();
      size_t least_k = 0;
      for (size_t i = 0; i < axes.ks.size(); ++i) {
        MEMC_ASSIGN_OR_RETURN(Candidate c, s.evaluate(p, axes.ks[i], axes.least_remat, least));
        if (c.peak_bytes >= previous) break;  // more micro-batches stopped saving memory
        previous = c.peak_bytes, least_k = i;
      }
      // Finer checkpoints than the blocks (Searcher::finest_remat) at the count where
      // per-block checkpointing saved the most. One count only: compiles grow with the count
      // (ViT-L/16 b16 fp32: 16 micro-batches 51 s, against 0.2 s for one), and finer
      // checkpoints at more micro-batches saved a few percent where they were tried.
      if (axes.remat_searched) {
        MEMC_ASSIGN_OR_RETURN(const Candidate plain, s.evaluate(p, axes.ks[least_k], axes.no_remat, least));
        MEMC_RETURN_IF_ERROR(s.finest_remat(p, axes.ks[least_k], least, plain.activation_bytes).status());
      }
    }
  }
  // Candidates are compiled unscheduled, and scheduling lowers offload levels' peaks unequally
  // (streamed parameters most: ViT-L/16 b8 with offload params is 410 MB scheduled, more than
  // offload optimizer's 888 MB unscheduled): the least of each offload level is scheduled, and
  // the least scheduled peak is the floor, the figure the written plan would have.
  std::map<OffloadLevel, Candidate> least_per_level;
  for (const Candidate& c : s.explored()) {
    auto it = least_per_level.find(c.offload);
    if (it == least_per_level.end() || c.peak_bytes < it->second.peak_bytes) least_per_level[c.offload] = c;
  }
  std::optional<Candidate> floor;
  for (const auto& [level, c] : least_per_level) {
    MEMC_ASSIGN_OR_RETURN(Candidate scheduled, s.scheduled(c));
    if (!floor || scheduled.peak_bytes < floor->peak_bytes) floor = scheduled;
  }
  return *floor;
}

// The budget error below the floor: names the least peak and what dominates it.
Status floor_error(const Candidate& floor, const CompileOptions& base, const SearchSpace& space) {
  const bool pinned = !(space.precision || space.micro_batches || space.remat || space.attention || space.offload || space.loss_chunks);
  if (pinned) {
    return Status::Budget(str_cat("budget ", format_size(base.budget_bytes), " (", base.budget_bytes, " bytes) is below the peak of the pinned plan (",
                                  floor.label(), "): ", format_size(floor.peak_bytes), " (", floor.peak_bytes, " bytes); largest at the peak: ",
                                  floor.largest, " ", format_size(floor.largest_bytes), "; leave a decision unpinned to let memc search"));
  }
  return Status::Budget(str_cat("budget ", format_size(base.budget_bytes), " (", base.budget_bytes,
                                " bytes) is below the smallest peak memc can plan for this model, batch and optimizer: ", format_size(floor.peak_bytes),
                                " (", floor.peak_bytes, " bytes) with ", floor.label(), "; largest at that peak: ", floor.largest, " ",
                                format_size(floor.largest_bytes)));
}

// A quick check first: when even the least-memory setting without micro-batches misses the
// budget by more than a third at every precision, the floor is computed before the search, and
// a budget a third below it is refused at once. Nearer, the search still looks: the floor
// schedules only the least unscheduled plan of each offload level, and scheduling does not keep
// their order (a DistilBERT token classifier, b8 × 64: a floor of 352 KB, and a plan the search
// finds at 336 KB once scheduled, with streamed parameters and a larger remat limit).
Status refuse_hopeless_budget(Searcher& s, const SearchAxes& axes, const CompileOptions& base, const SearchSpace& space, int64_t budget) {
  if (base.budget_bytes <= 0 || !(space.remat || space.offload)) return Status::Ok();
  const Variant& least = axes.variants.back();
  bool hopeless = true;
  for (PrecisionKind p : axes.precisions) {  // each compiled: the floor and the Pareto front see them all
    MEMC_ASSIGN_OR_RETURN(Candidate c, s.evaluate(p, axes.ks.front(), axes.least_remat, least));
    if (within_a_third(c.peak_bytes, budget)) hopeless = false;
  }
  if (!hopeless) return Status::Ok();
  MEMC_ASSIGN_OR_RETURN(Candidate floor, compute_floor(s, axes));
  return within_a_third(floor.peak_bytes, budget) ? Status::Ok() : floor_error(floor, base, space);
}

// Branch and bound, fastest first: each (precision, variant) plan without micro-batching or
// remat bounds the time of everything that adds memory savings to it. Returns the fastest
// plan that fits, if any.
Expected<std::optional<Candidate>> fastest_fitting(Searcher& s, const SearchAxes& axes, const SearchSpace& space, int64_t budget) {
  struct Start {
    Candidate plain;  // no micro-batches, no remat: the fastest plan of this precision and variant
    size_t variant;
  };
  std::vector<Start> order;
  for (PrecisionKind p : axes.precisions) {
    for (size_t v = 0; v < axes.variants.size(); ++v) {
      MEMC_ASSIGN_OR_RETURN(Candidate c, s.evaluate(p, axes.ks.front(), axes.no_remat, axes.variants[v]));
      order.push_back({c, v});
    }
  }
  std::stable_sort(order.begin(), order.end(), [](const Start& x, const Start& y) { return x.plain.step_ms < y.plain.step_ms; });
  // The fastest of these that fits bounds everything from the start: the loop below would take
  // it whenever it reached its start, so only plans slower than it are left uncompiled.
  std::optional<Candidate> best;
  for (const Start& start : order) {
    if (start.plain.peak_bytes <= budget && (!best || start.plain.step_ms < best->step_ms)) best = start.plain;
  }
  for (const Start& start : order) {
    if (best && start.plain.step_ms >= best->step_ms) break;
    if (start.plain.persistent_bytes > budget) continue;  // every plan of it holds at least these
    const PrecisionKind p = start.plain.precision;
    const Variant& var = axes.variants[start.variant];
    for (int64_t k : axes.ks) {
      MEMC_ASSIGN_OR_RETURN(Candidate c, s.evaluate(p, k, axes.no_remat, var));
      if (best && c.step_ms >= best->step_ms) break;  // larger k is slower still
      if (c.peak_bytes <= budget) {
        best = c;
        break;
      }
      if (!space.remat) continue;
      MEMC_ASSIGN_OR_RETURN(auto fitted, s.fit_remat(p, k, var, budget, c.activation_bytes));
      if (fitted && (!best || fitted->step_ms < best->step_ms)) best = fitted;
      // More micro-batches shrink activations only: once the least-remat plan's other bytes
      // (its peak less the activations' own peak; with k > 1 they include the gradient
      // accumulators) exceed the budget, no larger count fits (ViT-L/16 at 1 GB skipped 5 s
      // of 8- and 16-micro-batch compiles this way).
      if (!fitted && k > 1) {
        MEMC_ASSIGN_OR_RETURN(const Candidate least, s.evaluate(p, k, axes.least_remat, var));
        if (least.peak_bytes - least.activation_bytes > budget) break;
      }
    }
  }
  return best;
}

// The ladder: from the unconstrained plan, each technique added in turn (the articles' order).
Expected<std::vector<Candidate>> technique_ladder(Searcher& s, const SearchAxes& axes, const CompileOptions& base, const SearchSpace& space,
                                                  const DeviceProfile& profile, const Candidate& best) {
  std::vector<Candidate> ladder;
  PrecisionKind p = axes.precisions.front();
  int64_t k = axes.ks.front();
  RematOptions r = axes.no_remat;
  Variant var = axes.variants.front();
  MEMC_ASSIGN_OR_RETURN(Candidate c, s.evaluate(p, k, r, var));
  ladder.push_back(c);
  if (space.precision && axes.precisions.size() > 1) {
    p = profile.bf16 ? PrecisionKind::kBf16Mixed : axes.precisions[1];
    MEMC_ASSIGN_OR_RETURN(c, s.evaluate(p, k, r, var));
    ladder.push_back(c);
  }
  if (axes.variants.back().loss_chunks != var.loss_chunks) {  // a language model's head in chunks
    var.loss_chunks = axes.variants.back().loss_chunks;
    MEMC_ASSIGN_OR_RETURN(c, s.evaluate(p, k, r, var));
    ladder.push_back(c);
  }
  if (space.micro_batches && axes.ks.size() > 1 && base.rank_batch() >= 4) {
    k = std::min<int64_t>(std::max<int64_t>(4, best.micro_batches), axes.ks.back());
    MEMC_ASSIGN_OR_RETURN(c, s.evaluate(p, k, r, var));
    ladder.push_back(c);
  }
  if (space.remat) {
    r = RematOptions{.policy = RematPolicy::kBlocks};
    MEMC_ASSIGN_OR_RETURN(c, s.evaluate(p, k, r, var));
    ladder.push_back(c);
  }
  if (space.offload) {
    var.offload = OffloadLevel::kOptimizer;
    MEMC_ASSIGN_OR_RETURN(c, s.evaluate(p, k, r, var));
    ladder.push_back(c);
    var.offload = OffloadLevel::kParams;
    MEMC_ASSIGN_OR_RETURN(c, s.evaluate(p, k, r, var));
    if (c.step_ms < std::numeric_limits<double>::infinity()) ladder.push_back(c);
  }
  return ladder;
}

// The (peak, time) front: no other candidate has both a lower peak and a lower time.
std::vector<Candidate> pareto_front(std::vector<Candidate> all) {
  std::sort(all.begin(), all.end(), [](const Candidate& x, const Candidate& y) {
    return x.peak_bytes != y.peak_bytes ? x.peak_bytes < y.peak_bytes : x.step_ms < y.step_ms;
  });
  std::vector<Candidate> front;
  double fastest = std::numeric_limits<double>::infinity();
  for (const Candidate& c : all) {
    if (c.step_ms < fastest) front.push_back(c), fastest = c.step_ms;
  }
  return front;
}

}  // namespace

Expected<SearchResult> search_plan(ModelCompiler& compiler, const CompileOptions& base, const SearchSpace& space) {
  MEMC_ASSIGN_OR_RETURN(DeviceProfile profile, target_profile(base));
  const int64_t budget = base.budget_bytes > 0 ? base.budget_bytes : std::numeric_limits<int64_t>::max();
  Searcher s(compiler, base, budget);
  MEMC_ASSIGN_OR_RETURN(const SearchAxes axes, search_axes(compiler, base, space, profile));
  MEMC_RETURN_IF_ERROR(refuse_hopeless_budget(s, axes, base, space, budget));
  MEMC_ASSIGN_OR_RETURN(std::optional<Candidate> best, fastest_fitting(s, axes, space, budget));
  if (!best) {
    MEMC_ASSIGN_OR_RETURN(Candidate floor, compute_floor(s, axes));
    if (floor.peak_bytes > budget) return floor_error(floor, base, space);
    best = floor;  // only the scheduled least-memory plan fits
  }
  SearchResult result;
  result.best = *best;
  result.chosen = s.options_for(*best);
  result.chosen.budget_bytes = base.budget_bytes;
  result.chosen.keep_lower = false;  // the search compared the peaks: its choice is written as chosen
  result.chosen.after_pass = base.after_pass;
  if (space.ladder) {
    MEMC_ASSIGN_OR_RETURN(result.ladder, technique_ladder(s, axes, base, space, profile, *best));
  }
  result.pareto = pareto_front(s.explored());
  result.explored = s.explored();
  result.compiles = s.compiles();
  return result;
}

}  // namespace memc
