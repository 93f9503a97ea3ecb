// Structural and type checks of a Module: every op registered, inputs defined before use in
// schedule order, single definitions, output types equal to what the shape function infers,
// roles consistent. Runs after every pass in tests and debug builds.
#pragma once
#include "ir/graph.h"

namespace memc {

Status verify(const Module& module);

}  // namespace memc
