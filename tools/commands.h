// The subcommands of the memc CLI (../shared/CLI.md). Each returns the process exit status
// (0 ok, 2 bad input, 3 budget, 1 internal) and prints its own one-line errors via report().
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "planner/compile.h"
#include "planner/search.h"
#include "runtime/trainer.h"
#include "support/status.h"

namespace memc::cli {

// The whole command line: parses argv (argv[0] is the program) and runs the subcommand; the exit
// status of ../shared/CLI.md, errors as one line on stderr, never an exception. The memc
// executable's main, and the Python package's way to every CLI option (python/memc_ext.cc).
// `hooks` reach what the command line cannot carry: a caller's code called during a run.
struct CliHooks {
  std::function<bool(int64_t step, double loss)> on_step;  // RunOptions::on_step of `memc run`
};
int run_cli(int argc, char** argv, const CliHooks& hooks = {});

struct InspectArgs {
  std::string model;
  int64_t batch = -1;
  int64_t seq = -1;
  bool print_ir = false;
  bool json = false;
  std::string timeline;  // plans only: write the memory timeline page here
  bool force = false;    // replace an existing --timeline file
};

struct InferArgs {
  std::string model;
  std::string input;
  std::string output;
  int64_t batch = -1;
  int64_t seq = -1;
  bool print = false;  // argmax per row of each output
  bool force = false;  // replace an existing output
};

struct CompileArgs {
  std::string model;
  std::string output;
  std::string loss = "cross_entropy";
  CompileOptions options;
  ScheduleOptions schedule;
  std::string budget;  // as spelled: 6GB, 6GiB, ...
  bool print_ir = false;
  bool json = false;
  bool print_ir_after_all = false;  // each pass's output IR on stderr
  std::string print_ir_after;       // only this pass's
  std::string dump_dir;             // each pass's output IR as DIR/NN-pass.mlir
  bool explain = false;             // the ladder and the Pareto front of the search
  SearchSpace search;               // what the budget search may choose (the rest is pinned)
  bool search_shard = false;        // --devices N with --budget and no --shard: zero1/2/3 searched too
  bool auto_requested = false;      // some decision was spelled "auto"
  bool force = false;               // replace an existing plan file
};

struct RunArgs {
  std::string plan;
  RunOptions options;
  std::string json_report;
  int64_t threads = 0;  // compute threads (0: the cores this process may use)
  bool profile = false;  // time every kernel: a table by category and op, and "op_profile" in --json
  bool force = false;  // replace existing --json / --dump-grads files
};

struct ExportArgs {
  std::string plan;
  std::string weights;  // checkpoint folder or .safetensors file
  std::string output;
  bool force = false;
};

int run_inspect(const InspectArgs& args);
int run_compile(const CompileArgs& args);
int run_run(const RunArgs& args);
int run_export(const ExportArgs& args);

struct CalibrateArgs {
  std::string output;
  double seconds = 0.3;  // per probe
  bool force = false;
  std::string device = "cpu";  // cpu, cuda or cuda:N
  std::string target;          // with a GPU device: the data sheet it measures (a100, h100, h200)
};
int run_calibrate(const CalibrateArgs& args);
// `memc inspect PLAN`
int run_inspect_plan(const std::string& path, bool as_json, bool print_ir, const std::string& timeline = "", bool force = false);
int run_infer(const InferArgs& args);

// The files an ONNX model's weights come from: the model and its external data (what the
// importer will read; a model that does not parse yields itself only).
std::vector<std::string> model_files(const std::string& model);

// Prints "memc: <message>" (one line) on stderr and returns the status's exit code.
int report(const Status& status);

// "86,567,656"; "330.2 MiB"; "17.6 GFLOP".
std::string with_commas(int64_t n);
std::string human_bytes(int64_t bytes);
std::string human_flops(int64_t flops);

}  // namespace memc::cli
