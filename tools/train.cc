// `memc compile`, `memc run`, `memc export` and `memc inspect PLAN`: the training half of the
// CLI (../shared/CLI.md).
#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <filesystem>
#include <fstream>
#include <map>

#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include "frontend/onnx_weights.h"
#include "frontend/param_audit.h"
#include "ir/printer.h"
#include "passes/memory_plan.h"
#include "runtime/dataset.h"
#include "runtime/file_guard.h"
#include "runtime/host_memory.h"
#include "runtime/op_profile.h"
#include "runtime/timeline.h"
#include "ir/op_registry.h"
#include "planner/compile.h"
#include "planner/cost_model.h"
#include "runtime/calibrate.h"
#include "runtime/safetensors.h"
#include "runtime/train_step.h"
#include "runtime/trainer.h"
#if MEMC_HAVE_MPI
#include "backends/comm/mpi_communicator.h"
#endif
#include "backends/cuda_module.h"
#include "support/atomic_file.h"
#include "support/log.h"
#include "support/size.h"
#include "tools/commands.h"

namespace memc::cli {
namespace {

using json = nlohmann::json;

json decisions_json(const Decisions& d) {
  return {{"precision", d.precision}, {"micro_batches", d.micro_batches}, {"remat", d.remat},
          {"shard", d.shard},         {"offload", d.offload},             {"attention", d.attention},
          {"loss_chunks", d.loss_chunks}};
}

int64_t count_params(const Module& m, int64_t* bytes) {
  int64_t count = 0;
  *bytes = 0;
  for (ValueId a : m.arguments()) {
    const Value& v = m.value(a);
    if (v.role != Role::kParam) continue;
    count += v.type.numel();
    *bytes += v.type.bytes();
  }
  return count;
}

json plan_summary(const std::string& path, const Plan& plan) {
  int64_t param_bytes = 0;
  const int64_t params = count_params(plan.eval, &param_bytes);  // the forward's: the step's may be zero3 shards
  return {{"plan", path},
          {"model", plan.model_path},
          {"batch", plan.batch},
          {"devices", plan.devices},
          {"num_classes", plan.num_classes},
          {"optimizer", plan.optimizer.kind},
          {"lr", plan.schedule.lr},
          {"schedule", plan.schedule.kind},
          {"epochs", plan.epochs},
          {"dropout", plan.dropout},
          {"param_count", params},
          {"inputs", [&] {  // the data inputs, by graph name, in order (the labels are "y")
             std::vector<std::string> names;
             for (const InputSpec& in : data_inputs(plan.eval)) names.push_back(in.name);
             return names;
           }()},
          {"trainable_params", [&] {
             std::vector<std::string> names;  // the initializers trained (memc inspect MODEL explains them)
             for (ValueId a : plan.eval.arguments())
               if (plan.eval.value(a).role == Role::kParam) names.push_back(plan.eval.value(a).source_name);
             return names;
           }()},
          {"param_bytes", param_bytes},
          {"train_nodes", plan.train.schedule().size()},
          {"flops_per_step", [&] {  // the training step's arithmetic on one rank (ir/op_registry.h node_flops): MFU's numerator
             int64_t flops = 0;
             for (NodeId n : plan.train.schedule()) flops += node_flops(plan.train, plan.train.node(n));
             return flops;
           }()},
          {"comm_bytes_per_step", [&] {  // what one rank sends per step (ring collectives)
             int64_t bytes = 0;
             for (NodeId n : plan.train.schedule()) bytes += collective_wire_bytes(plan.train, plan.train.node(n));
             return bytes;
           }()},
          {"eval_nodes", plan.eval.schedule().size()},
          {"decisions", decisions_json(plan.decisions)},
          {"predicted_peak_bytes", plan.memory.predicted_peak_bytes},
          // Loading allocates the arena and workspace first, then streams each weight into its
          // slice: the loading phase's device peak is the same figure.
          {"load_peak_bytes", plan.memory.predicted_peak_bytes},
          {"lower_bound_bytes", plan.memory.lower_bound_bytes},
          {"persistent_bytes", plan.memory.persistent_bytes},
          {"host_bytes", plan.memory.host_bytes},
          {"breakdown", plan.memory.breakdown},
          {"category_peak_bytes", plan.memory.category_peak_bytes},
          {"budget_bytes", plan.budget_bytes > 0 ? json(plan.budget_bytes) : json(nullptr)},
          {"target", plan.target},
          {"estimated_step_ms", plan.estimated_step_ms},
          {"estimated_comm_ms", plan.estimated_comm_ms},
          {"estimated_comm_exposed_ms", plan.estimated_comm_exposed_ms},
          {"interconnect", plan.interconnect}};
}

void print_summary(const json& s) {
  std::printf("plan       %s (from %s)\n", s["plan"].get<std::string>().c_str(), s["model"].get<std::string>().c_str());
  std::printf("training   batch %lld, %lld classes, %s lr %g (%s), %lld epoch(s)%s\n", static_cast<long long>(s["batch"].get<int64_t>()),
              static_cast<long long>(s["num_classes"].get<int64_t>()), s["optimizer"].get<std::string>().c_str(),
              s["lr"].get<double>(), s["schedule"].get<std::string>().c_str(), static_cast<long long>(s["epochs"].get<int64_t>()),
              s["dropout"].get<bool>() ? "" : ", dropout off");
  std::printf("params     %s (%s) in %zu trained initializers (memc inspect MODEL lists them)\n", with_commas(s["param_count"].get<int64_t>()).c_str(),
              human_bytes(s["param_bytes"].get<int64_t>()).c_str(), s["trainable_params"].size());
  std::printf("nodes      %lld in the training step, %lld in the forward pass\n", static_cast<long long>(s["train_nodes"].get<int64_t>()),
              static_cast<long long>(s["eval_nodes"].get<int64_t>()));
  const int64_t peak = s["predicted_peak_bytes"].get<int64_t>(), bound = s["lower_bound_bytes"].get<int64_t>();
  std::printf("memory     planned peak %s (%s bytes), lower bound %s (+%.2f%%)%s\n", human_bytes(peak).c_str(), with_commas(peak).c_str(),
              human_bytes(bound).c_str(), bound ? 100.0 * static_cast<double>(peak - bound) / static_cast<double>(bound) : 0.0,
              s["budget_bytes"].is_null() ? "" : (", budget " + human_bytes(s["budget_bytes"].get<int64_t>())).c_str());
  std::string parts;
  for (const auto& [name, bytes] : s["breakdown"].items()) {
    if (bytes.get<int64_t>() > 0) parts += (parts.empty() ? "" : ", ") + name + " " + human_bytes(bytes.get<int64_t>());
  }
  std::printf("at peak    %s\n", parts.c_str());
  const json& d = s["decisions"];
  const int64_t devices = s.value("devices", int64_t{1});
  const std::string shard = devices > 1 ? str_cat(shard_stage_name(static_cast<ShardStage>(d["shard"].get<int64_t>())), " over ", devices, " devices")
                                        : std::string("none");
  const int64_t chunks = d.value("loss_chunks", int64_t{1});
  std::printf("decisions  precision %s, micro-batches %lld, remat %s, shard %s, offload %s, attention %s%s\n",
              d["precision"].get<std::string>().c_str(), static_cast<long long>(d["micro_batches"].get<int64_t>()),
              d["remat"].get<std::string>().c_str(), shard.c_str(), d["offload"].get<std::string>().c_str(),
              d["attention"].get<std::string>().c_str(), chunks > 1 ? str_cat(", loss in ", chunks, " chunks").c_str() : "");
  std::printf("estimate   %.1f ms per step on %s (planner/cost_model.h)\n", s["estimated_step_ms"].get<double>(),
              s["target"].get<std::string>().c_str());
  if (devices > 1) {
    const std::string over = s.value("interconnect", std::string());
    std::printf("comm       collectives %.1f ms per step%s, %.1f ms of it not hidden by compute\n", s.value("estimated_comm_ms", 0.0),
                over.empty() ? "" : (" over " + over).c_str(), s.value("estimated_comm_exposed_ms", 0.0));
  }
}

}  // namespace

// The process's peak resident set (the kernel's ru_maxrss, KiB), next to the planned device bytes.
// This process's resident high-water mark: the kernel's VmHWM, which starts afresh at exec (the
// rusage maximum carries over a parent's from before the exec: a memc started from a large
// Python process would report the parent's size).
static int64_t process_peak_rss_bytes() {
  if (FILE* f = std::fopen("/proc/self/status", "r")) {
    char line[256];
    long long kib = -1;
    while (std::fgets(line, sizeof line, f)) {
      if (std::sscanf(line, "VmHWM: %lld kB", &kib) == 1) break;
    }
    std::fclose(f);
    if (kib >= 0) return kib * 1024;
  }
  struct rusage usage {};
  return getrusage(RUSAGE_SELF, &usage) == 0 ? static_cast<int64_t>(usage.ru_maxrss) * 1024 : 0;
}

// With --devices N and a budget, each shard stage's search in turn; the fastest plan that fits
// wins, fewer sharded states on a tie. When no stage fits, the last stage's error (zero3's: the
// smallest peak) is the answer.
static Expected<SearchResult> search_shard_stages(ModelCompiler& compiler, const CompileOptions& base, const SearchSpace& space) {
  std::optional<SearchResult> best;
  std::vector<ShardRung> rungs;
  Status last = Status::Ok();
  for (const ShardStage stage : {ShardStage::kZero1, ShardStage::kZero2, ShardStage::kZero3}) {
    CompileOptions options = base;
    options.shard.stage = stage;
    SearchSpace stage_space = space;
    Expected<SearchResult> found = search_plan(compiler, options, stage_space);
    if (!found.ok()) {
      last = found.status();
      log(1, str_cat("search --shard ", shard_stage_name(stage), ": ", last.message()));
      rungs.push_back({stage, std::nullopt, last.message()});
      continue;
    }
    rungs.push_back({stage, found->best, ""});
    log(1, str_cat("search --shard ", shard_stage_name(stage), ": ", found->best.label(), ", planned peak ", found->best.peak_bytes,
                   " bytes, ", found->best.step_ms, " ms"));
    if (!best || found->best.step_ms < best->best.step_ms) best = std::move(found).value();
  }
  if (!best) return last;
  best->shard_rungs = std::move(rungs);
  return std::move(*best);
}

// Refuses what the compile flags spell wrong before anything is imported.
Status check_compile_args(const CompileArgs& args) {
  if (args.loss != "cross_entropy") return Status::BadInput("--loss " + args.loss + " is not supported (cross_entropy)");
  if (args.schedule.kind != "constant" && args.schedule.kind != "cosine" && args.schedule.kind != "warmup-cosine") {
    return Status::BadInput("--schedule " + args.schedule.kind + " is not one of constant, cosine, warmup-cosine");
  }
  if (!std::filesystem::exists(args.model)) return Status::BadInput(args.model + ": no such file");
  MEMC_RETURN_IF_ERROR(check_outputs(model_files(args.model), {{"-o", args.output}}, args.force));
  const std::vector<std::string> points = ir_dump_points();
  if (!args.print_ir_after.empty() && std::find(points.begin(), points.end(), args.print_ir_after) == points.end()) {
    return Status::BadInput("--print-ir-after " + args.print_ir_after + ": passes are " + ir_dump_point_list());
  }
  return Status::Ok();
}

// --dump-dir: refuses a folder that holds dumps already (unless --force), creates it.
Status prepare_dump_dir(const CompileArgs& args) {
  if (args.dump_dir.empty()) return Status::Ok();
  std::error_code ec;
  for (std::filesystem::directory_iterator it(args.dump_dir, ec), end; !ec && it != end && !args.force; it.increment(ec)) {
    const std::string name = it->path().filename().string();  // NN-pass.mlir, as IrDumper writes them
    if (name.size() > 8 && std::isdigit(static_cast<unsigned char>(name[0])) && std::isdigit(static_cast<unsigned char>(name[1])) && name[2] == '-' &&
        name.ends_with(".mlir")) {
      return Status::BadInput("--dump-dir " + args.dump_dir + ": holds IR dumps already (" + name + "); pass --force to replace them");
    }
  }
  ec.clear();
  std::filesystem::create_directories(args.dump_dir, ec);
  if (ec) return Status::BadInput("--dump-dir " + args.dump_dir + ": " + ec.message());
  return Status::Ok();
}

// The IR after each pass: on stderr under MLIR's banner (--print-ir-after-all, --print-ir-after
// PASS) and as DIR/NN-pass.mlir (--dump-dir). The first failed write is kept in `status`.
struct IrDumper {
  const CompileArgs& args;
  int dumped = 0;
  Status status = Status::Ok();

  bool wanted() const { return args.print_ir_after_all || !args.print_ir_after.empty() || !args.dump_dir.empty(); }
  void operator()(std::string_view pass, const Module& module) {
    const bool print = args.print_ir_after_all || args.print_ir_after == pass;
    if (!print && args.dump_dir.empty()) return;
    const std::string text = print_module(module);
    if (print) std::fprintf(stderr, "%s\n%s", ir_dump_banner(pass).c_str(), text.c_str());
    if (args.dump_dir.empty()) return;
    char name[64];
    std::snprintf(name, sizeof(name), "%02d-%.*s.mlir", dumped++, static_cast<int>(pass.size()), pass.data());
    const Status st = write_file_atomic((std::filesystem::path(args.dump_dir) / name).string(), text);
    if (!st.ok() && status.ok()) status = st;
  }
};

// The budget search (or --explain's whole space) when it is asked for; `options` becomes its choice.
Expected<std::optional<SearchResult>> run_search(const CompileArgs& args, ModelCompiler& compiler, CompileOptions& options, double& seconds) {
  const SearchSpace& free = args.search;
  const bool any_free = free.precision || free.micro_batches || free.remat || free.attention || free.offload;
  const bool searching = (options.budget_bytes > 0 && any_free) || args.auto_requested;
  if (!searching && !args.explain) return std::optional<SearchResult>();
  SearchSpace space = args.search;
  if (!searching) space = {true, true, true, true, true};  // --explain alone: the whole space, no budget
  space.ladder = args.explain || args.json;  // only they show it
  const auto start = std::chrono::steady_clock::now();
  Expected<SearchResult> found = args.search_shard ? search_shard_stages(compiler, options, space) : search_plan(compiler, options, space);
  if (!found.ok()) return found.status();
  seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  log(1, str_cat("search: ", found->compiles, " candidate plans compiled in ", seconds, " s; chosen: ", found->best.label()));
  if (searching) options = found->chosen;
  return std::optional<SearchResult>(std::move(found).value());
}

// A search candidate's row in --json.
json candidate_json(const Candidate& c, const CompileOptions& options, const SearchResult& search) {
  return json{{"decisions", c.label()},
              {"precision", precision_name(c.precision)},
              {"micro_batches", c.micro_batches},
              {"remat", describe_remat(c.remat)},
              {"attention", attention_kernel_name(c.attention)},
              {"offload", offload_level_name(c.offload)},
              {"loss_chunks", c.loss_chunks},
              {"shard", shard_stage_name(c.shard)},
              {"devices", c.devices},
              {"planned_peak_bytes", c.peak_bytes},
              {"estimated_step_ms", c.step_ms},
              {"fits", options.budget_bytes <= 0 || c.peak_bytes <= options.budget_bytes},
              {"chosen", c.label() == search.best.label()}};
}

json search_json(const SearchResult& search, const CompileOptions& options, double seconds) {
  json ladder = json::array(), pareto = json::array();
  for (const Candidate& c : search.ladder) ladder.push_back(candidate_json(c, options, search));
  for (const Candidate& c : search.pareto) pareto.push_back(candidate_json(c, options, search));
  json result = {{"candidates_compiled", search.compiles}, {"search_seconds", seconds}, {"chosen", candidate_json(search.best, options, search)},
                 {"ladder", ladder}, {"pareto", pareto}};
  if (!search.shard_rungs.empty()) {
    json rungs = json::array();
    for (const ShardRung& r : search.shard_rungs) {
      rungs.push_back(r.best ? candidate_json(*r.best, options, search) : json{{"shard", shard_stage_name(r.stage)}, {"fits", false}, {"why", r.why}});
    }
    result["shard_rungs"] = rungs;
  }
  return result;
}

// --explain's text: the ladder, the Pareto front and the search time.
void print_explanation(const SearchResult& search, const CompileOptions& options, const std::string& target, double seconds) {
  auto line = [&](const Candidate& c) {
    const bool fits = options.budget_bytes <= 0 || c.peak_bytes <= options.budget_bytes;
    std::printf("  %-82s %12s %12.1f ms  %s%s\n", c.label().c_str(), human_bytes(c.peak_bytes).c_str(), c.step_ms, fits ? "fits" : "over",
                c.label() == search.best.label() ? "  <- chosen" : "");
  };
  std::printf("ladder     each technique added in turn (planned peak, estimated step time on %s):\n", target.c_str());
  for (const Candidate& c : search.ladder) line(c);
  if (!search.shard_rungs.empty()) {
    std::printf("sharding   each stage's fastest plan that fits (its own search):\n");
    for (const ShardRung& r : search.shard_rungs) {
      if (r.best) {
        line(*r.best);
      } else {
        std::printf("  %s: no plan fits: %s\n", shard_stage_name(r.stage).c_str(), r.why.c_str());
      }
    }
  }
  std::printf("pareto     the (peak, time) front of the %d plans compiled:\n", search.compiles);
  for (const Candidate& c : search.pareto) line(c);
  std::printf("search     %d candidate plans compiled in %.2f s\n", search.compiles, seconds);
}

int run_compile(const CompileArgs& args) {
  if (Status st = check_compile_args(args); !st.ok()) return report(st);
  CompileOptions options = args.options;
  options.schedule = args.schedule;
  options.threads = host_memory().threads;  // the estimate's (and the kernel workspaces') threads
  if (!args.budget.empty()) {
    Expected<int64_t> budget = parse_size(args.budget);
    if (!budget.ok()) return report(budget.status().with_context("--budget: "));
    options.budget_bytes = *budget;
  }
  if (Status st = prepare_dump_dir(args); !st.ok()) return report(st);
  IrDumper dumper{args};
  if (dumper.wanted()) options.after_pass = std::ref(dumper);
  ModelCompiler compiler(args.model, args.output);
  double search_s = 0;  // the search's own wall time (import, candidates, ladder)
  Expected<std::optional<SearchResult>> search = run_search(args, compiler, options, search_s);
  if (!search.ok()) return report(search.status());
  Expected<Plan> plan = compiler.compile(options);
  if (!plan.ok()) return report(plan.status());
  plan->threads = host_memory().threads;  // what the kernel workspaces were just sized for
  plan->bf16_gemm = bf16_gemm_path();     // likewise
  // A --remat size the solver cannot meet is answered with the least it can hold, and said so
  // (a remat limit the search chose is judged by the plan's peak alone).
  const Plan::RematOutcome& remat = plan->remat_outcome;
  const bool searched_remat = *search && (options.budget_bytes > 0 || args.auto_requested) && args.search.remat;
  if (remat.has_limit && !remat.limit_met && !searched_remat) {
    warn(str_cat("--remat ", describe_remat(options.remat), " is not met: the schedule holds ", format_size(remat.held_tape_bytes), " of tapes at once (",
                 remat.held_tape_bytes, " bytes; the solver holds no less than the largest segment's tape)"));
  }
  if (!dumper.status.ok()) return report(dumper.status.with_context("--dump-dir: "));
  if (args.print_ir) std::fputs(print_module(plan->train).c_str(), stdout);
  if (Status st = write_plan(args.output, *plan); !st.ok()) return report(st);
  json summary = plan_summary(args.output, *plan);
  summary["process_peak_rss_bytes"] = process_peak_rss_bytes();
  // Compile-time only (the plan file does not keep them): whether the tapes held fit a --remat
  // size (null without one), and whether remat planned higher so the step without it was kept.
  summary["remat_limit_met"] = remat.has_limit ? json(remat.limit_met) : json(nullptr);
  summary["remat_kept_without"] = remat.kept_without_remat;
  if (*search) summary["search"] = search_json(**search, options, search_s);
  if (args.json) std::printf("%s\n", summary.dump(2).c_str());
  else print_summary(summary);
  if (*search && args.explain && !args.json) print_explanation(**search, options, plan->target, search_s);
  return 0;
}

// Started by mpirun (OpenMPI's or a PMIx launcher's environment): one rank of a job.
static bool under_launcher() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr || std::getenv("PMI_SIZE") != nullptr;
}

// The job's communicator when mpirun started this process (nullptr otherwise: one device).
static Expected<std::unique_ptr<comm::Communicator>> job_communicator() {
  if (!under_launcher()) return std::unique_ptr<comm::Communicator>();
#if MEMC_HAVE_MPI
  MEMC_ASSIGN_OR_RETURN(std::unique_ptr<comm::MpiCommunicator> mpi, comm::MpiCommunicator::create());
  return std::unique_ptr<comm::Communicator>(std::move(mpi));
#else
  return Status::BadInput("started by mpirun, but this memc was built without MPI (scripts/setup.sh installs OpenMPI)");
#endif
}

static int run_ranked(const RunArgs& args, const Plan& plan, comm::Communicator* comm);

// One line for a failure (a rank other than 0 names itself), and in a job of several ranks the
// whole job ends: no peer waits in a collective (or in MPI_Finalize) for this rank. A verdict
// every rank reached alike (a collective check's) is rank 0's line alone: every rank ends the
// job only after a barrier that rank 0 enters with its line written, so no rank's exit cuts the
// line or a collective short (abort() silences the launcher's SIGTERM report).
static int fail_job(const Status& st, comm::Communicator* comm) {
  const int rank = comm ? comm->rank() : 0;
  if (st.reached_by_every_rank() && comm && comm->size() > 1) {
    const int code = rank == 0 ? report(st) : st.exit_code();
    (void)comm->barrier();
    comm->abort(code);
  }
  const int code = rank == 0 ? report(st) : report(st.with_context(str_cat("rank ", rank, " of ", comm->size(), ": ")));
  if (comm && comm->size() > 1) comm->abort(code);
  return code;
}

// --profile: kernel time per training step (every call of the run, evaluation included, divided
// by the steps trained), by category and by op.
static std::map<std::string, double> op_category_ms(const std::vector<OpTime>& ops) {
  std::map<std::string, double> by_category;
  for (const OpTime& t : ops) by_category[t.category] += t.ms;
  return by_category;
}

// The cost model's time per op for one step of the plan at the threads this run used, on the
// plan's target (empty when the target is not a profile memc can read here).
static std::map<std::string, double> estimated_op_ms(const Plan& plan) {
  std::map<std::string, double> by_op;
  Expected<DeviceProfile> profile = device_profile(plan.target);
  if (profile.ok()) estimate_step(plan.train, *profile, std::max<int64_t>(host_memory().threads, 1), &by_op);
  return by_op;
}

static std::map<std::string, double> estimated_category_ms(const std::map<std::string, double>& by_op) {
  std::map<std::string, double> by_category;
  for (const auto& [op, ms] : by_op) by_category[op_category(op)] += ms;
  return by_category;
}

// Per op, what one training step of the plan moves (node_bytes: its inputs and outputs) and
// computes (node_flops), so each measured op shows the rate it ran at: GB/s for the ops a card's
// memory bounds, TFLOP/s for the GEMMs.
struct OpWork {
  double bytes = 0, flops = 0;
};
static std::map<std::string, OpWork> op_work(const Plan& plan) {
  std::map<std::string, OpWork> by_op;
  for (NodeId id : plan.train.schedule()) {
    const Node& node = plan.train.node(id);
    const OpDef* def = OpRegistry::get().find(node.op);
    // Views move nothing; a transfer's or collective's time is its enqueue and its wait, not a rate.
    if (node.op == "constant" || (def && (def->flags & (kOpView | kOpTransfer | kOpCollective)))) continue;
    OpWork& w = by_op[node.op];
    w.bytes += static_cast<double>(node_bytes(plan.train, node));
    w.flops += static_cast<double>(node_flops(plan.train, node));
  }
  return by_op;
}

// "  812 GB/s  3.10 TFLOP/s" for an op that took `ms` a step; empty where the plan has no work for it.
static std::string rate_note(const std::map<std::string, OpWork>& work, const std::string& op, double ms) {
  const auto it = work.find(op);
  if (it == work.end() || ms <= 0) return "";
  char note[64];
  std::snprintf(note, sizeof note, "  %7.0f GB/s %7.2f TFLOP/s", it->second.bytes / ms / 1e6, it->second.flops / ms / 1e9);
  return note;
}

// "  (estimate 1.23 ms)" beside a measured figure; empty without an estimate.
static std::string estimate_note(const std::map<std::string, double>& estimate, const std::string& key) {
  const auto it = estimate.find(key);
  if (it == estimate.end()) return "";
  char note[64];
  std::snprintf(note, sizeof note, "  (estimate %.2f ms)", it->second);
  return note;
}

// `by_op`: estimated_op_ms(plan).
static void print_op_profile(int64_t steps, const Plan& plan, const std::map<std::string, double>& by_op) {
  const std::vector<OpTime> ops = op_profile();
  const std::map<std::string, double> by_category = estimated_category_ms(by_op);
  double total = 0;
  for (const OpTime& t : ops) total += t.ms;
  double estimated = 0;
  for (const auto& [op, ms] : by_op) estimated += ms;
  // The plan records its profile's name, not a profile file's path: the estimates here are the
  // named profile's at this run's threads, which the plan's own estimate may not be.
  std::printf("kernel time per step (--profile, %lld steps): %.1f ms; the cost model's per op, profile \"%s\" at %lld thread(s): "
              "%.1f ms (the plan's estimate: %.1f ms)\n",
              static_cast<long long>(steps), total / steps, plan.target.c_str(), static_cast<long long>(std::max<int64_t>(host_memory().threads, 1)),
              estimated, plan.estimated_step_ms);
  for (const auto& [category, ms] : op_category_ms(ops)) {
    std::printf("  %-14s %10.2f ms  %5.1f%%%s\n", category.c_str(), ms / steps, total > 0 ? 100.0 * ms / total : 0.0,
                estimate_note(by_category, category).c_str());
  }
  const std::map<std::string, OpWork> work = op_work(plan);
  for (size_t i = 0; i < ops.size() && i < 12; ++i) {
    std::printf("    %-26s %10.2f ms  %6.1f calls  %-15s%s%s\n", ops[i].op.c_str(), ops[i].ms / steps,
                static_cast<double>(ops[i].calls) / steps, str_cat("(", ops[i].category, ")").c_str(), rate_note(work, ops[i].op, ops[i].ms / steps).c_str(),
                estimate_note(by_op, ops[i].op).c_str());
  }
}

static std::string format_ms(double ms) {
  char text[32];
  std::snprintf(text, sizeof text, "%.2f", ms);
  return text;
}

// --profile: each rank's last training step, its collectives in the order they started.
struct TimelineTotals {
  double in_flight_ms = 0, wait_ms = 0, hidden_ms = 0;
  double transfer_ms = -1;  // Σ of the collectives' device times (NCCL), -1 where unknown
};
static TimelineTotals timeline_totals(const StepTimeline& t) {
  TimelineTotals s;
  for (const CollectiveSpan& c : t.collectives) {
    s.in_flight_ms += c.end_ms - c.start_ms, s.wait_ms += c.wait_ms, s.hidden_ms += c.hidden_ms();
    if (c.transfer_ms >= 0) s.transfer_ms = std::max(s.transfer_ms, 0.0) + c.transfer_ms;
  }
  return s;
}

static void print_timelines(const std::vector<StepTimeline>& timelines) {
  for (size_t r = 0; r < timelines.size(); ++r) {
    const StepTimeline& t = timelines[r];
    if (t.collectives.empty()) continue;
    const TimelineTotals s = timeline_totals(t);
    const std::string device = s.transfer_ms >= 0 ? str_cat(" (", format_ms(s.transfer_ms), " ms on NCCL's stream)") : std::string();
    std::printf("  rank %zu, last step %.2f ms: %zu collectives in flight %.2f ms%s, the step waited %.2f ms for them, "
                "%.2f ms went to compute meanwhile\n", r, t.step_ms, t.collectives.size(), s.in_flight_ms, device.c_str(), s.wait_ms, s.hidden_ms);
  }
}

static json timelines_json(const std::vector<StepTimeline>& timelines) {
  json ranks = json::array();
  for (size_t r = 0; r < timelines.size(); ++r) {
    const StepTimeline& t = timelines[r];
    const TimelineTotals s = timeline_totals(t);
    json collectives = json::array();
    for (const CollectiveSpan& c : t.collectives) {
      collectives.push_back({{"op", c.op}, {"start_ms", c.start_ms}, {"end_ms", c.end_ms}, {"wait_ms", c.wait_ms}, {"hidden_ms", c.hidden_ms()},
                             {"transfer_ms", c.transfer_ms >= 0 ? json(c.transfer_ms) : json(nullptr)}});
    }
    ranks.push_back({{"rank", r}, {"step_ms", t.step_ms}, {"kernel_ms", t.kernel_ms}, {"collective_in_flight_ms", s.in_flight_ms},
                     {"collective_wait_ms", s.wait_ms}, {"collective_hidden_ms", s.hidden_ms},
                     {"collective_transfer_ms", s.transfer_ms >= 0 ? json(s.transfer_ms) : json(nullptr)}, {"collectives", collectives}});
  }
  return ranks;
}

// `estimate`: estimated_op_ms(plan).
static json op_profile_json(int64_t steps, const Plan& plan, const std::map<std::string, double>& estimate) {
  const std::vector<OpTime> ops = op_profile();
  const std::map<std::string, OpWork> work = op_work(plan);
  const double per = steps > 0 ? 1.0 / steps : 0.0;
  json by_category = json::object(), by_op = json::array();
  for (const auto& [category, ms] : op_category_ms(ops)) by_category[category] = ms * per;
  for (const OpTime& t : ops) {
    json row = {{"op", t.op}, {"category", t.category}, {"ms_per_step", t.ms * per}, {"calls", t.calls}};
    if (auto it = estimate.find(t.op); it != estimate.end()) row["estimated_ms_per_step"] = it->second;
    if (auto it = work.find(t.op); it != work.end()) {
      row["bytes_per_step"] = it->second.bytes, row["flops_per_step"] = it->second.flops;
      if (t.ms > 0) row["gb_per_s"] = it->second.bytes / (t.ms * per) / 1e6, row["tflop_per_s"] = it->second.flops / (t.ms * per) / 1e9;
    }
    by_op.push_back(row);
  }
  json estimated_category = json::object();
  for (const auto& [category, ms] : estimated_category_ms(estimate)) estimated_category[category] = ms;
  return {{"steps", steps}, {"category_ms_per_step", by_category}, {"estimated_category_ms_per_step", estimated_category}, {"ops", by_op}};
}

int run_run(const RunArgs& args) {
  Expected<Plan> plan = read_plan(args.plan);
  if (!plan.ok()) return report(plan.status());
  // Kernel workspaces grow with the threads (oneDNN's scratchpads): by default no more threads
  // than the plan was sized for, so the measured peak is the planned one.
  if (args.threads == 0 && plan->threads > 0 && plan->threads < host_memory().threads) set_compute_threads(plan->threads);
  if (args.threads > 0 && plan->threads > 0 && args.threads > plan->threads) {
    warn(str_cat("--threads ", args.threads, " is more than the ", plan->threads, " the plan's kernel workspaces were sized for: "
                 "the GEMM scratchpads may exceed the planned peak (compile with --threads ", args.threads, ")"));
  }
  if (!pin_bf16_gemm(plan->bf16_gemm)) {
    warn("the plan's bf16 GEMMs are native, and this CPU cannot run them natively: they are widened to f32, whose workspace "
         "may exceed the planned peak (compile the plan on this machine)");
  }
  Expected<std::unique_ptr<comm::Communicator>> comm = job_communicator();
  if (!comm.ok()) return report(comm.status());
  return run_ranked(args, *plan, comm->get());
}

// Something to train or evaluate on, and outputs that never destroy inputs (the checkpoint file
// is both under --resume, by its own rules).
static Status check_run_files(const RunArgs& args, const Plan& plan) {
  if (args.options.data.empty() && args.options.eval.empty()) return Status::BadInput("memc run: give --data to train and/or --eval to evaluate");
  std::vector<std::string> inputs = plan_input_files(args.plan, plan);
  for (const std::string& f : {args.plan, args.options.data, args.options.eval}) inputs.push_back(f);
  const std::string checkpoint =
      args.options.checkpoint_dir.empty() ? "" : (std::filesystem::path(args.options.checkpoint_dir) / "checkpoint.safetensors").string();
  if (args.options.resume) inputs.push_back(checkpoint);
  const std::vector<OutputFile> outputs = {{"--checkpoint", checkpoint, true}, {"--json", args.json_report}, {"--dump-grads", args.options.dump_grads}};
  return check_outputs(inputs, outputs, args.force);
}

#if MEMC_HAVE_MPI
// GPU ranks: NCCL (in the CUDA module, loaded with the GPU backend), bootstrapped over this job's
// MPI, with its deadline for a dead peer.
static Expected<std::unique_ptr<comm::Communicator>> gpu_rank_communicator(comm::Communicator& bootstrap, int device) {
  MEMC_ASSIGN_OR_RETURN(const cuda::ModuleApi* module, cuda::load_module());
  if (!module->nccl_communicator) {
    return Status::BadInput("a plan sharded over GPU ranks needs NCCL, and the CUDA module was built without it (CUDA's NCCL at build time)");
  }
  const auto* mpi = dynamic_cast<const comm::MpiCommunicator*>(&bootstrap);
  return module->nccl_communicator(bootstrap, device, mpi ? mpi->timeout_s() : 0);
}
#endif

// Rank 0's lines after a run that did not diverge (--quiet drops the progress line, not these).
static void print_run_result(const RunArgs& args, const Plan* plan, const RunReport& r, const std::map<std::string, double>& estimated_ms) {
  if (r.steps) {
    std::printf("trained %lld steps: loss %.4f, %.1f ms/step, %.0f samples/s\n", static_cast<long long>(r.steps), r.final_loss, r.step_ms, r.samples_per_s);
    if (r.loss_scaling) std::printf("loss scaling: %lld steps skipped (inf/NaN gradients), loss scale %g\n", static_cast<long long>(r.skipped_steps), r.loss_scale);
    // A plan counts its target's kernel workspaces: on another backend the two differ by that.
    const bool elsewhere = (r.device == "cpu") != (plan->target != "a100" && plan->target != "h100" && plan->target != "h200");
    std::printf("device peak %s measured on %s, %s planned for %s%s\n", with_commas(r.measured_peak_bytes).c_str(), r.device.c_str(),
                with_commas(plan->memory.predicted_peak_bytes).c_str(), plan->target.c_str(),
                elsewhere ? " (kernel workspaces differ between the two)" : "");
  }
  if (args.profile && r.steps) {
    print_op_profile(r.steps, *plan, estimated_ms);
    print_timelines(r.rank_timelines);
  }
  if (r.accuracy >= 0) {
    const bool tokens = label_spec(plan->train, plan->num_classes).tokens();  // counted over positions whose label is not -100
    std::printf("accuracy %.2f%% on %lld %s of %s\n", 100.0 * r.accuracy, static_cast<long long>(r.eval_samples), tokens ? "positions" : "samples",
                args.options.eval.c_str());
  }
}

// The --json report of a run.
static json run_report_json(const RunArgs& args, const Plan* plan, const RunReport& r, const std::map<std::string, double>& estimated_ms) {
  const bool diverged = r.status != "ok";
  json j = {{"plan", args.plan}, {"steps", r.total_steps}, {"steps_this_run", r.steps}, {"loss", r.final_loss}, {"losses", r.losses},
            {"step_ms", r.step_ms}, {"loop_step_ms", r.loop_step_ms}, {"samples_per_s", r.samples_per_s}, {"decisions", decisions_json(plan->decisions)},
            {"predicted_peak_bytes", plan->memory.predicted_peak_bytes}, {"lower_bound_bytes", plan->memory.lower_bound_bytes},
            {"breakdown", plan->memory.breakdown}, {"target", plan->target}, {"estimated_step_ms", plan->estimated_step_ms},
            {"device", r.device}};
  j["measured_peak_bytes"] = r.steps ? json(r.measured_peak_bytes) : json(nullptr);
  j["load_peak_bytes"] = r.steps ? json(r.load_peak_bytes) : json(nullptr);
  j["accuracy"] = r.accuracy >= 0 ? json(r.accuracy) : json(nullptr);
  j["skipped_steps"] = r.skipped_steps;
  j["loss_scale"] = r.loss_scaling ? json(r.loss_scale) : json(nullptr);
  j["status"] = r.status;
  if (diverged) j["error"] = r.error, j["diverged_step"] = r.diverged_step;
  j["process_peak_rss_bytes"] = process_peak_rss_bytes();
  if (r.device_in_use_at_open >= 0) {  // a GPU: the driver's figures beside the accountant's
    j["device_memory"] = {{"in_use_at_open_bytes", r.device_in_use_at_open}, {"in_use_after_training_bytes", r.device_in_use_after_training}};
  }
  if (r.ranks > 1) {
    j["devices"] = r.ranks;
    j["communicator"] = r.communicator;
    json ranks = json::array();
    for (size_t i = 0; i < r.rank_peak_bytes.size(); ++i) {
      ranks.push_back({{"rank", i}, {"measured_peak_bytes", r.rank_peak_bytes[i]}, {"predicted_peak_bytes", plan->memory.predicted_peak_bytes}});
    }
    j["ranks"] = ranks;
  }
  const HostMemory& host = host_memory();
  j["host_memory"] = {{"address_limit_bytes", host.address_limit_bytes >= 0 ? json(host.address_limit_bytes) : json(nullptr)},
                      {"gemm_threads", host.gemm_threads}, {"gemm_buffer_bytes", host.gemm_buffer_bytes},
                      {"threads", host.threads}, {"gemm_library", gemm_library()}, {"vector_math", host.vector_math},
                      {"vector_loops", host.vector_loops},
                      {"openblas_core", host.openblas_core}, {"omp_wait", host.omp_wait}};
  if (args.profile) {
    j["op_profile"] = op_profile_json(r.steps, *plan, estimated_ms);
    j["op_profile"]["timeline"] = timelines_json(r.rank_timelines);
  }
  return j;
}

static int run_ranked(const RunArgs& args_in, const Plan& plan_in, comm::Communicator* comm) {
  RunArgs args = args_in;
  args.options.comm = comm;
#if MEMC_HAVE_MPI
  args.options.device_communicator = gpu_rank_communicator;
#endif
  const int rank = comm ? comm->rank() : 0;
  if (rank != 0) {  // rank 0 speaks for the job; the others report only their own failure
    args.options.quiet = true;
    args.json_report.clear();
  }
  const Plan* plan = &plan_in;
  // A rank that fails ends the whole job: a bad argument seen by rank 0 alone (its --json
  // exists) included.
  auto fail = [&](const Status& st) { return fail_job(st, comm); };
  if (Status st = check_run_files(args, *plan); !st.ok()) return fail(st);
  if (args.profile) enable_op_profile();
  // No final state: the checkpoint holds the weights, and a copy would double the process's
  // resident memory at the end of the run (ViT-B/16 b2: 1.0 GB beside a 1.29 GB plan).
  Expected<RunReport> result = run_plan(args.plan, *plan, args.options);
  if (!result.ok()) return fail(result.status());
  const RunReport& r = *result;
  const bool diverged = r.status != "ok";
  if (rank != 0) return diverged ? 2 : 0;
  const std::map<std::string, double> estimated_ms = args.profile ? estimated_op_ms(*plan) : std::map<std::string, double>{};
  // a diverged run reports its one line only
  if (!diverged) print_run_result(args, plan, r, estimated_ms);
  if (!args.json_report.empty()) {
    const json j = run_report_json(args, plan, r, estimated_ms);
    if (Status st = write_file_atomic(args.json_report, j.dump(2) + "\n"); !st.ok()) return report(st.with_context("--json: "));
  }
  if (diverged) return report(Status::BadInput(r.error));
  return 0;
}

int run_export(const ExportArgs& args) {
  Expected<Plan> plan = read_plan(args.plan);
  if (!plan.ok()) return report(plan.status());
  std::string weights_path = args.weights;
  if (std::filesystem::is_directory(weights_path)) weights_path = (std::filesystem::path(weights_path) / "checkpoint.safetensors").string();
  std::vector<std::string> inputs = plan_input_files(args.plan, *plan);
  inputs.push_back(args.plan);
  inputs.push_back(weights_path);
  if (Status st = check_outputs(inputs, {{"-o", args.output}}, args.force); !st.ok()) return report(st);
  if (Status st = check_model_unchanged(args.plan, *plan); !st.ok()) return report(st);
  Expected<SafetensorsFile> file = read_safetensors(weights_path);
  if (!file.ok()) return report(file.status());
  std::map<std::string, Tensor> weights;
  for (ValueId a : plan->eval.arguments()) {  // the forward's parameters and buffers (the step's may be zero3 shards)
    const Value& v = plan->eval.value(a);
    if (!is_model_state(v.role)) continue;
    auto it = file->tensors.find(v.source_name);
    if (it == file->tensors.end()) {
      return report(Status::BadInput(str_cat(weights_path, ": no weights for ", v.role == Role::kParam ? "parameter" : "buffer", " '", v.source_name, "'")));
    }
    weights[v.source_name] = it->second;
  }
  // A folded copy tied to a trained tensor (frontend/param_audit.h) is written with that tensor,
  // transposed for a folded transpose ("tied_copies", "tied_transposes": copy, trained, ...).
  for (const auto& [key, transposed] : {std::pair{"tied_copies", false}, std::pair{"tied_transposes", true}}) {
    const Attr* tied = plan->eval.metadata().find(key);
    const auto* names = tied ? std::get_if<std::vector<std::string>>(tied) : nullptr;
    for (size_t i = 0; names && i + 1 < names->size(); i += 2) {
      if (auto it = weights.find((*names)[i + 1]); it != weights.end()) weights[(*names)[i]] = transposed ? transpose_2d(it->second) : it->second;
    }
  }
  // Tensors untied from an initializer the exporter merged by value get initializers of their own.
  const std::string model = resolve_model_path(args.plan, *plan);
  if (Status st = write_onnx_with_weights(model, args.output, weights, untied_uses(plan->eval.metadata())); !st.ok()) return report(st);
  std::printf("memc export: %s with %zu trained weights from %s -> %s\n", model.c_str(), weights.size(), weights_path.c_str(), args.output.c_str());
  return 0;
}

// The timeline page from the plan's memory plan (recomputed: it is deterministic).
static Status write_timeline(const std::string& plan_path, const Plan& plan, const std::string& out) {
  MEMC_ASSIGN_OR_RETURN(MemoryPlanResult mem, MemoryPlan().run(plan.train));
  TimelineInput in;
  in.title = "memc plan " + plan_path + ": training step, batch " + std::to_string(plan.batch);
  for (NodeId n : mem.liveness.schedule) in.steps.push_back("memc." + plan.train.node(n).op);
  const SpacePlan& device = mem.space(MemSpace::kDevice);
  in.arena_bytes = plan.memory.predicted_peak_bytes;  // arena + the kernel workspace region above it
  in.lower_bound_bytes = plan.memory.lower_bound_bytes;
  in.budget_bytes = plan.budget_bytes;
  for (const Buffer& b : mem.liveness.buffers) {
    if (b.space != MemSpace::kDevice || b.range.first < 0) continue;
    TimelineBuffer tb;
    for (size_t i = 0; i < b.values.size() && i < 4; ++i) tb.name += (i ? ", " : "") + plan.train.value(b.values[i]).name;
    if (b.values.size() > 4) tb.name += ", …";
    tb.role = std::string(category_name(category_of(b.role_at(b.range.first))));
    tb.start = b.range.first;
    tb.end = b.range.last;
    tb.bytes = mem.slices[b.id].size;
    tb.offset = mem.slices[b.id].offset;
    in.buffers.push_back(std::move(tb));
  }
  const int64_t workspace = plan.memory.predicted_peak_bytes - device.arena_bytes;
  if (workspace > 0) {  // one region sized for the hungriest kernel, allocated for the whole step
    in.buffers.push_back({"kernel workspace", "workspace", 0, static_cast<int>(in.steps.size()) - 1, workspace, device.arena_bytes});
  }
  return write_file_atomic(out, render_timeline_html(in));
}

int run_inspect_plan(const std::string& path, bool as_json, bool print_ir, const std::string& timeline, bool force) {
  Expected<Plan> plan = read_plan(path);
  if (!plan.ok()) return report(plan.status());
  if (!timeline.empty()) {
    std::vector<std::string> inputs = plan_input_files(path, *plan);
    inputs.push_back(path);
    if (Status st = check_outputs(inputs, {{"--timeline", timeline}}, force); !st.ok()) return report(st);
    if (Status st = write_timeline(path, *plan, timeline); !st.ok()) return report(st);
  }
  json summary = plan_summary(path, *plan);
  if (print_ir) summary["train_ir"] = print_module(plan->train);
  if (as_json) {
    std::printf("%s\n", summary.dump(2).c_str());
    return 0;
  }
  print_summary(summary);
  if (print_ir) std::fputs(print_module(plan->train).c_str(), stdout);
  return 0;
}

// Under mpirun: rank 0 measures the machine while the others wait (no contention), then every
// rank measures the collectives, and rank 0 writes the profile.
static Expected<DeviceProfile> calibrate_job(const CalibrateArgs& args, comm::Communicator* comm) {
  const bool speaker = !comm || comm->rank() == 0;
  DeviceProfile p;
  if (speaker && args.device == "cpu") {
    MEMC_ASSIGN_OR_RETURN(p, calibrate_cpu(args.seconds));
  } else if (speaker) {
    MEMC_ASSIGN_OR_RETURN(const DeviceProfile sheet, gpu_data_sheet(args.target));  // not an earlier measurement
    MEMC_ASSIGN_OR_RETURN(Backend * gpu, open_backend(args.device));
    MEMC_ASSIGN_OR_RETURN(p, calibrate_device(*gpu, sheet, args.seconds));
  }
  // (GPU ranks talk over NCCL, which this does not measure: their profile keeps the data sheet's links)
  if (!comm || comm->size() < 2 || args.device != "cpu") return p;
  MEMC_RETURN_IF_ERROR(comm->barrier());
  MEMC_RETURN_IF_ERROR(calibrate_comm(*comm, p));
  return p;
}

int run_calibrate(const CalibrateArgs& args) {
  if (!(args.seconds > 0)) return report(Status::BadInput("--seconds must be positive"));
  const bool gpu = args.device != "cpu";
  if (gpu != !args.target.empty() || (gpu && args.target != "a100" && args.target != "h100" && args.target != "h200")) {
    return report(Status::BadInput(gpu ? str_cat("--device ", args.device, " needs --target a100, h100 or h200: the GPU it measures")
                                       : "--target goes with a GPU --device (a CPU's profile is its own target)"));
  }
  Expected<std::unique_ptr<comm::Communicator>> comm = job_communicator();
  if (!comm.ok()) return report(comm.status());
  comm::Communicator* c = comm->get();
  const int rank = c ? c->rank() : 0;
  auto fail = [&](const Status& st) { return fail_job(st, c); };
  if (rank == 0) {
    if (Status st = check_outputs({}, {{"-o", args.output}}, args.force); !st.ok()) return fail(st);
  }
  Expected<DeviceProfile> p = calibrate_job(args, c);
  if (!p.ok()) return fail(p.status());
  if (rank != 0) return 0;
  if (Status st = write_profile(args.output, *p); !st.ok()) return fail(st);
  std::printf("profile    %s\n", args.output.c_str());
  std::printf("gemm       %.1f GFLOP/s f32 (half efficiency at %.3g FLOP), %.1f GFLOP/s bf16\n", p->f32_flops / 1e9, p->half_flops,
              p->low_flops / 1e9);
  std::printf("attention  at %.2f of the GEMM rate, plus %.3g FLOP per batch·head entry\n", p->attention_efficiency,
              p->attention_entry_flops);
  std::printf("memory     %.1f GB/s; elementwise at %.3f of the GEMM rate; %.1f us per node\n", p->mem_bandwidth / 1e9,
              p->other_efficiency, p->node_overhead_s * 1e6);
  if (!gpu) {
    std::printf("threads    %lld: each thread past the first adds %.2f of the GEMM rate, %.2f of the rest's (all above at 1 thread)\n",
                static_cast<long long>(host_memory().threads), p->heavy_thread_gain, p->other_thread_gain);
  }
  if (c && c->size() > 1 && !gpu) {
    std::printf("collectives %d ranks over %.*s: %.1f us latency, %.2f GB/s sent per rank\n", c->size(), static_cast<int>(c->transport().size()),
                c->transport().data(), p->comm_latency_s * 1e6, p->comm_bandwidth / 1e9);
  }
  if (gpu) std::printf("use        MEMC_GPU_PROFILE=%s memc compile ... --target %s\n", args.output.c_str(), args.target.c_str());
  else std::printf("use        memc compile ... --target %s\n", args.output.c_str());
  return 0;
}

}  // namespace memc::cli
