#include "support/size.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

namespace memc {

Expected<int64_t> parse_size(std::string_view text) {
  const std::string original(text);
  size_t i = 0;
  while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || text[i] == '.')) ++i;
  const std::string number(text.substr(0, i));
  std::string unit;
  for (char c : text.substr(i)) unit += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  if (number.empty() || number == "." || std::count(number.begin(), number.end(), '.') > 1) {
    return Status::BadInput("size '" + original + "' is not a number with a unit (e.g. 6GB, 512MiB, 1000000)");
  }
  struct Unit {
    const char* name;
    double bytes;
  };
  static const Unit kUnits[] = {{"", 1}, {"b", 1}, {"kb", 1e3}, {"mb", 1e6}, {"gb", 1e9}, {"tb", 1e12},
                                {"kib", 1024.0}, {"mib", 1048576.0}, {"gib", 1073741824.0}, {"tib", 1099511627776.0}};
  for (const Unit& u : kUnits) {
    if (unit != u.name) continue;
    const double value = std::strtod(number.c_str(), nullptr) * u.bytes;
    if (!std::isfinite(value) || value > 9.0e18) return Status::BadInput("size '" + original + "' is too large");
    // 4.03 × 10⁹ is 4029999999.9999995 in binary floating point: a decimal size within
    // rounding error of a whole number of bytes is that number.
    const double rounded = std::round(value);
    if (std::abs(rounded - value) > 1e-12 * std::max(1.0, value) || (u.bytes == 1 && rounded != value)) {
      return Status::BadInput("size '" + original + "' is not a whole number of bytes");
    }
    return static_cast<int64_t>(rounded);
  }
  return Status::BadInput("size '" + original + "' has an unknown unit (B, KB, MB, GB, TB, KiB, MiB, GiB, TiB)");
}

std::string format_size(int64_t bytes) {
  static const char* kNames[] = {"B", "KB", "MB", "GB", "TB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1000.0 && u < 4) {
    v /= 1000.0;
    ++u;
  }
  char buf[64];
  std::snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.3g %s", v, kNames[u]);
  return buf;
}

}  // namespace memc
