#include "ir/ops/ops.h"

namespace memc {

void register_all_ops(OpRegistry& r) {
  register_elementwise_ops(r);
  register_linalg_ops(r);
  register_reduce_ops(r);
  register_shape_ops(r);
  register_misc_ops(r);
  register_training_ops(r);
  register_optimizer_ops(r);
  register_collective_ops(r);
  register_gradients(r);
}

Expected<Shape> broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    const int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    const int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1) {
      return Status::BadInput(str_cat("shapes ", shape_str(a), " and ", shape_str(b), " do not broadcast"));
    }
    out[i] = da == 1 ? db : da;
  }
  return out;
}

Status check_shape(const Shape& shape, const char* what) {
  int64_t count = 1;
  for (int64_t d : shape) {
    if (d < 0 || d > kMaxDim) return Status::BadInput(str_cat(what, " dim ", d, " outside [0, 2^40]"));
    if (d != 0 && count > kMaxElements / d) return Status::BadInput(str_cat(what, " [", shape_str(shape), "] has more than 2^48 elements"));
    count *= d;
  }
  return Status::Ok();
}

Status check_small(const std::vector<int64_t>& values, const char* what) {
  for (int64_t v : values) {
    if (v < -kMaxDim || v > kMaxDim) return Status::BadInput(str_cat(what, " value ", v, " outside ±2^40"));
  }
  return Status::Ok();
}

Status check_axes(const std::vector<int64_t>& axes, int64_t rank, const char* what) {
  std::vector<bool> seen(static_cast<size_t>(std::max<int64_t>(rank, 0)), false);
  for (int64_t a : axes) {
    if (a < 0 || a >= rank) return Status::BadInput(str_cat(what, " axis ", a, " out of range for rank ", rank));
    if (seen[a]) return Status::BadInput(str_cat(what, " axis ", a, " repeated"));
    seen[a] = true;
  }
  return Status::Ok();
}

}  // namespace memc
