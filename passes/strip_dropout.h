// strip_dropout (--no-dropout): every dropout node becomes its input, i.e. inference semantics,
// for runs that must match a framework whose random masks memc does not reproduce. Runs on the
// forward, before the attention pass, so fused attention carries no dropout either.
#pragma once
#include "passes/pass.h"

namespace memc {

class StripDropout : public Pass {
 public:
  std::string_view name() const override { return "strip_dropout"; }
  // Statistic: removed (dropout nodes replaced by their inputs).
  Expected<PassReport> run(Module& forward) override;
};

}  // namespace memc
