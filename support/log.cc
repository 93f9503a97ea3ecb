#include "support/log.h"

namespace memc {
namespace {
int g_verbosity = 0;
}

int verbosity() { return g_verbosity; }
void set_verbosity(int level) { g_verbosity = level; }

void log(int level, const std::string& msg) {
  if (g_verbosity >= level) std::fprintf(stderr, "memc: %s\n", msg.c_str());
}

void warn(const std::string& msg) { std::fprintf(stderr, "memc: warning: %s\n", msg.c_str()); }

}  // namespace memc
