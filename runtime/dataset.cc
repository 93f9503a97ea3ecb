#include "runtime/dataset.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <numeric>

#include "backends/cpu/kernels.h"
#include "passes/training_step.h"

namespace memc {

// Same dtype, float↔float and int↔int convert; masks accept any 0/1 encoding.
static bool dtype_accepted(DType have, DType want, bool mask) {
  if (have == want) return true;
  if (is_float(have) && is_float(want)) return true;
  if (is_integer(have) && is_integer(want)) return true;
  return mask;
}

LabelSpec label_spec(const Module& train, int64_t classes) {
  LabelSpec spec{.classes = classes};
  for (ValueId a : train.arguments()) {
    const Value& v = train.value(a);
    if (v.role == Role::kInput && v.source_name == kLabelsArg && !v.type.shape.empty()) spec.sample.assign(v.type.shape.begin() + 1, v.type.shape.end());
  }
  return spec;
}

// Integer labels as i64 (a tokenizer's int32 ids, uint8 classes); others as they are, for
// check_labels to refuse.
static Tensor as_i64(const Tensor& labels) {
  return is_integer(labels.dtype()) && labels.dtype() != DType::kI64 ? labels.cast(DType::kI64) : labels;
}

// The labels: i64 [N] (or [N, T...] for token labels), each within [0, classes) or, for a
// position, kIgnoreLabel.
static Status check_labels(const std::string& where, const Tensor& labels, const LabelSpec& spec) {
  const Shape sample = labels.rank() > 0 ? Shape(labels.shape().begin() + 1, labels.shape().end()) : Shape{};
  if (labels.dtype() != DType::kI64 || labels.rank() == 0 || sample != spec.sample) {
    return Status::BadInput(str_cat(where, ": array 'y' is ", dtype_name(labels.dtype()), "[", shape_str(labels.shape()), "], expected int64 [N",
                                    spec.tokens() ? ", " + shape_str(spec.sample) : std::string(), "]",
                                    spec.tokens() ? " (a label per position of the model's logits)" : ""));
  }
  const int64_t per_sample = labels.rank() > 0 && labels.shape()[0] > 0 ? labels.numel() / labels.shape()[0] : 1;
  for (int64_t i = 0; i < labels.numel(); ++i) {
    const int64_t l = labels.data<int64_t>()[i];
    if ((l >= 0 && l < spec.classes) || (spec.tokens() && l == kIgnoreLabel)) continue;
    const std::string at = spec.tokens() ? str_cat("y[", i / per_sample, "] position ", i % per_sample) : str_cat("y[", i, "]");
    return Status::BadInput(str_cat(where, ": label ", at, " = ", l, " is outside [0, ", spec.classes, ")",
                                    spec.tokens() ? str_cat(" and is not ", kIgnoreLabel, " (ignored)") : std::string()));
  }
  return Status::Ok();
}

// The array for model input `spec`, of `have` dtype and [rows, sample...], fits it.
static Status check_input(const std::string& where, const std::string& key, DType have, int64_t rows, const Shape& sample,
                          const InputSpec& spec, int64_t size) {
  Shape want = spec.type.shape, got{rows};
  want[0] = size;
  got.insert(got.end(), sample.begin(), sample.end());
  if (got != want) {
    return Status::BadInput(str_cat(where, ": array '", key, "' has shape [", shape_str(got), "], expected [", shape_str(want), "] (", size, " samples)"));
  }
  const bool mask = spec.name.find("mask") != std::string::npos;
  if (!dtype_accepted(have, spec.type.dtype, mask)) {
    return Status::BadInput(str_cat(where, ": array '", key, "' is ", dtype_name(have), ", model input '", spec.name, "' needs ",
                                    dtype_name(spec.type.dtype)));
  }
  return Status::Ok();
}

// The key of model input `spec` among `keys`: its name, or `x` for a single-input model.
template <class Map>
static Expected<typename Map::const_iterator> find_input(const std::string& where, const Map& arrays, const InputSpec& spec, size_t inputs) {
  auto it = arrays.find(spec.name);
  if (it == arrays.end() && inputs == 1) it = arrays.find("x");
  if (it != arrays.end()) return it;
  std::string keys;
  for (const auto& [k, v] : arrays) keys += (keys.empty() ? "" : ", ") + k;
  return Status::BadInput(str_cat(where, ": no array for model input '", spec.name, "' (arrays: ", keys, ")"));
}

Expected<Dataset> dataset_from_arrays(const std::string& path, const TensorMap& arrays, const std::vector<InputSpec>& specs,
                                      const LabelSpec& label_spec) {
  Dataset data;
  data.path = path;
  auto labels = arrays.find("y");
  if (labels == arrays.end()) return Status::BadInput(path + ": no array 'y' (int64 labels)");
  data.labels = as_i64(labels->second);
  MEMC_RETURN_IF_ERROR(check_labels(path, data.labels, label_spec));
  data.size = data.labels.shape()[0];
  for (const InputSpec& spec : specs) {
    MEMC_ASSIGN_OR_RETURN(auto it, find_input(path, arrays, spec, specs.size()));
    const Tensor& t = it->second;
    const Shape sample = t.rank() > 0 ? Shape(t.shape().begin() + 1, t.shape().end()) : Shape{};
    MEMC_RETURN_IF_ERROR(check_input(path, it->first, t.dtype(), t.rank() > 0 ? t.shape()[0] : -1, sample, spec, data.size));
    MEMC_RETURN_IF_ERROR(check_finite(path, it->first, t));
    data.inputs[spec.name] = t.dtype() == spec.type.dtype ? t : t.cast(spec.type.dtype);
  }
  return data;
}

// A folder of .npy files: labels read now, inputs opened to be read a batch at a time.
static Expected<Dataset> load_npy_dataset(const std::string& dir, const std::vector<InputSpec>& specs, const LabelSpec& label_spec) {
  MEMC_ASSIGN_OR_RETURN(const auto files, list_npy_folder(dir));
  Dataset data;
  data.path = dir;
  auto labels = files.find("y");
  if (labels == files.end()) return Status::BadInput(dir + ": no y.npy (int64 labels) or shards y.K.npy");
  MEMC_ASSIGN_OR_RETURN(const std::shared_ptr<const NpyColumn> y, NpyColumn::open(labels->second, "y"));
  MEMC_ASSIGN_OR_RETURN(const Tensor y_all, y->read_all());
  data.labels = as_i64(y_all);
  MEMC_RETURN_IF_ERROR(check_labels(dir, data.labels, label_spec));
  data.size = data.labels.shape()[0];
  for (const InputSpec& spec : specs) {
    MEMC_ASSIGN_OR_RETURN(auto it, find_input(dir, files, spec, specs.size()));
    MEMC_ASSIGN_OR_RETURN(std::shared_ptr<const NpyColumn> column, NpyColumn::open(it->second, it->first));
    MEMC_RETURN_IF_ERROR(check_input(dir, it->first, column->dtype(), column->rows(), column->sample_shape(), spec, data.size));
    data.streamed[spec.name] = std::move(column);
  }
  return data;
}

Expected<Dataset> load_dataset(const std::string& path, const std::vector<InputSpec>& specs, const LabelSpec& labels) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) return load_npy_dataset(path, specs, labels);
  MEMC_ASSIGN_OR_RETURN(const TensorMap arrays, read_npz(path));
  return dataset_from_arrays(path, arrays, specs, labels);
}

// Index of the first NaN or ±inf element of a float tensor, or -1. f32 is scanned a block at a
// time without branches (it vectorizes: every step's batch from Python passes here).
static int64_t first_non_finite(const Tensor& t) {
  if (!is_float(t.dtype())) return -1;
  const int64_t n = t.numel();
  if (t.dtype() != DType::kF32) {
    for (int64_t i = 0; i < n; ++i) {
      if (!std::isfinite(t.get_as_double(i))) return i;
    }
    return -1;
  }
  constexpr uint32_t kExponent = 0x7f800000u;  // all ones: inf or NaN
  const auto* bits = static_cast<const uint32_t*>(t.raw());
  constexpr int64_t kBlock = 4096;
  for (int64_t start = 0; start < n; start += kBlock) {
    const int64_t end = std::min(n, start + kBlock);
    uint32_t any = 0;
    for (int64_t i = start; i < end; ++i) any |= static_cast<uint32_t>((bits[i] & kExponent) == kExponent);
    if (!any) continue;
    for (int64_t i = start; i < end; ++i) {
      if ((bits[i] & kExponent) == kExponent) return i;
    }
  }
  return -1;
}

Status check_finite(const std::string& path, const std::string& array, const Tensor& t) {
  const int64_t bad = first_non_finite(t);
  if (bad < 0) return Status::Ok();
  const int64_t n = t.numel();
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

// Samples rows[0..batch) of a streamed input, as the input's dtype.
static Expected<Tensor> read_streamed(const NpyColumn& column, const int64_t* rows, int64_t batch, const InputSpec& spec) {
  Shape shape{batch};
  shape.insert(shape.end(), column.sample_shape().begin(), column.sample_shape().end());
  Tensor raw = Tensor::zeros(column.dtype(), shape);
  auto* out = static_cast<char*>(raw.raw());
  for (int64_t b = 0; b < batch; ++b) MEMC_RETURN_IF_ERROR(column.read(rows[b], out + b * column.sample_bytes()));
  if (const int64_t bad = first_non_finite(raw); bad >= 0) {
    const int64_t per_sample = std::max<int64_t>(raw.numel() / batch, 1);
    const double v = raw.get_as_double(bad);
    return Status::BadInput(str_cat(column.where(rows[bad / per_sample]), ": array '", column.name(), "' holds ",
                                    std::isnan(v) ? "NaN" : (v > 0 ? "+inf" : "-inf"), " (element ", bad % per_sample,
                                    " of the sample); inputs must be finite"));
  }
  return raw.dtype() == spec.type.dtype ? raw : raw.cast(spec.type.dtype);
}

Expected<std::map<std::string, Tensor>> make_batch(const Dataset& data, const std::vector<int64_t>& order, int64_t first,
                                                   int64_t batch, const std::vector<InputSpec>& specs,
                                                   const std::string& labels_key) {
  std::map<std::string, Tensor> out;
  for (const InputSpec& spec : specs) {
    if (auto streamed = data.streamed.find(spec.name); streamed != data.streamed.end()) {
      MEMC_ASSIGN_OR_RETURN(out[spec.name], read_streamed(*streamed->second, order.data() + first, batch, spec));
      continue;
    }
    const Tensor& all = data.inputs.at(spec.name);
    Tensor t = Tensor::zeros(spec.type.dtype, spec.type.shape);
    const size_t sample_bytes = t.nbytes() / static_cast<size_t>(batch);
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t src = order[first + b];
      std::memcpy(static_cast<char*>(t.raw()) + b * sample_bytes, static_cast<const char*>(all.raw()) + src * sample_bytes, sample_bytes);
    }
    out[spec.name] = t;
  }
  Shape shape = data.labels.shape();
  shape[0] = batch;
  Tensor labels = Tensor::zeros(DType::kI64, shape);
  const int64_t per_sample = labels.numel() / std::max<int64_t>(batch, 1);
  for (int64_t b = 0; b < batch; ++b) {
    std::copy_n(data.labels.data<int64_t>() + order[first + b] * per_sample, per_sample, labels.data<int64_t>() + b * per_sample);
  }
  out[labels_key] = labels;
  return out;
}

}  // namespace memc
