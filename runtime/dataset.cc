#include "runtime/dataset.h"

#include <cmath>
#include <cstring>
#include <numeric>

#include "backends/cpu/kernels.h"

namespace memc {

// Same dtype, float↔float and int↔int convert; masks accept any 0/1 encoding.
static bool dtype_accepted(DType have, DType want, bool mask) {
  if (have == want) return true;
  if (is_float(have) && is_float(want)) return true;
  if (is_integer(have) && is_integer(want)) return true;
  return mask;
}

Expected<Dataset> load_dataset(const std::string& path, const std::vector<InputSpec>& specs, int64_t num_classes) {
  MEMC_ASSIGN_OR_RETURN(TensorMap arrays, read_npz(path));
  Dataset data;
  data.path = path;
  auto labels = arrays.find("y");
  if (labels == arrays.end()) return Status::BadInput(path + ": no array 'y' (int64 labels)");
  if (labels->second.dtype() != DType::kI64 || labels->second.rank() != 1) {
    return Status::BadInput(str_cat(path, ": array 'y' is ", dtype_name(labels->second.dtype()), "[",
                                    shape_str(labels->second.shape()), "], expected int64 [N]"));
  }
  data.labels = labels->second;
  data.size = data.labels.numel();
  for (int64_t i = 0; i < data.size; ++i) {
    const int64_t l = data.labels.data<int64_t>()[i];
    if (l < 0 || l >= num_classes) {
      return Status::BadInput(str_cat(path, ": label y[", i, "] = ", l, " is outside [0, ", num_classes, ")"));
    }
  }
  for (const InputSpec& spec : specs) {
    auto it = arrays.find(spec.name);
    if (it == arrays.end() && specs.size() == 1) it = arrays.find("x");
    if (it == arrays.end()) {
      std::string keys;
      for (const auto& [k, v] : arrays) keys += (keys.empty() ? "" : ", ") + k;
      return Status::BadInput(str_cat(path, ": no array for model input '", spec.name, "' (arrays: ", keys, ")"));
    }
    const Tensor& t = it->second;
    Shape want = spec.type.shape;
    want[0] = data.size;
    if (t.shape() != want) {
      return Status::BadInput(str_cat(path, ": array '", it->first, "' has shape [", shape_str(t.shape()),
                                      "], expected [", shape_str(want), "] (", data.size, " samples)"));
    }
    const bool mask = spec.name.find("mask") != std::string::npos;
    if (!dtype_accepted(t.dtype(), spec.type.dtype, mask)) {
      return Status::BadInput(str_cat(path, ": array '", it->first, "' is ", dtype_name(t.dtype()), ", model input '",
                                      spec.name, "' needs ", dtype_name(spec.type.dtype)));
    }
    MEMC_RETURN_IF_ERROR(check_finite(path, it->first, t));
    data.inputs[spec.name] = t.dtype() == spec.type.dtype ? t : t.cast(spec.type.dtype);
  }
  return data;
}

Status check_finite(const std::string& path, const std::string& array, const Tensor& t) {
  if (!is_float(t.dtype()) || t.numel() == 0) return Status::Ok();
  const int64_t n = t.numel();
  int64_t bad = -1;
  if (t.dtype() == DType::kF32) {
    const float* p = t.data<float>();
    for (int64_t i = 0; i < n && bad < 0; ++i) bad = std::isfinite(p[i]) ? -1 : i;
  } else {
    for (int64_t i = 0; i < n && bad < 0; ++i) bad = std::isfinite(t.get_as_double(i)) ? -1 : i;
  }
  if (bad < 0) return Status::Ok();
  const int64_t per_sample = t.rank() > 0 && t.shape()[0] > 0 ? n / t.shape()[0] : n;
  const double v = t.get_as_double(bad);
  return Status::BadInput(str_cat(path, ": array '", array, "' sample ", bad / per_sample, " holds ", std::isnan(v) ? "NaN" : (v > 0 ? "+inf" : "-inf"),
                                  " (element ", bad % per_sample, " of the sample); inputs must be finite"));
}

std::vector<int64_t> epoch_order(int64_t size, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(size));
  std::iota(order.begin(), order.end(), int64_t{0});
  for (int64_t i = size - 1; i > 0; --i) {
    const uint32_t r = counter_random(seed, kShuffleStream + static_cast<uint64_t>(epoch), static_cast<uint64_t>(i));
    std::swap(order[i], order[r % static_cast<uint64_t>(i + 1)]);
  }
  return order;
}

std::map<std::string, Tensor> make_batch(const Dataset& data, const std::vector<int64_t>& order, int64_t first,
                                         int64_t batch, const std::vector<InputSpec>& specs,
                                         const std::string& labels_key) {
  std::map<std::string, Tensor> out;
  for (const InputSpec& spec : specs) {
    const Tensor& all = data.inputs.at(spec.name);
    Tensor t = Tensor::zeros(spec.type.dtype, spec.type.shape);
    const size_t sample_bytes = t.nbytes() / static_cast<size_t>(batch);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t src = order[first + b];
      std::memcpy(static_cast<char*>(t.raw()) + b * sample_bytes, static_cast<const char*>(all.raw()) + src * sample_bytes, sample_bytes);
    }
    out[spec.name] = t;
  }
  Tensor labels = Tensor::zeros(DType::kI64, {batch});
  for (int64_t b = 0; b < batch; ++b) labels.data<int64_t>()[b] = data.labels.data<int64_t>()[order[first + b]];
  out[labels_key] = labels;
  return out;
}

}  // namespace memc
