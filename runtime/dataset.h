// Training and evaluation data: an .npz with one array per graph input (keyed by the input's
// name; a single-input model also accepts `x`) and integer labels `y`, checked against the
// model's inputs once at load, then served in seeded, shuffled mini-batches of static size. Or
// the same arrays as a folder of .npy files (runtime/npy_stream.h), for data larger than memory:
// the labels are read at load, the inputs a batch at a time, never whole; a non-finite value is
// refused when its batch is read, naming the file and row.
//
// Order: epoch e visits the samples in the permutation made by a Fisher–Yates shuffle whose
// draw i is counter_random(seed, kShuffleStream + e, i) % (i + 1) — stateless, so a resumed run
// replays the same order and models/ scripts reproduce it. The last partial batch of an epoch
// is dropped (shapes are static); evaluation pads nothing and runs the remainder with a
// batch-sized window that repeats no sample (see eval_batches).
#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ir/graph.h"
#include "runtime/npy_stream.h"
#include "runtime/npz.h"

namespace memc {

struct InputSpec {
  std::string name;  // graph input name (Value::source_name)
  TensorType type;   // with the batch as dim 0
};

// What a plan's labels are: a class per sample, in [0, classes), or for token-level logits a
// class per position (`sample`: the positions' shape, [T...]), each in [0, classes) or
// kIgnoreLabel (passes/microbatch.h; PyTorch's ignore_index: a position the loss and the
// accuracy skip).
struct LabelSpec {
  int64_t classes = 0;
  Shape sample;  // empty: one label per sample
  bool tokens() const { return !sample.empty(); }
};

// The labels of a training step `train` (its "labels" argument) over `classes` classes.
LabelSpec label_spec(const Module& train, int64_t classes);

struct Dataset {
  std::string path;
  std::map<std::string, Tensor> inputs;  // .npz: by graph input name, dim 0 = samples
  // A .npy folder: by graph input name, the file's array, converted to the input's dtype per batch.
  std::map<std::string, std::shared_ptr<const NpyColumn>> streamed;
  Tensor labels;                         // i64 [samples] or, token labels, [samples, T...]
  int64_t size = 0;
};

// Loads and validates: every model input present with the per-sample shape and a compatible
// dtype (masks may be float, bool or integer and are converted), labels of the spec's shape
// (any integer dtype, read as i64) within [0, classes) (or kIgnoreLabel, for positions), float
// arrays finite. Errors name the file, the array and the sample.
// `path` is an .npz or a folder of .npy files.
Expected<Dataset> load_dataset(const std::string& path, const std::vector<InputSpec>& specs, const LabelSpec& labels);

// The same checks on arrays in memory (a caller's batch); `path` names them in messages.
Expected<Dataset> dataset_from_arrays(const std::string& path, const TensorMap& arrays, const std::vector<InputSpec>& specs,
                                      const LabelSpec& labels);

// Refuses NaN and ±inf in a float array, naming the file, the array and the sample (dim 0).
Status check_finite(const std::string& path, const std::string& array, const Tensor& t);

inline constexpr uint64_t kShuffleStream = 0x5348554646ull;  // "SHUFF"
std::vector<int64_t> epoch_order(int64_t size, uint64_t seed, int64_t epoch);
inline int64_t batches_per_epoch(int64_t size, int64_t batch) { return batch > 0 ? size / batch : 0; }

// Copies samples order[first .. first+batch) into batch tensors keyed by input name, plus
// the labels under `labels_key`. Streamed inputs are read here: an unreadable or non-finite
// sample is bad input naming its file and row.
Expected<std::map<std::string, Tensor>> make_batch(const Dataset& data, const std::vector<int64_t>& order, int64_t first,
                                         int64_t batch, const std::vector<InputSpec>& specs,
                                         const std::string& labels_key);

}  // namespace memc
