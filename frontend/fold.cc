#include "frontend/fold.h"

#include <cmath>
#include <limits>
#include <set>

namespace memc {
namespace {

// Element i of t as int64 (floats saturate, NaN → 0) or as double.
int64_t get_int(const Tensor& t, int64_t i) {
  if (!is_float(t.dtype())) return t.get_as_int(i);
  const double d = t.get_as_double(i);
  if (std::isnan(d)) return 0;
  if (d >= 9.2e18) return std::numeric_limits<int64_t>::max();
  if (d <= -9.2e18) return std::numeric_limits<int64_t>::min();
  return static_cast<int64_t>(d);
}
double get_double(const Tensor& t, int64_t i) { return t.get_as_double(i); }

void set_int(Tensor& t, int64_t i, int64_t v) {
  switch (t.dtype()) {
    case DType::kI64: t.data<int64_t>()[i] = v; return;
    case DType::kI32: t.data<int32_t>()[i] = static_cast<int32_t>(v); return;
    case DType::kBool: t.data<bool>()[i] = v != 0; return;
    case DType::kU8: t.data<uint8_t>()[i] = static_cast<uint8_t>(v); return;
    default: t.set_from_double(i, static_cast<double>(v));
  }
}
void set_double(Tensor& t, int64_t i, double v) {
  if (is_float(t.dtype())) {
    t.set_from_double(i, v);
    return;
  }
  if (std::isnan(v)) v = 0;
  v = std::max(-9.2e18, std::min(9.2e18, v));
  set_int(t, i, static_cast<int64_t>(v));
}
// Copies element src[i] into dst[j] (same dtype).
void copy_elem(const Tensor& src, int64_t i, Tensor& dst, int64_t j) {
  const size_t size = dtype_size(src.dtype());
  std::memcpy(static_cast<char*>(dst.raw()) + j * size, static_cast<const char*>(src.raw()) + i * size, size);
}

// For each element of `out`, the flat index of the broadcast element of `in`.
std::vector<int64_t> broadcast_map(const Shape& in, const Shape& out) {
  const int64_t n = numel(out);
  std::vector<int64_t> map(n, 0);
  const size_t rank = out.size(), offset = rank - in.size();
  std::vector<int64_t> in_strides(rank, 0);
  int64_t stride = 1;
  for (size_t d = rank; d-- > offset;) {
    const int64_t dim = in[d - offset];
    in_strides[d] = dim == 1 ? 0 : stride;
    stride *= dim;
  }
  std::vector<int64_t> index(rank, 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t flat = 0;
    for (size_t d = 0; d < rank; ++d) flat += index[d] * in_strides[d];
    map[i] = flat;
    for (size_t d = rank; d-- > 0;) {
      if (++index[d] < out[d]) break;
      index[d] = 0;
    }
  }
  return map;
}

// Wrapping integer arithmetic: no signed-overflow UB on hostile inputs.
int64_t wrap_add(int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b)); }
int64_t wrap_sub(int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<uint64_t>(a) - static_cast<uint64_t>(b)); }
int64_t wrap_mul(int64_t a, int64_t b) { return static_cast<int64_t>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b)); }

Status int_binary(const std::string& op, int64_t a, int64_t b, int64_t fmod, int64_t& r) {
  if (op == "add") r = wrap_add(a, b);
  else if (op == "sub") r = wrap_sub(a, b);
  else if (op == "mul") r = wrap_mul(a, b);
  else if (op == "div" || op == "mod") {
    if (b == 0) return Status::BadInput("integer division by zero");
    if (b == -1) {
      r = op == "div" ? wrap_sub(0, a) : 0;
      return Status::Ok();
    }
    if (op == "div") r = a / b;
    else {
      r = a % b;
      if (!fmod && r != 0 && ((r < 0) != (b < 0))) r += b;  // Python-style: sign of the divisor
    }
  } else if (op == "pow") {
    if (b < 0) r = (a == 1) ? 1 : 0;
    else {
      r = 1;
      for (int64_t k = 0; k < b && k < 64; ++k) r = wrap_mul(r, a);
    }
  } else if (op == "max") r = std::max(a, b);
  else if (op == "min") r = std::min(a, b);
  else if (op == "equal") r = a == b;
  else if (op == "less") r = a < b;
  else if (op == "less_equal") r = a <= b;
  else if (op == "greater") r = a > b;
  else if (op == "greater_equal") r = a >= b;
  else if (op == "and") r = (a != 0) && (b != 0);
  else if (op == "or") r = (a != 0) || (b != 0);
  else if (op == "xor") r = (a != 0) != (b != 0);
  else return Status::BadInput("no fold rule");
  return Status::Ok();
}

Status float_binary(const std::string& op, double a, double b, int64_t fmod, double& r) {
  if (op == "add") r = a + b;
  else if (op == "sub") r = a - b;
  else if (op == "mul") r = a * b;
  else if (op == "div") r = a / b;
  else if (op == "pow") r = std::pow(a, b);
  else if (op == "max") r = std::max(a, b);
  else if (op == "min") r = std::min(a, b);
  else if (op == "mod") {
    r = std::fmod(a, b);
    if (!fmod && r != 0 && ((r < 0) != (b < 0))) r += b;
  } else if (op == "equal") r = a == b;
  else if (op == "less") r = a < b;
  else if (op == "less_equal") r = a <= b;
  else if (op == "greater") r = a > b;
  else if (op == "greater_equal") r = a >= b;
  else return Status::BadInput("no fold rule");
  return Status::Ok();
}

Status fold_binary(const Node& node, const Tensor& a, const Tensor& b, Tensor& out) {
  const auto ma = broadcast_map(a.shape(), out.shape()), mb = broadcast_map(b.shape(), out.shape());
  const int64_t fmod = node.attrs.get_int("fmod", 0);
  const bool integer = !is_float(a.dtype());
  for (int64_t i = 0; i < out.numel(); ++i) {
    if (integer) {
      int64_t r = 0;
      MEMC_RETURN_IF_ERROR(int_binary(node.op, get_int(a, ma[i]), get_int(b, mb[i]), fmod, r));
      set_int(out, i, r);
    } else {
      double r = 0;
      MEMC_RETURN_IF_ERROR(float_binary(node.op, get_double(a, ma[i]), get_double(b, mb[i]), fmod, r));
      set_double(out, i, r);
    }
  }
  return Status::Ok();
}

Status fold_unary(const Node& node, const Tensor& x, Tensor& out) {
  const std::string& op = node.op;
  for (int64_t i = 0; i < out.numel(); ++i) {
    if (!is_float(x.dtype())) {
      const int64_t v = get_int(x, i);
      int64_t r;
      if (op == "neg") r = wrap_sub(0, v);
      else if (op == "abs") r = v < 0 ? wrap_sub(0, v) : v;
      else if (op == "sign") r = (v > 0) - (v < 0);
      else if (op == "relu") r = std::max<int64_t>(v, 0);
      else if (op == "not") r = v == 0;
      else return Status::BadInput("no fold rule");
      set_int(out, i, r);
      continue;
    }
    const double v = get_double(x, i);
    double r;
    if (op == "neg") r = -v;
    else if (op == "abs") r = std::abs(v);
    else if (op == "sign") r = (v > 0) - (v < 0);
    else if (op == "exp") r = std::exp(v);
    else if (op == "log") r = std::log(v);
    else if (op == "sqrt") r = std::sqrt(v);
    else if (op == "rsqrt") r = 1.0 / std::sqrt(v);
    else if (op == "reciprocal") r = 1.0 / v;
    else if (op == "tanh") r = std::tanh(v);
    else if (op == "sigmoid") r = 1.0 / (1.0 + std::exp(-v));
    else if (op == "relu") r = std::max(v, 0.0);
    else if (op == "erf") r = std::erf(v);
    else if (op == "floor") r = std::floor(v);
    else if (op == "ceil") r = std::ceil(v);
    else if (op == "round") r = std::nearbyint(v);
    else if (op == "sin") r = std::sin(v);
    else if (op == "cos") r = std::cos(v);
    else return Status::BadInput("no fold rule");
    set_double(out, i, r);
  }
  return Status::Ok();
}

// Visits every output index of a row-major shape.
template <typename Fn>
void for_each_index(const Shape& shape, Fn&& fn) {
  const int64_t n = numel(shape);
  std::vector<int64_t> index(shape.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    fn(i, index);
    for (size_t d = shape.size(); d-- > 0;) {
      if (++index[d] < shape[d]) break;
      index[d] = 0;
    }
  }
}

int64_t flat_of(const std::vector<int64_t>& index, const std::vector<int64_t>& strides) {
  int64_t flat = 0;
  for (size_t d = 0; d < index.size(); ++d) flat += index[d] * strides[d];
  return flat;
}

Status fold_data_movement(const Node& node, const std::vector<const Tensor*>& in, Tensor& out) {
  const std::string& op = node.op;
  const Tensor& x = *in[0];
  if (op == "reshape" || op == "copy") {
    for (int64_t i = 0; i < out.numel(); ++i) copy_elem(x, i, out, i);
  } else if (op == "expand") {
    const auto map = broadcast_map(x.shape(), out.shape());
    for (int64_t i = 0; i < out.numel(); ++i) copy_elem(x, map[i], out, i);
  } else if (op == "transpose") {
    const auto perm = node.attrs.get_ints("perm");
    const auto strides = row_major_strides(x.shape());
    for_each_index(out.shape(), [&](int64_t i, const std::vector<int64_t>& idx) {
      int64_t flat = 0;
      for (size_t d = 0; d < idx.size(); ++d) flat += idx[d] * strides[perm[d]];
      copy_elem(x, flat, out, i);
    });
  } else if (op == "slice") {
    const auto axes = node.attrs.get_ints("axes"), starts = node.attrs.get_ints("starts"),
               steps = node.attrs.get_ints("steps");
    std::vector<int64_t> start(x.rank(), 0), step(x.rank(), 1);
    for (size_t k = 0; k < axes.size(); ++k) {
      start[axes[k]] = starts[k];
      step[axes[k]] = steps[k];
    }
    const auto strides = row_major_strides(x.shape());
    for_each_index(out.shape(), [&](int64_t i, const std::vector<int64_t>& idx) {
      int64_t flat = 0;
      for (size_t d = 0; d < idx.size(); ++d) flat += (start[d] + idx[d] * step[d]) * strides[d];
      copy_elem(x, flat, out, i);
    });
  } else if (op == "concat") {
    const int64_t axis = node.attrs.get_int("axis", 0);
    const auto out_strides = row_major_strides(out.shape());
    int64_t offset = 0;
    for (const Tensor* t : in) {
      for_each_index(t->shape(), [&](int64_t i, const std::vector<int64_t>& idx) {
        std::vector<int64_t> o = idx;
        o[axis] += offset;
        copy_elem(*t, i, out, flat_of(o, out_strides));
      });
      offset += t->shape()[axis];
    }
  } else if (op == "gather") {
    const int64_t axis = node.attrs.get_int("axis", 0);
    const Tensor& idx_t = *in[1];
    const int64_t dim = x.shape()[axis];
    const int64_t inner = numel(Shape(x.shape().begin() + axis + 1, x.shape().end()));
    const int64_t outer = numel(Shape(x.shape().begin(), x.shape().begin() + axis));
    const int64_t count = idx_t.numel();
    for (int64_t o = 0; o < outer; ++o) {
      for (int64_t k = 0; k < count; ++k) {
        int64_t j = get_int(idx_t, k);
        if (j < 0) j += dim;
        if (j < 0 || j >= dim) return Status::BadInput(str_cat("gather index ", get_int(idx_t, k), " outside dim ", dim));
        for (int64_t r = 0; r < inner; ++r) copy_elem(x, (o * dim + j) * inner + r, out, (o * count + k) * inner + r);
      }
    }
  } else if (op == "tile") {
    const auto strides = row_major_strides(x.shape());
    for_each_index(out.shape(), [&](int64_t i, const std::vector<int64_t>& idx) {
      int64_t flat = 0;
      for (size_t d = 0; d < idx.size(); ++d) flat += (idx[d] % x.shape()[d]) * strides[d];
      copy_elem(x, flat, out, i);
    });
  } else if (op == "where") {
    const auto mc = broadcast_map(in[0]->shape(), out.shape()), ma = broadcast_map(in[1]->shape(), out.shape()),
               mb = broadcast_map(in[2]->shape(), out.shape());
    for (int64_t i = 0; i < out.numel(); ++i) {
      if (get_int(*in[0], mc[i])) copy_elem(*in[1], ma[i], out, i);
      else copy_elem(*in[2], mb[i], out, i);
    }
  } else if (op == "cast") {
    for (int64_t i = 0; i < out.numel(); ++i) {
      if (is_float(x.dtype()) && is_float(out.dtype())) set_double(out, i, get_double(x, i));
      else if (is_float(x.dtype())) set_double(out, i, out.dtype() == DType::kBool ? (get_double(x, i) != 0) : get_double(x, i));
      else set_int(out, i, get_int(x, i));
    }
  } else {
    return Status::BadInput("no fold rule");
  }
  return Status::Ok();
}

Status fold_reduce(const Node& node, const Tensor& x, Tensor& out) {
  auto axes = node.attrs.get_ints("axes");
  std::set<int64_t> reduced(axes.begin(), axes.end());
  if (axes.empty()) for (int64_t d = 0; d < x.rank(); ++d) reduced.insert(d);
  // Output index (keepdims layout) for every input element.
  Shape kept = x.shape();
  for (int64_t d : reduced) kept[d] = 1;
  const auto kept_strides = row_major_strides(kept);
  const int64_t n_out = numel(kept);
  const std::string& op = node.op;
  std::vector<double> acc(n_out, op == "reduce_prod" ? 1.0 : (op == "reduce_max" ? -INFINITY : (op == "reduce_min" ? INFINITY : 0.0)));
  if (op != "reduce_sum" && op != "reduce_prod" && op != "reduce_max" && op != "reduce_min" && op != "reduce_mean") {
    return Status::BadInput("no fold rule");
  }
  for_each_index(x.shape(), [&](int64_t i, const std::vector<int64_t>& idx) {
    std::vector<int64_t> o = idx;
    for (int64_t d : reduced) o[d] = 0;
    double& a = acc[flat_of(o, kept_strides)];
    const double v = get_double(x, i);
    if (op == "reduce_sum" || op == "reduce_mean") a += v;
    else if (op == "reduce_prod") a *= v;
    else if (op == "reduce_max") a = std::max(a, v);
    else a = std::min(a, v);
  });
  const double count = n_out ? static_cast<double>(x.numel()) / static_cast<double>(n_out) : 1.0;
  for (int64_t i = 0; i < n_out; ++i) set_double(out, i, op == "reduce_mean" ? acc[i] / count : acc[i]);
  return Status::Ok();
}

const std::set<std::string>& binary_ops() {
  static const std::set<std::string> ops = {"add", "sub", "mul", "div", "pow", "max", "min", "mod", "equal",
                                            "less", "less_equal", "greater", "greater_equal", "and", "or", "xor"};
  return ops;
}

}  // namespace

Expected<std::vector<Tensor>> fold_node(const Node& node, const std::vector<const Tensor*>& inputs,
                                        const std::vector<TensorType>& out_types) {
  if (out_types.size() != 1) return Status::BadInput("no fold rule for multi-output ops");
  for (const Tensor* t : inputs) {
    if (!t) return Status::BadInput("absent input");
  }
  const TensorType& type = out_types[0];
  if (type.numel() > kMaxFoldElements) return Status::BadInput("too large to fold");
  Tensor out = Tensor::zeros(type.dtype, type.shape);
  const std::string& op = node.op;
  if (binary_ops().count(op)) {
    if (inputs.size() != 2) return Status::BadInput("arity");
    MEMC_RETURN_IF_ERROR(fold_binary(node, *inputs[0], *inputs[1], out));
  } else if (op.rfind("reduce_", 0) == 0) {
    MEMC_RETURN_IF_ERROR(fold_reduce(node, *inputs[0], out));
  } else if (Status st = fold_data_movement(node, inputs, out); !st.ok()) {
    if (inputs.size() != 1) return st;
    MEMC_RETURN_IF_ERROR(fold_unary(node, *inputs[0], out));
  }
  std::vector<Tensor> result;
  result.push_back(std::move(out));
  return result;
}

}  // namespace memc
