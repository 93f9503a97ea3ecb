// Formatting and error reporting shared by the subcommands.
#include <cstdio>

#include <filesystem>

#include "frontend/onnx_weights.h"
#include "tools/commands.h"

namespace memc::cli {

int report(const Status& status) {
  if (status.ok()) return 0;
  std::string msg = status.message();
  for (char& c : msg)
    if (c == '\n' || c == '\r') c = ' ';
  std::fprintf(stderr, "memc: %s\n", msg.c_str());
  return status.exit_code();
}

std::vector<std::string> model_files(const std::string& model) {
  std::vector<std::string> files = {model};
  if (!std::filesystem::is_regular_file(model)) return files;
  Expected<std::vector<std::string>> external = onnx_external_data_files(model);
  if (!external.ok()) return files;
  const std::filesystem::path folder = std::filesystem::path(model).parent_path();
  for (const std::string& location : *external) files.push_back((folder / location).string());
  return files;
}

std::string with_commas(int64_t n) {
  std::string digits = std::to_string(n < 0 ? -n : n);
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return n < 0 ? "-" + out : out;
}

namespace {
std::string scaled(double v, const char* const* units, int count, double step) {
  int u = 0;
  while (v >= step && u + 1 < count) {
    v /= step;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.1f %s", v, units[u]);
  return buf;
}
}  // namespace

std::string human_bytes(int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  return scaled(static_cast<double>(bytes), kUnits, 5, 1024.0);
}

std::string human_flops(int64_t flops) {
  static const char* const kUnits[] = {"FLOP", "KFLOP", "MFLOP", "GFLOP", "TFLOP", "PFLOP"};
  return scaled(static_cast<double>(flops), kUnits, 6, 1000.0);
}

}  // namespace memc::cli
