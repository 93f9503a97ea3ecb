// The memc command line: argument parsing and dispatch (../shared/CLI.md). The subcommands
// live in tools/<name>.cc. Every failure is one line on stderr and an exit code: 2 for bad
// input (files, flags, data), 3 for an unmet budget, 1 for an internal error.
#include <CLI/CLI.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <optional>
#include <set>
#include <string>

#include "backends/cpu/onednn_matmul.h"
#include "backends/cpu/vector_math.h"
#include "backends/cuda_module.h"
#include "passes/optimizers.h"
#include "passes/pipeline.h"
#include "runtime/host_memory.h"
#include "support/log.h"
#include "tools/commands.h"

namespace memc::cli {
namespace {

// CLI11 messages may span lines; the contract wants one.
std::string one_line(std::string s) {
  for (char& c : s)
    if (c == '\n' || c == '\r') c = ' ';
  while (!s.empty() && s.back() == ' ') s.pop_back();
  return s;
}

// A positive integer option (batch, seq); CLI11's PositiveNumber prints a range up to 1.8e308.
const CLI::Validator kPositive(
    [](std::string& s) -> std::string {
      int64_t v = 0;
      size_t used = 0;
      try {
        v = std::stoll(s, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      return used == s.size() && v > 0 ? "" : "must be a positive integer, got '" + s + "'";
    },
    "INT>0");

constexpr const char* kForceHelp = "Replace an existing output file (an output that is an input is always refused)";

constexpr const char* kCommands[] = {"inspect", "infer", "compile", "run", "export", "calibrate"};

// A positive float option (learning rate) or a non-negative one (weight decay, clipping).
const CLI::Validator kNonNegative(
    [](std::string& s) -> std::string {
      double v = -1;
      size_t used = 0;
      try {
        v = std::stod(s, &used);
      } catch (const std::exception&) {
        used = 0;
      }
      return used == s.size() && v >= 0 && std::isfinite(v) ? "" : "must be a non-negative number, got '" + s + "'";
    },
    "FLOAT>=0");

void add_inspect_command(CLI::App& app, InspectArgs& inspect) {
  CLI::App* cmd = app.add_subcommand("inspect", "Describe a model: inputs, outputs, ops, parameters, FLOPs");
  cmd->add_option("MODEL", inspect.model, "ONNX model (.onnx) or plan from memc compile")->required();
  cmd->add_option("--batch", inspect.batch, "Batch size for dynamic first dims (default: model's, else 1)")->check(kPositive);
  cmd->add_option("--seq", inspect.seq, "Sequence length for dynamic token dims")->check(kPositive);
  cmd->add_flag("--print-ir", inspect.print_ir, "Print the imported IR (MLIR generic syntax)");
  cmd->add_flag("--json", inspect.json, "Print one JSON object instead of text");
  cmd->add_option("--timeline", inspect.timeline, "Plans: write the memory timeline (one self-contained HTML page)");
  cmd->add_flag("--force", inspect.force, kForceHelp);
}

void add_infer_command(CLI::App& app, InferArgs& infer) {
  CLI::App* cmd = app.add_subcommand("infer", "Run a forward pass on inputs from an .npz file");
  cmd->add_option("MODEL", infer.model, "ONNX model with weights (.onnx)")->required();
  cmd->add_option("--input", infer.input, "Inputs (.npz), keyed by graph input name ('x' for one input)")->required();
  cmd->add_option("-o,--output", infer.output, "Outputs (.npz), keyed by graph output name")->required();
  cmd->add_option("--batch", infer.batch, "Batch size (default: first dim of the input arrays)")->check(kPositive);
  cmd->add_option("--seq", infer.seq, "Sequence length (default: second dim of rank-2 inputs)")->check(kPositive);
  cmd->add_flag("--print", infer.print, "Print each output's argmax per row (the predicted class)");
  cmd->add_flag("--force", infer.force, kForceHelp);
}

// memc compile's flags as spelled, before they become CompileOptions (finish_compile_flags).
struct CompileFlags {
  CompileArgs args;
  double weight_decay = -1;  // -1: the optimizer's default
  std::string precision = "fp32", attention = "tiled", offload = "none", remat = "none", shard = "none", loss_chunks = "none";
  int64_t threads = 0, devices = 1;
  bool no_dropout = false;
  std::vector<std::string> disabled_passes;
};

// "a | b (default) | c": each registered optimizer's help line.
std::string optimizer_help() {
  std::string help;
  for (const OptimizerDef& o : optimizers()) help += (help.empty() ? "" : " | ") + std::string(o.help);
  return help + "; the budget search never changes it";
}

std::vector<std::string> optimizer_choices() {
  std::vector<std::string> names;
  for (const OptimizerDef& o : optimizers()) names.emplace_back(o.name);
  return names;
}

// The training run: loss, optimizer, learning-rate schedule and length.
void add_training_flags(CLI::App* cmd, CompileFlags& f) {
  CompileArgs& c = f.args;
  cmd->add_option("--loss", c.loss, "Loss: cross_entropy (softmax cross-entropy on integer labels)");
  cmd->add_option("--optimizer", c.options.optimizer.kind, optimizer_help())->check(CLI::IsMember(optimizer_choices()));
  cmd->add_option("--lr", c.schedule.lr, "Peak learning rate (default 1e-3)")->check(kNonNegative);
  cmd->add_option("--weight-decay", f.weight_decay, "Weight decay (default 0.01 for adamw, else 0)")->check(kNonNegative);
  cmd->add_option("--momentum", c.options.optimizer.momentum, "Momentum for --optimizer momentum (default 0.9)")->check(kNonNegative);
  cmd->add_flag("--nesterov", c.options.optimizer.nesterov, "Nesterov momentum");
  cmd->add_option("--schedule", c.schedule.kind, "constant | cosine | warmup-cosine (default constant)");
  cmd->add_option("--warmup-steps", c.schedule.warmup_steps, "Linear warm-up steps for warmup-cosine")->check(CLI::NonNegativeNumber);
  cmd->add_option("--clip-grad-norm", c.options.optimizer.clip_grad_norm, "Clip the global gradient norm to F (0: off)")->check(kNonNegative);
  cmd->add_option("--epochs", c.options.epochs, "Epochs (the cosine horizon; memc run's default)")->check(kPositive);
  cmd->add_option("--steps-per-epoch", c.options.steps_per_epoch, "Cap on steps per epoch (default: the data's)")->check(kPositive);
}

// The memory decisions, the budget and the target.
void add_memory_flags(CLI::App* cmd, CompileFlags& f) {
  CompileArgs& c = f.args;
  cmd->add_option("--budget", c.budget, "Device memory the plan may use: 6GB, 6GiB, 512MiB, bytes (exit 3 if unmet)");
  cmd->add_option("--precision", f.precision,
                  "fp32 (default) | bf16-mixed | fp16-mixed (dynamic loss scaling) | bf16-true | fp16-true | auto (with --budget: searched unless given)");
  cmd->add_option("--target", c.options.target, "Device of the step-time estimate: cpu (default), a100, h100, h200, or a profile file from memc calibrate");
  cmd->add_option("--interconnect", c.options.interconnect,
                  "How GPU ranks are joined, for the step-time estimate with --devices N: nvlink (default on a GPU target: "
                  "--gpus-per-node GPUs on NVLink, nodes over InfiniBand) | ib (every rank over its own NIC)");
  cmd->add_option("--gpus-per-node", c.options.gpus_per_node, "GPUs sharing a node's NVLink (--interconnect nvlink; default 8)")->check(kPositive);
  cmd->add_flag("--explain", c.explain, "Show the technique ladder and the Pareto front of (peak, step time)");
  cmd->add_option("--micro-batches", c.options.micro_batches, "Split each batch into K micro-batches and accumulate gradients (default 1)")
      ->check(kPositive);
  cmd->add_option("--loss-chunks", f.loss_chunks,
                  "A language model's head and loss in chunks of positions, each differentiated as it is computed, so one chunk's "
                  "logits are live at a time: none (default) | K | auto (a chunk's logits about the size of the head's weight; with --budget: "
                  "searched unless given)");
  cmd->add_option("--attention", f.attention, "tiled (default: memory-efficient attention, the score matrix never stored) | naive (as exported)")
      ->check(CLI::IsMember({"tiled", "naive"}));
  cmd->add_option("--offload", f.offload,
                  "none (default) | optimizer: optimizer state (and master weights under mixed precision) in host memory, updated on the host | "
                  "params: the parameters too, each unit streamed to the device before its forward and its backward | "
                  "auto (with --budget: searched unless given)")
      ->check(CLI::IsMember({"none", "optimizer", "params", "auto"}));
  cmd->add_option("--threads", f.threads,
                  "Compute threads to size the CPU kernels' workspaces for; memc run uses no more by default (default: the cores it may use)")
      ->check(CLI::PositiveNumber);
  cmd->add_option("--devices", f.devices, "Data-parallel ranks (run the plan with mpirun -np N); --batch is their global batch")->check(kPositive);
  cmd->add_option("--shard", f.shard,
                  "With --devices N: zero1 (default: optimizer states split N ways, gradients all-reduced) | zero2 (gradients reduce-scattered per "
                  "unit as well) | zero3 (parameters too, gathered per unit) | none (one device only)");
  cmd->add_option("--remat", f.remat,
                  "Recompute activations in backward: none (default) | blocks (checkpoint each block) | SIZE (hold at most SIZE of saved activations "
                  "and checkpoints from forward to backward; the segment being backpropagated comes on top) | auto (with --budget) | a comma list "
                  "adding save=NAME / recompute=NAME pins");
  cmd->add_flag("--no-dropout", f.no_dropout, "Turn dropout into identity (for exact comparisons with another framework)");
}

CLI::App* add_compile_command(CLI::App& app, CompileFlags& f) {
  CompileArgs& c = f.args;
  CLI::App* cmd = app.add_subcommand("compile", "Build a training plan: loss, autodiff, optimizer, schedule");
  cmd->add_option("MODEL", c.model, "ONNX model (.onnx; a skeleton is enough)")->required();
  cmd->add_option("--batch", c.options.batch, "Batch size")->required()->check(kPositive);
  cmd->add_option("-o,--output", c.output, "Plan file to write")->required();
  cmd->add_option("--seq", c.options.seq, "Sequence length for dynamic token dims")->check(kPositive);
  cmd->add_option("--freeze", c.options.frozen,
                  "Initializers to keep as constants, not train (comma list: a module's buffers, frozen parameters)")
      ->delimiter(',');
  add_training_flags(cmd, f);
  add_memory_flags(cmd, f);
  cmd->add_flag("--print-ir-after-all", c.print_ir_after_all, "Print the IR after each pass (stderr)");
  cmd->add_option("--print-ir-after", c.print_ir_after, "Print the IR after PASS: " + ir_dump_point_list());
  cmd->add_option("--dump-dir", c.dump_dir, "Write the IR after each pass as DIR/NN-pass.mlir");
  cmd->add_option("--disable-pass", f.disabled_passes,
                  "Turn optional rewrites off (comma list; also MEMC_DISABLE_PASSES): the plan is correct without them, only slower. "
                  "Optional: " + optional_rewrite_list())
      ->delimiter(',');
  cmd->add_flag("--print-ir", c.print_ir, "Print the training step's IR");
  cmd->add_flag("--json", c.json, "Print a JSON summary");
  cmd->add_flag("--force", c.force, kForceHelp);
  return cmd;
}

// --loss-chunks: none → 1, auto → 0, K ≥ 1 → K.
Expected<int64_t> parse_loss_chunks(const std::string& text) {
  if (text == "none") return int64_t{1};
  if (text == "auto") return int64_t{0};
  char* end = nullptr;
  const long long k = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || *end != '\0' || k < 1) return Status::BadInput("--loss-chunks '" + text + "': expected none, auto or a count ≥ 1");
  return static_cast<int64_t>(k);
}

// The spelled flags as CompileOptions and the search space: with --budget, each decision not
// given on the command line (or given as auto) is searched.
Status finish_compile_flags(CompileFlags& f, const CLI::App* cmd) {
  CompileArgs& c = f.args;
  const OptimizerDef* optimizer = find_optimizer(c.options.optimizer.kind);
  c.options.optimizer.weight_decay = f.weight_decay >= 0 ? f.weight_decay : optimizer ? optimizer->default_weight_decay : 0.0;
  c.options.dropout = !f.no_dropout;
  c.options.disabled_passes = std::set<std::string>(f.disabled_passes.begin(), f.disabled_passes.end());
  const bool budget = !c.budget.empty();
  c.search.precision = f.precision == "auto" || (budget && cmd->count("--precision") == 0);
  c.search.micro_batches = budget && cmd->count("--micro-batches") == 0;
  c.search.remat = f.remat == "auto" || (budget && cmd->count("--remat") == 0);
  c.search.attention = budget && cmd->count("--attention") == 0;
  c.search.offload = f.offload == "auto" || (budget && cmd->count("--offload") == 0);
  c.search.loss_chunks = budget && cmd->count("--loss-chunks") == 0;
  c.auto_requested = f.offload == "auto" || f.precision == "auto" || f.remat == "auto";
  MEMC_ASSIGN_OR_RETURN(c.options.loss_chunks, parse_loss_chunks(f.loss_chunks));
  MEMC_ASSIGN_OR_RETURN(c.options.precision, parse_precision(f.precision == "auto" ? "fp32" : f.precision));
  MEMC_ASSIGN_OR_RETURN(c.options.attention, parse_attention_kernel(f.attention));
  MEMC_ASSIGN_OR_RETURN(c.options.offload, parse_offload_level(f.offload == "auto" ? "none" : f.offload));
  MEMC_ASSIGN_OR_RETURN(c.options.remat, parse_remat(f.remat == "auto" ? "none" : f.remat));
  if (f.devices > 1 && cmd->count("--shard") == 0) f.shard = "zero1";
  if (f.devices > 1 && f.shard == "none") {
    return Status::BadInput("--shard none with --devices " + std::to_string(f.devices) + ": data parallel shards at least the optimizer (zero1)");
  }
  MEMC_ASSIGN_OR_RETURN(c.options.shard, parse_shard(f.shard, f.devices));
  if (f.devices == 1 && f.shard != "none") return Status::BadInput("--shard " + f.shard + " needs --devices N > 1");
  if (cmd->count("--gpus-per-node") > 0 && c.options.interconnect != "nvlink") {
    return Status::BadInput("--gpus-per-node goes with --interconnect nvlink");
  }
  if (!c.options.interconnect.empty()) MEMC_RETURN_IF_ERROR(target_profile(c.options).status());  // a GPU target, nvlink or ib
  c.search_shard = (budget || c.explain) && f.devices > 1 && cmd->count("--shard") == 0;
  return Status::Ok();
}

CLI::App* add_run_command(CLI::App& app, RunArgs& run) {
  CLI::App* cmd = app.add_subcommand("run", "Train and/or evaluate a plan");
  cmd->add_option("PLAN", run.plan, "Plan from memc compile")->required();
  cmd->add_option("--data", run.options.data, "Training data: .npz (one array per input, y = int64 labels), or a folder of .npy files (x.npy, y.npy, or shards x.K.npy) read a batch at a time");
  cmd->add_option("--eval", run.options.eval, "Evaluation data (.npz or .npy folder), accuracy after training");
  auto* epochs_opt = cmd->add_option("--epochs", run.options.epochs, "Epochs (default: the plan's)")->check(CLI::NonNegativeNumber);
  cmd->add_option("--steps", run.options.steps, "Stop after S optimizer steps")->check(CLI::NonNegativeNumber)->excludes(epochs_opt);
  cmd->add_option("--seed", run.options.seed, "Seed of data order and dropout (default 0)");
  cmd->add_option("--checkpoint", run.options.checkpoint_dir, "Folder for checkpoint.safetensors (each epoch and at the end)");
  cmd->add_flag("--resume", run.options.resume, "Continue from the checkpoint in --checkpoint");
  cmd->add_option("--dump-grads", run.options.dump_grads, "Write the first step's gradients (.npz, by initializer name)");
  cmd->add_option("--json", run.json_report, "Write a JSON report");
  cmd->add_flag("--quiet", run.options.quiet, "No progress line");
  cmd->add_option("--threads", run.threads, "Compute threads for memc and its GEMM libraries (default: the cores it may use)")
      ->check(CLI::PositiveNumber);
  cmd->add_flag("--profile", run.profile, "Time every kernel: print the step's time by category and op (and \"op_profile\" in --json)");
  cmd->add_flag("--tf32", run.options.tf32, "Let f32 GEMMs on CUDA use TF32 (off by default, so fp32 matches the CPU)");
  cmd->add_option("--device", run.options.device,
                  "cpu | cuda | cuda:K (default: cuda when the plan targets a GPU and one is present with every kernel, else cpu)");
  cmd->add_flag("--force", run.force, "Replace existing --json / --dump-grads files (a checkpoint folder follows --resume)");
  return cmd;
}

void add_calibrate_command(CLI::App& app, CalibrateArgs& calibrate) {
  CLI::App* cmd = app.add_subcommand("calibrate", "Measure this machine for the cost model (--target FILE)");
  cmd->add_option("-o,--output", calibrate.output, "Profile file to write (JSON)")->required();
  cmd->add_option("--seconds", calibrate.seconds, "Seconds per probe (default 0.3)");
  cmd->add_option("--device", calibrate.device, "cpu (default), or cuda / cuda:N: measure that GPU through memc's kernels");
  cmd->add_option("--target", calibrate.target,
                  "With a GPU device: the target it measures (a100, h100 or h200); MEMC_GPU_PROFILE=FILE then applies the "
                  "profile to that target");
  cmd->add_flag("--force", calibrate.force, kForceHelp);
}

void add_export_command(CLI::App& app, ExportArgs& export_args) {
  CLI::App* cmd = app.add_subcommand("export", "Write trained weights back into the ONNX model");
  cmd->add_option("PLAN", export_args.plan, "Plan from memc compile")->required();
  cmd->add_option("--weights", export_args.weights, "Checkpoint folder or .safetensors file")->required();
  cmd->add_option("-o,--output", export_args.output, "ONNX file to write")->required();
  cmd->add_flag("--force", export_args.force, kForceHelp);
}

// memc --version: what was built, loading none of it (the CUDA module is only looked for), and
// the CPU kernels this machine runs (from CPUID; oneDNN's as ONEDNN_MAX_CPU_ISA allows).
std::string version_line() {
  const std::string module = cuda::module_path();
  return str_cat("memc ", MEMC_VERSION, " (CPU backend; MPI ranks: ",
#if MEMC_HAVE_MPI
                 "yes",
#else
                 "no",
#endif
                 "; CUDA module: ", module, std::filesystem::exists(module) ? ", opened on the first GPU run)" : ", absent)",
                 "\nCPU kernels here: memc's loops ", cpu::vector_loops_isa(), ", exp/erf/tanh ", cpu::vector_math_isa(), ", oneDNN ",
                 cpu::onednn_isa());
}

// Parses the command line; returns the exit code when parsing already ended the run (help,
// version, a bad flag), else nullopt.
std::optional<int> parse_command_line(CLI::App& app, int argc, char** argv) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return 0;
  } catch (const CLI::CallForVersion&) {
    std::puts(version_line().c_str());
    return 0;
  } catch (const CLI::ParseError& e) {
    // A subcommand's --help arrives as CallForHelp thrown from within that subcommand.
    if (e.get_exit_code() == 0) {
      for (CLI::App* sub : app.get_subcommands({})) {
        if (sub->parsed()) {
          std::fputs(sub->help().c_str(), stdout);
          return 0;
        }
      }
      std::fputs(app.help().c_str(), stdout);
      return 0;
    }
    std::fprintf(stderr, "memc: %s (see memc --help)\n", one_line(e.what()).c_str());
    return 2;
  }
  return std::nullopt;
}

int run_main(int argc, char** argv, const CliHooks& hooks) {
  // An unknown first word is a command typo, not a stray positional.
  if (argc > 1 && argv[1][0] != '-' &&
      std::none_of(std::begin(kCommands), std::end(kCommands), [&](const char* c) { return std::string(argv[1]) == c; })) {
    std::fprintf(stderr, "memc: unknown command '%s' (commands: inspect, infer, compile, run, export, calibrate; see memc --help)\n", argv[1]);
    return 2;
  }
  CLI::App app{"memc: compiles ONNX models into memory-budgeted training plans and runs them.", "memc"};
  app.require_subcommand(1, 1);
  app.fallthrough();  // global flags are accepted after the subcommand too
  int verbose = 0;
  app.add_flag("-v,--verbose", verbose, "More output: -v summary, -vv each decision, -vvv IR");
  app.footer("Exit codes: 0 ok, 2 bad input, 3 budget cannot be met, 1 internal error.");
  app.set_version_flag("--version", std::function<std::string()>(version_line));
  InspectArgs inspect;
  InferArgs infer;
  CompileFlags compile;
  RunArgs run;
  CalibrateArgs calibrate;
  ExportArgs export_args;
  add_inspect_command(app, inspect);
  add_infer_command(app, infer);
  CLI::App* compile_cmd = add_compile_command(app, compile);
  CLI::App* run_cmd = add_run_command(app, run);
  add_export_command(app, export_args);
  add_calibrate_command(app, calibrate);
  if (std::optional<int> done = parse_command_line(app, argc, argv)) return *done;
  set_verbosity(verbose);
  // Before any GEMM: one thread count for every GEMM library, then bound their buffers under
  // `ulimit -v` (runtime/host_memory.h).
  set_compute_threads(run_cmd->parsed() && run.threads > 0           ? run.threads
                      : compile_cmd->parsed() && compile.threads > 0 ? compile.threads
                                                                      : available_cores());
  if (Expected<HostMemory> host = prepare_host_memory(); !host.ok()) return report(host.status());
  if (app.got_subcommand("inspect")) return run_inspect(inspect);
  if (app.got_subcommand("infer")) return run_infer(infer);
  if (compile_cmd->parsed()) {
    if (Status st = finish_compile_flags(compile, compile_cmd); !st.ok()) return report(st);
    return run_compile(compile.args);
  }
  if (run_cmd->parsed()) {
    run.options.on_step = hooks.on_step;
    return run_run(run);
  }
  if (app.got_subcommand("export")) return run_export(export_args);
  if (app.got_subcommand("calibrate")) return run_calibrate(calibrate);
  std::fprintf(stderr, "memc: no command given (see memc --help)\n");
  return 2;
}

}  // namespace

int run_cli(int argc, char** argv, const CliHooks& hooks) {
  try {
    return run_main(argc, argv, hooks);
  } catch (const std::bad_alloc&) {  // exit 1, as when the GEMM buffers do not fit (runtime/host_memory.h)
    struct rlimit limit {};
    if (getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY) {
      std::fprintf(stderr, "memc: out of host memory under the address-space limit (ulimit -v %llu): give memc more\n",
                   static_cast<unsigned long long>(limit.rlim_cur >> 10));
    } else {
      std::fprintf(stderr, "memc: out of host memory\n");
    }
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memc: internal error: %s\n", one_line(e.what()).c_str());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "memc: internal error: unknown exception\n");
    return 1;
  }
}

}  // namespace memc::cli
