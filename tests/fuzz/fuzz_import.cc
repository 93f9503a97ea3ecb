// libFuzzer target for the ONNX importer (scripts/fuzz.sh): any bytes must give a Module or a
// Status, never a crash. Imports with and without weights; small successful imports are
// verified and printed, and the printed IR must parse back to the same text.
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "frontend/onnx_import.h"
#include "ir/printer.h"
#include "ir/verifier.h"
#include "support/log.h"

namespace {

// Keeps one input cheap: the fuzzer is after crashes, not big graphs.
constexpr size_t kMaxNodesToPrint = 2000;

void check_module(const memc::Module& module) {
  if (module.nodes().size() > kMaxNodesToPrint) return;
  const memc::Status verified = memc::verify(module);
  if (!verified.ok()) __builtin_trap();  // the importer produced an invalid module
  const std::string text = memc::print_module(module);
  auto parsed = memc::parse_module(text);
  if (!parsed.ok() || memc::print_module(*parsed) != text) __builtin_trap();  // round trip broken
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const bool quiet = (memc::set_verbosity(-1), true);
  (void)quiet;
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  for (bool load_weights : {false, true}) {
    memc::ImportOptions options;
    options.batch = 2;
    options.seq = 4;
    options.load_weights = load_weights;
    // External data must not be reachable from fuzz inputs: a base dir that does not exist.
    auto module = memc::import_onnx_bytes(bytes, "/nonexistent-memc-fuzz", options, "fuzz.onnx");
    if (module.ok()) check_module(*module);
  }
  return 0;
}
