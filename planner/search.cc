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
  std::string s = precision;
  s += micro_batches > 1 ? str_cat(", ", micro_batches, " micro-batches") : std::string(", 1 micro-batch");
  s += ", remat " + describe_remat(remat);
  s += ", " + attention + " attention";
  if (offload != "none") s += ", offload " + offload;
  return s;
}

namespace {

class Searcher {
 public:
  Searcher(ModelCompiler& compiler, const CompileOptions& base, int64_t budget) : compiler_(compiler), base_(base), budget_(budget) {}

  // Compiles (memoized) and records a candidate.
  Expected<Candidate> evaluate(const std::string& precision, int64_t k, const RematOptions& remat, const std::string& attention,
                               const std::string& offload) {
    Candidate c{precision, k, remat, attention, offload};
    const std::string key = c.label();
    if (auto it = memo_.find(key); it != memo_.end()) return it->second;
    CompileOptions o = options_for(c);
    o.budget_bytes = 0;
    const auto start = std::chrono::steady_clock::now();
    MEMC_ASSIGN_OR_RETURN(Plan plan, compiler_.compile(o, /*quiet=*/true));
    ++compiles_;
    // Candidates skip the schedule pass (it never raises the peak). A near miss is compiled
    // again with it, so a plan that fits once scheduled is not refused.
    if (plan.memory.predicted_peak_bytes > budget_ && plan.memory.predicted_peak_bytes / 4 <= budget_ / 3) {
      MEMC_ASSIGN_OR_RETURN(plan, compiler_.schedule(std::move(plan), o));
      ++compiles_;
    }
    c.peak_bytes = plan.memory.predicted_peak_bytes;
    c.persistent_bytes = plan.memory.persistent_bytes;
    c.step_ms = plan.estimated_step_ms;
    if (auto it = plan.memory.category_peak_bytes.find("activations"); it != plan.memory.category_peak_bytes.end()) {
      c.activation_bytes = it->second;
    }
    for (const auto& [name, bytes] : plan.memory.breakdown) {
      if (bytes > c.largest_bytes) c.largest = name, c.largest_bytes = bytes;
    }
    const double compile_ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start).count();
    log(2, str_cat("search: ", key, ": peak ", format_size(c.peak_bytes), ", ", c.step_ms, " ms (compiled in ", compile_ms, " ms)"));
    explored_.push_back(c);
    memo_.emplace(key, c);
    return c;
  }

  CompileOptions options_for(const Candidate& c) const {
    CompileOptions o = base_;
    o.precision = c.precision;
    o.micro_batches = c.micro_batches;
    o.remat = c.remat;
    o.attention = c.attention;
    o.offload = c.offload;
    o.after_pass = nullptr;
    return o;
  }

  // The largest remat limit (least recompute) whose plan fits `budget`; nullopt if none does.
  // The search goes no lower than per-block checkpointing (one extra forward): below it the
  // binomial schedules recompute each block many times, and more micro-batches are cheaper.
  Expected<std::optional<Candidate>> fit_remat(const std::string& p, int64_t k, const std::string& a, const std::string& off,
                                               int64_t budget, int64_t activation_bytes) {
    RematOptions r = base_.remat;  // keeps the user's pins
    r.policy = "blocks";
    MEMC_ASSIGN_OR_RETURN(Candidate least, evaluate(p, k, r, a, off));
    if (least.peak_bytes > budget) return std::optional<Candidate>();
    // Binary search for the largest limit that fits, between 1/16 of the activations and all
    // of them, to 1/64 of the activations.
    r.policy = "limit";
    std::optional<Candidate> best = least;
    int64_t lo = std::max<int64_t>(activation_bytes / 16, 1), hi = std::max<int64_t>(activation_bytes, 2);
    const int64_t resolution = std::max<int64_t>(hi / 64, 1);
    while (hi - lo > resolution) {
      const int64_t mid = lo + (hi - lo) / 2;
      r.limit_bytes = mid;
      MEMC_ASSIGN_OR_RETURN(Candidate c, evaluate(p, k, r, a, off));
      if (c.peak_bytes <= budget) {
        lo = mid;
        if (c.step_ms < best->step_ms) best = c;
      } else {
        hi = mid;
      }
    }
    return best;
  }

  // The candidate's peak with the schedule pass (what the written plan would report).
  Expected<Candidate> scheduled(Candidate c) {
    MEMC_ASSIGN_OR_RETURN(Plan plan, compiler_.compile(options_for(c), /*quiet=*/true, /*schedule_quiet=*/true));
    c.peak_bytes = plan.memory.predicted_peak_bytes;
    return c;
  }

  const std::vector<Candidate>& explored() const { return explored_; }
  int compiles() const { return compiles_; }

 private:
  ModelCompiler& compiler_;
  CompileOptions base_;
  int64_t budget_;
  std::map<std::string, Candidate> memo_;
  std::vector<Candidate> explored_;
  int compiles_ = 0;
};

}  // namespace

Expected<SearchResult> search_plan(ModelCompiler& compiler, const CompileOptions& base, const SearchSpace& space) {
  MEMC_ASSIGN_OR_RETURN(DeviceProfile profile, device_profile(base.target));
  const int64_t budget = base.budget_bytes > 0 ? base.budget_bytes : std::numeric_limits<int64_t>::max();
  Searcher s(compiler, base, budget);

  std::vector<std::string> precisions = {base.precision};
  if (space.precision) {
    precisions = {"fp32"};
    if (profile.bf16) precisions.push_back("bf16-mixed");
    if (profile.fp16) precisions.push_back("fp16-mixed");
  }
  std::vector<int64_t> ks = {base.micro_batches};
  if (space.micro_batches) {
    // Micro-batches re-import the model at smaller batches: an export that fixes its batch
    // allows none, and no count exceeds the batch.
    MEMC_ASSIGN_OR_RETURN(const int64_t fixed_batch, compiler.fixed_batch(base));
    ks = {1};
    for (int64_t k = 2; fixed_batch < 0 && k < base.batch; k *= 2) ks.push_back(k);
    if (fixed_batch < 0 && base.batch > 1) ks.push_back(base.batch);
  }
  // Attention kernel and offload level: tiled attention (it can need more memory, as on the
  // block-sparse BigBird export: bench/RESULTS.md §20); offload is tried after the plans
  // without it.
  struct Variant {
    std::string attention, offload;
  };
  std::vector<Variant> variants;
  for (const std::string& off : space.offload ? std::vector<std::string>{"none", "optimizer"} : std::vector<std::string>{base.offload}) {
    variants.push_back({space.attention ? "tiled" : base.attention, off});
  }
  const RematOptions no_remat = space.remat ? RematOptions{} : base.remat;

  // The floor: the least-memory settings (per-block checkpointing, the last offload level) at
  // every precision and micro-batch count — more micro-batches do not always save memory, their
  // f32 gradient accumulators cost some — and everything compiled on the way, scheduled.
  auto compute_floor = [&]() -> Expected<Candidate> {
    for (const std::string& p : precisions) {
      int64_t previous = std::numeric_limits<int64_t>::max();
      for (int64_t k : ks) {
        RematOptions least = base.remat;
        if (space.remat) least.policy = "blocks";
        MEMC_ASSIGN_OR_RETURN(Candidate c, s.evaluate(p, k, least, variants.back().attention, variants.back().offload));
        if (c.peak_bytes >= previous) break;  // more micro-batches stopped saving memory
        previous = c.peak_bytes;
      }
    }
    std::optional<Candidate> floor;
    for (const Candidate& c : s.explored()) {
      if (!floor || c.peak_bytes < floor->peak_bytes) floor = c;
    }
    return s.scheduled(*floor);  // the figure the written plan would have
  };
  auto floor_error = [&](const Candidate& floor) -> Status {
    const bool pinned = !(space.precision || space.micro_batches || space.remat || space.attention || space.offload);
    if (pinned) {
      return Status::Budget(str_cat("budget ", format_size(base.budget_bytes), " (", base.budget_bytes, " bytes) is below the peak of the pinned plan (",
                                    floor.label(), "): ", format_size(floor.peak_bytes), " (", floor.peak_bytes, " bytes); largest at the peak: ",
                                    floor.largest, " ", format_size(floor.largest_bytes), "; leave a decision unpinned to let memc search"));
    }
    return Status::Budget(str_cat("budget ", format_size(base.budget_bytes), " (", base.budget_bytes,
                                  " bytes) is below the smallest peak memc can plan for this model, batch and optimizer: ",
                                  format_size(floor.peak_bytes), " (", floor.peak_bytes, " bytes) with ", floor.label(),
                                  "; largest at that peak: ", floor.largest, " ", format_size(floor.largest_bytes)));
  };
  // A quick check first: when even the least-memory setting without micro-batches misses the
  // budget by more than a third at every precision, the floor is computed before the search,
  // and a budget below it is refused at once.
  if (base.budget_bytes > 0 && (space.remat || space.offload)) {
    bool hopeless = true;
    for (const std::string& p : precisions) {
      RematOptions least = base.remat;
      if (space.remat) least.policy = "blocks";
      MEMC_ASSIGN_OR_RETURN(Candidate c, s.evaluate(p, ks.front(), least, variants.back().attention, variants.back().offload));
      if (c.peak_bytes / 4 <= budget / 3) hopeless = false;
    }
    if (hopeless) {
      MEMC_ASSIGN_OR_RETURN(Candidate floor, compute_floor());
      if (floor.peak_bytes > budget) return floor_error(floor);
    }
  }

  std::optional<Candidate> best;
  // Fastest first: each (precision, variant) plan without micro-batching or remat bounds the
  // time of everything that adds memory savings to it.
  struct Start {
    Candidate plain;  // no micro-batches, no remat: the fastest plan of this precision and variant
    size_t variant;
  };
  std::vector<Start> order;
  for (const std::string& p : precisions) {
    for (size_t v = 0; v < variants.size(); ++v) {
      MEMC_ASSIGN_OR_RETURN(Candidate c, s.evaluate(p, ks.front(), no_remat, variants[v].attention, variants[v].offload));
      order.push_back({c, v});
    }
  }
  std::stable_sort(order.begin(), order.end(), [](const Start& x, const Start& y) { return x.plain.step_ms < y.plain.step_ms; });
  // The fastest of these that fits bounds everything from the start: the loop below would take
  // it whenever it reached its start, so only plans slower than it are left uncompiled.
  for (const Start& start : order) {
    if (start.plain.peak_bytes <= budget && (!best || start.plain.step_ms < best->step_ms)) best = start.plain;
  }
  for (const Start& start : order) {
    if (best && start.plain.step_ms >= best->step_ms) break;
    if (start.plain.persistent_bytes > budget) continue;  // every plan of it holds at least these
    const std::string& p = start.plain.precision;
    const Variant& var = variants[start.variant];
    for (int64_t k : ks) {
      MEMC_ASSIGN_OR_RETURN(Candidate c, s.evaluate(p, k, no_remat, var.attention, var.offload));
      if (best && c.step_ms >= best->step_ms) break;  // larger k is slower still
      if (c.peak_bytes <= budget) {
        best = c;
        break;
      }
      if (!space.remat) continue;
      MEMC_ASSIGN_OR_RETURN(auto fitted, s.fit_remat(p, k, var.attention, var.offload, budget, c.activation_bytes));
      if (fitted && (!best || fitted->step_ms < best->step_ms)) best = fitted;
    }
  }

  SearchResult result;
  if (!best) {
    MEMC_ASSIGN_OR_RETURN(Candidate floor, compute_floor());
    if (floor.peak_bytes > budget) return floor_error(floor);
    best = floor;  // only the scheduled least-memory plan fits
  }
  result.best = *best;
  result.chosen = s.options_for(*best);
  result.chosen.budget_bytes = base.budget_bytes;
  result.chosen.keep_lower = false;  // the search compared the peaks: its choice is written as chosen
  result.chosen.after_pass = base.after_pass;

  // The ladder: from the unconstrained plan, each technique added in turn (the articles' order).
  {
    std::string p = precisions.front();
    int64_t k = ks.front();
    RematOptions r = no_remat;
    const std::string a = variants.front().attention;
    std::string off = variants.front().offload;
    MEMC_ASSIGN_OR_RETURN(Candidate c, s.evaluate(p, k, r, a, off));
    result.ladder.push_back(c);
    if (space.precision && precisions.size() > 1) {
      p = profile.bf16 ? "bf16-mixed" : precisions[1];
      MEMC_ASSIGN_OR_RETURN(c, s.evaluate(p, k, r, a, off));
      result.ladder.push_back(c);
    }
    if (space.micro_batches && ks.size() > 1 && base.batch >= 4) {
      k = std::min<int64_t>(std::max<int64_t>(4, best->micro_batches), ks.back());
      MEMC_ASSIGN_OR_RETURN(c, s.evaluate(p, k, r, a, off));
      result.ladder.push_back(c);
    }
    if (space.remat) {
      r = RematOptions{.policy = "blocks"};
      MEMC_ASSIGN_OR_RETURN(c, s.evaluate(p, k, r, a, off));
      result.ladder.push_back(c);
    }
    if (space.offload) {
      off = "optimizer";
      MEMC_ASSIGN_OR_RETURN(c, s.evaluate(p, k, r, a, off));
      result.ladder.push_back(c);
    }
  }
  // Pareto front over everything compiled: no other candidate has both a lower peak and a lower time.
  std::vector<Candidate> all = s.explored();
  std::sort(all.begin(), all.end(), [](const Candidate& x, const Candidate& y) {
    return x.peak_bytes != y.peak_bytes ? x.peak_bytes < y.peak_bytes : x.step_ms < y.step_ms;
  });
  double fastest = std::numeric_limits<double>::infinity();
  for (const Candidate& c : all) {
    if (c.step_ms < fastest) result.pareto.push_back(c), fastest = c.step_ms;
  }
  result.explored = s.explored();
  result.compiles = s.compiles();
  return result;
}

}  // namespace memc
