// One verbosity ladder shared by every component: -v summary, -vv each decision, -vvv IR.
#pragma once
#include <cstdio>
#include <string>

namespace memc {

int verbosity();
void set_verbosity(int level);
// Prints "memc: <msg>" to stderr when the ladder is at `level` or above.
void log(int level, const std::string& msg);
void warn(const std::string& msg);

}  // namespace memc
