#include "support/status.h"

namespace memc {

void check_failed(const char* file, int line, const char* cond, const std::string& msg) {
  std::fprintf(stderr, "memc: internal error: %s:%d: check failed: %s%s%s\n", file, line, cond,
               msg.empty() ? "" : ": ", msg.c_str());
  std::abort();
}

}  // namespace memc
