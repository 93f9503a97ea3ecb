// narrow_transposes: transposes move 16-bit values where a cast beside them lets them. A
// transpose of an f32 value that only a cast to bf16 or f16 reads becomes the cast and then the
// transpose (a multi-head attention's projections in bf16-mixed: layernorm, transpose to
// sequence-first, cast for the GEMM); a transpose of a widening cast's result that only it reads
// becomes the transpose and then the cast (their gradients). The copies move half the bytes, and
// a cast lands beside the op that makes or reads its value, where add_layernorm joins it to the
// layernorm. Exact both ways: a transpose moves bits, a cast rounds each element alone. Set for
// GPU targets (planner/compile.cc), before add_layernorm.
#pragma once
#include "passes/pass.h"

namespace memc {

class NarrowTransposes : public Pass {
 public:
  std::string_view name() const override { return "narrow_transposes"; }
  // Statistics: narrowed (casts moved before their transpose), widened (casts moved after it).
  Expected<PassReport> run(Module& step) override;
};

}  // namespace memc
