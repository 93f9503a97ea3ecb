// The memc command line: argument parsing and dispatch (../shared/CLI.md). The subcommands
// live in tools/<name>.cc. Every failure is one line on stderr and an exit code: 2 for bad
// input (files, flags, data), 3 for an unmet budget, 1 for an internal error.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <exception>
#include <string>

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

int run_main(int argc, char** argv) {
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

  InspectArgs inspect;
  CLI::App* inspect_cmd = app.add_subcommand("inspect", "Describe a model: inputs, outputs, ops, parameters, FLOPs");
  inspect_cmd->add_option("MODEL", inspect.model, "ONNX model (.onnx) or plan from memc compile")->required();
  inspect_cmd->add_option("--batch", inspect.batch, "Batch size for dynamic first dims (default: model's, else 1)")
      ->check(kPositive);
  inspect_cmd->add_option("--seq", inspect.seq, "Sequence length for dynamic token dims")->check(kPositive);
  inspect_cmd->add_flag("--print-ir", inspect.print_ir, "Print the imported IR (MLIR generic syntax)");
  inspect_cmd->add_flag("--json", inspect.json, "Print one JSON object instead of text");
  inspect_cmd->add_option("--timeline", inspect.timeline, "Plans: write the memory timeline (one self-contained HTML page)");
  inspect_cmd->add_flag("--force", inspect.force, kForceHelp);

  InferArgs infer;
  CLI::App* infer_cmd = app.add_subcommand("infer", "Run a forward pass on inputs from an .npz file");
  infer_cmd->add_option("MODEL", infer.model, "ONNX model with weights (.onnx)")->required();
  infer_cmd->add_option("--input", infer.input, "Inputs (.npz), keyed by graph input name ('x' for one input)")
      ->required();
  infer_cmd->add_option("-o,--output", infer.output, "Outputs (.npz), keyed by graph output name")->required();
  infer_cmd->add_option("--batch", infer.batch, "Batch size (default: first dim of the input arrays)")
      ->check(kPositive);
  infer_cmd->add_option("--seq", infer.seq, "Sequence length (default: second dim of rank-2 inputs)")
      ->check(kPositive);
  infer_cmd->add_flag("--print", infer.print, "Print each output's argmax per row (the predicted class)");
  infer_cmd->add_flag("--force", infer.force, kForceHelp);

  CompileArgs compile;
  CLI::App* compile_cmd = app.add_subcommand("compile", "Build a training plan: loss, autodiff, optimizer, schedule");
  compile_cmd->add_option("MODEL", compile.model, "ONNX model (.onnx; a skeleton is enough)")->required();
  compile_cmd->add_option("--batch", compile.options.batch, "Batch size")->required()->check(kPositive);
  compile_cmd->add_option("-o,--output", compile.output, "Plan file to write")->required();
  compile_cmd->add_option("--seq", compile.options.seq, "Sequence length for dynamic token dims")->check(kPositive);
  compile_cmd->add_option("--loss", compile.loss, "Loss: cross_entropy (softmax cross-entropy on integer labels)");
  compile_cmd->add_option("--optimizer", compile.options.optimizer.kind,
                          "sgd | momentum | adam | adamw (default) | adam8bit (AdamW, 8-bit block-wise moments) | adafactor (factored "
                          "second moment); the budget search never changes it")
      ->check(CLI::IsMember({"sgd", "momentum", "adam", "adamw", "adam8bit", "adafactor"}));
  compile_cmd->add_option("--lr", compile.schedule.lr, "Peak learning rate (default 1e-3)")->check(kNonNegative);
  double weight_decay = -1;
  compile_cmd->add_option("--weight-decay", weight_decay, "Weight decay (default 0.01 for adamw, else 0)")->check(kNonNegative);
  compile_cmd->add_option("--momentum", compile.options.optimizer.momentum, "Momentum for --optimizer momentum (default 0.9)")
      ->check(kNonNegative);
  compile_cmd->add_flag("--nesterov", compile.options.optimizer.nesterov, "Nesterov momentum");
  compile_cmd->add_option("--schedule", compile.schedule.kind, "constant | cosine | warmup-cosine (default constant)");
  compile_cmd->add_option("--warmup-steps", compile.schedule.warmup_steps, "Linear warm-up steps for warmup-cosine")
      ->check(CLI::NonNegativeNumber);
  compile_cmd->add_option("--clip-grad-norm", compile.options.optimizer.clip_grad_norm, "Clip the global gradient norm to F (0: off)")
      ->check(kNonNegative);
  compile_cmd->add_option("--epochs", compile.options.epochs, "Epochs (the cosine horizon; memc run's default)")->check(kPositive);
  compile_cmd->add_option("--steps-per-epoch", compile.options.steps_per_epoch, "Cap on steps per epoch (default: the data's)")
      ->check(kPositive);
  compile_cmd->add_option("--budget", compile.budget, "Device memory the plan may use: 6GB, 6GiB, 512MiB, bytes (exit 3 if unmet)");
  compile_cmd->add_option("--precision", compile.options.precision,
                          "fp32 (default) | bf16-mixed | fp16-mixed (dynamic loss scaling) | bf16-true | fp16-true | auto (with --budget: "
                          "searched unless given)");
  compile_cmd->add_option("--target", compile.options.target, "Device of the step-time estimate: cpu (default), a100, h100, h200, or a "
                                                             "profile file from memc calibrate");
  compile_cmd->add_flag("--explain", compile.explain, "Show the technique ladder and the Pareto front of (peak, step time)");
  compile_cmd->add_option("--micro-batches", compile.options.micro_batches,
                          "Split each batch into K micro-batches and accumulate gradients (default 1)")
      ->check(kPositive);
  compile_cmd->add_option("--attention", compile.options.attention,
                          "tiled (default: memory-efficient attention, the score matrix never stored) | naive (as exported)")
      ->check(CLI::IsMember({"tiled", "naive"}));
  compile_cmd->add_flag("--print-ir-after-all", compile.print_ir_after_all, "Print the IR after each pass (stderr)");
  compile_cmd->add_option("--print-ir-after", compile.print_ir_after, "Print the IR after PASS: import, attention, precision, training_step, offload, schedule");
  compile_cmd->add_option("--dump-dir", compile.dump_dir, "Write the IR after each pass as DIR/NN-pass.mlir");
  compile_cmd->add_option("--offload", compile.options.offload,
                          "none (default) | optimizer: optimizer state (and master weights under mixed precision) in host memory, "
                          "updated on the host | auto (with --budget: searched unless given)")
      ->check(CLI::IsMember({"none", "optimizer", "auto"}));
  int64_t compile_threads = 0;
  compile_cmd->add_option("--threads", compile_threads,
                          "Compute threads to size the CPU kernels' workspaces for; memc run uses no more by default "
                          "(default: the cores it may use)")
      ->check(CLI::PositiveNumber);
  int64_t devices = 1;
  std::string shard = "none";
  compile_cmd->add_option("--devices", devices, "Data-parallel ranks (run the plan with mpirun -np N); --batch is their global batch")
      ->check(kPositive);
  compile_cmd->add_option("--shard", shard,
                          "With --devices N: zero1 (default: optimizer states split N ways, gradients all-reduced) | zero2 (gradients "
                          "reduce-scattered per unit as well) | none (one device only)");
  std::string remat = "none";
  compile_cmd->add_option("--remat", remat,
                          "Recompute activations in backward: none (default) | blocks (checkpoint each block) | SIZE (hold at most "
                          "SIZE of saved activations and checkpoints from forward to backward; the segment being backpropagated "
                          "comes on top) | auto (with --budget) | a comma list adding save=NAME / recompute=NAME pins");
  bool no_dropout = false;
  compile_cmd->add_flag("--no-dropout", no_dropout, "Turn dropout into identity (for exact comparisons with another framework)");
  compile_cmd->add_flag("--print-ir", compile.print_ir, "Print the training step's IR");
  compile_cmd->add_flag("--json", compile.json, "Print a JSON summary");
  compile_cmd->add_flag("--force", compile.force, kForceHelp);

  RunArgs run;
  CLI::App* run_cmd = app.add_subcommand("run", "Train and/or evaluate a plan");
  run_cmd->add_option("PLAN", run.plan, "Plan from memc compile")->required();
  run_cmd->add_option("--data", run.options.data, "Training data (.npz: one array per input, y = int64 labels)");
  run_cmd->add_option("--eval", run.options.eval, "Evaluation data (.npz), accuracy after training");
  auto* epochs_opt = run_cmd->add_option("--epochs", run.options.epochs, "Epochs (default: the plan's)")->check(CLI::NonNegativeNumber);
  run_cmd->add_option("--steps", run.options.steps, "Stop after S optimizer steps")->check(CLI::NonNegativeNumber)->excludes(epochs_opt);
  run_cmd->add_option("--seed", run.options.seed, "Seed of data order and dropout (default 0)");
  run_cmd->add_option("--checkpoint", run.options.checkpoint_dir, "Folder for checkpoint.safetensors (each epoch and at the end)");
  run_cmd->add_flag("--resume", run.options.resume, "Continue from the checkpoint in --checkpoint");
  run_cmd->add_option("--dump-grads", run.options.dump_grads, "Write the first step's gradients (.npz, by initializer name)");
  run_cmd->add_option("--json", run.json_report, "Write a JSON report");
  run_cmd->add_flag("--quiet", run.options.quiet, "No progress line");
  run_cmd->add_option("--threads", run.threads, "Compute threads for memc and its GEMM libraries (default: the cores it may use)")
      ->check(CLI::PositiveNumber);
  run_cmd->add_flag("--profile", run.profile, "Time every kernel: print the step's time by category and op (and \"op_profile\" in --json)");
  run_cmd->add_flag("--tf32", run.options.tf32, "Let f32 GEMMs on CUDA use TF32 (off by default, so fp32 matches the CPU)");
  run_cmd->add_option("--device", run.options.device,
                      "cpu | cuda | cuda:K (default: cuda when the plan targets a GPU and one is present with every kernel, else cpu)");
  run_cmd->add_flag("--force", run.force, "Replace existing --json / --dump-grads files (a checkpoint folder follows --resume)");

  CalibrateArgs calibrate;
  CLI::App* calibrate_cmd = app.add_subcommand("calibrate", "Measure this machine for the cost model (--target FILE)");
  calibrate_cmd->add_option("-o,--output", calibrate.output, "Profile file to write (JSON)")->required();
  calibrate_cmd->add_option("--seconds", calibrate.seconds, "Seconds per probe (default 0.3)");
  calibrate_cmd->add_flag("--force", calibrate.force, kForceHelp);

  ExportArgs export_args;
  CLI::App* export_cmd = app.add_subcommand("export", "Write trained weights back into the ONNX model");
  export_cmd->add_option("PLAN", export_args.plan, "Plan from memc compile")->required();
  export_cmd->add_option("--weights", export_args.weights, "Checkpoint folder or .safetensors file")->required();
  export_cmd->add_option("-o,--output", export_args.output, "ONNX file to write")->required();
  export_cmd->add_flag("--force", export_args.force, kForceHelp);

  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::fputs(app.help().c_str(), stdout);
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::fputs(app.help("", CLI::AppFormatMode::All).c_str(), stdout);
    return 0;
  } catch (const CLI::CallForVersion&) {
    std::puts("memc 0.1");
    return 0;
  } catch (const CLI::ParseError& e) {
    // A subcommand's --help arrives as CallForHelp thrown from within that subcommand.
    if (e.get_exit_code() == 0) {
      for (CLI::App* sub : {inspect_cmd, infer_cmd, compile_cmd, run_cmd, export_cmd, calibrate_cmd}) {
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
  set_verbosity(verbose);
  // Before any GEMM: one thread count for every GEMM library, then bound their buffers under
  // `ulimit -v` (runtime/host_memory.h).
  set_compute_threads(run_cmd->parsed() && run.threads > 0           ? run.threads
                      : compile_cmd->parsed() && compile_threads > 0 ? compile_threads
                                                                      : available_cores());
  if (Expected<HostMemory> host = prepare_host_memory(); !host.ok()) return report(host.status());
  if (inspect_cmd->parsed()) return run_inspect(inspect);
  if (infer_cmd->parsed()) return run_infer(infer);
  if (compile_cmd->parsed()) {
    compile.options.optimizer.weight_decay = weight_decay >= 0 ? weight_decay : ((compile.options.optimizer.kind == "adamw" || compile.options.optimizer.kind == "adam8bit") ? 0.01 : 0.0);
    compile.options.dropout = !no_dropout;
    // With --budget, each decision not given on the command line (or given as auto) is searched.
    const bool budget = !compile.budget.empty();
    compile.search.precision = compile.options.precision == "auto" || (budget && compile_cmd->count("--precision") == 0);
    compile.search.micro_batches = budget && compile_cmd->count("--micro-batches") == 0;
    compile.search.remat = remat == "auto" || (budget && compile_cmd->count("--remat") == 0);
    compile.search.attention = budget && compile_cmd->count("--attention") == 0;
    compile.search.offload = compile.options.offload == "auto" || (budget && compile_cmd->count("--offload") == 0);
    if (compile.options.offload == "auto") compile.options.offload = "none", compile.auto_requested = true;
    compile.auto_requested = compile.auto_requested || compile.options.precision == "auto" || remat == "auto";
    if (compile.options.precision == "auto") compile.options.precision = "fp32";
    if (remat == "auto") remat = "none";
    auto parsed = parse_remat(remat);
    if (!parsed.ok()) {
      std::fprintf(stderr, "memc: %s\n", parsed.status().message().c_str());
      return 2;
    }
    compile.options.remat = *parsed;
    if (devices > 1 && compile_cmd->count("--shard") == 0) shard = "zero1";
    if (devices > 1 && shard == "none") return report(Status::BadInput("--shard none with --devices " + std::to_string(devices) + ": data parallel shards at least the optimizer (zero1)"));
    auto sharding = parse_shard(shard, devices);
    if (!sharding.ok()) return report(sharding.status());
    if (devices == 1 && shard != "none") return report(Status::BadInput("--shard " + shard + " needs --devices N > 1"));
    compile.options.shard = *sharding;
    compile.search_shard = budget && devices > 1 && compile_cmd->count("--shard") == 0;
    // zero3 runs one micro-batch per step (passes/shard.h): the search keeps it that way.
    if (sharding->stage == ShardStage::kZero3) compile.search.micro_batches = false;
    return run_compile(compile);
  }
  if (run_cmd->parsed()) return run_run(run);
  if (export_cmd->parsed()) return run_export(export_args);
  if (calibrate_cmd->parsed()) return run_calibrate(calibrate);
  std::fprintf(stderr, "memc: no command given (see memc --help)\n");
  return 2;
}

}  // namespace
}  // namespace memc::cli

extern "C" void memc_preinit_anchor();  // tools/preinit.cc: runs before OpenBLAS starts its threads

int main(int argc, char** argv) {
  memc_preinit_anchor();
  try {
    return memc::cli::run_main(argc, argv);
  } catch (const std::bad_alloc&) {
    std::fprintf(stderr, "memc: out of host memory\n");
    return 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "memc: internal error: %s\n", memc::cli::one_line(e.what()).c_str());
    return 1;
  } catch (...) {
    std::fprintf(stderr, "memc: internal error: unknown exception\n");
    return 1;
  }
}
