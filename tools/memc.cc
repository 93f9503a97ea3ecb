// The memc command line: argument parsing and dispatch (../shared/CLI.md). The subcommands
// live in tools/<name>.cc. Every failure is one line on stderr and an exit code: 2 for bad
// input (files, flags, data), 3 for an unmet budget, 1 for an internal error.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdio>
#include <exception>
#include <string>

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

constexpr const char* kCommands[] = {"inspect", "infer"};

int run_main(int argc, char** argv) {
  // An unknown first word is a command typo, not a stray positional.
  if (argc > 1 && argv[1][0] != '-' &&
      std::none_of(std::begin(kCommands), std::end(kCommands), [&](const char* c) { return std::string(argv[1]) == c; })) {
    std::fprintf(stderr, "memc: unknown command '%s' (commands: inspect, infer; see memc --help)\n", argv[1]);
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
  inspect_cmd->add_option("MODEL", inspect.model, "ONNX model (.onnx)")->required();
  inspect_cmd->add_option("--batch", inspect.batch, "Batch size for dynamic first dims (default: model's, else 1)")
      ->check(kPositive);
  inspect_cmd->add_option("--seq", inspect.seq, "Sequence length for dynamic token dims")->check(kPositive);
  inspect_cmd->add_flag("--print-ir", inspect.print_ir, "Print the imported IR (MLIR generic syntax)");
  inspect_cmd->add_flag("--json", inspect.json, "Print one JSON object instead of text");

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
      for (CLI::App* sub : {inspect_cmd, infer_cmd}) {
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
  if (inspect_cmd->parsed()) return run_inspect(inspect);
  if (infer_cmd->parsed()) return run_infer(infer);
  std::fprintf(stderr, "memc: no command given (see memc --help)\n");
  return 2;
}

}  // namespace
}  // namespace memc::cli

int main(int argc, char** argv) {
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
