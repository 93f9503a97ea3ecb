// Data larger than memory: arrays as .npy files on disk, read a sample at a time with pread,
// never mapped or loaded whole, so a training process holds one batch of them (the kernel's page
// cache keeps what it read, and may drop it). An array may be split along dim 0 into shards,
// read as their concatenation in shard order:
//
//   DIR/x.npy, DIR/y.npy                       one file per array
//   DIR/x.0.npy, DIR/x.1.npy, … DIR/y.0.npy …   shards NAME.K.npy (K a number; any split of rows)
//
// Each array is NAME (a model input's name, or `x` for a single-input model, and `y` for the
// labels). Shards of one array share the dtype and the per-sample shape and are C-ordered.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "ir/tensor.h"
#include "support/status.h"

namespace memc {

class NpyColumn {
 public:
  // Opens the shards (in order) of array `name`; errors name the file.
  static Expected<std::shared_ptr<const NpyColumn>> open(const std::vector<std::string>& shard_paths, const std::string& name);
  ~NpyColumn();
  NpyColumn(const NpyColumn&) = delete;
  NpyColumn& operator=(const NpyColumn&) = delete;

  const std::string& name() const { return name_; }
  DType dtype() const { return dtype_; }
  const Shape& sample_shape() const { return sample_shape_; }  // the dims after the first
  int64_t rows() const { return rows_; }
  int64_t sample_bytes() const { return sample_bytes_; }
  size_t shard_count() const { return shards_.size(); }
  // Copies row `row` of the concatenation (sample_bytes) to `dst`; a short read names the file.
  Status read(int64_t row, void* dst) const;
  // Every row, as one tensor [rows, sample_shape...] (the labels).
  Expected<Tensor> read_all() const;
  // "DIR/x.3.npy row 17": where row `row` lies, for messages.
  std::string where(int64_t row) const;

 private:
  NpyColumn() = default;
  struct Shard {
    std::string path;
    int fd = -1;
    uint64_t data_offset = 0;
    int64_t first_row = 0, rows = 0;
  };
  const Shard& shard_of(int64_t row) const;
  std::string name_;
  DType dtype_ = DType::kF32;
  Shape sample_shape_;
  int64_t rows_ = 0, sample_bytes_ = 0;
  std::vector<Shard> shards_;
};

// The arrays of a .npy folder: name → its shard files in order (NAME.npy alone, or NAME.K.npy by
// K). Errors: not a folder, no .npy files, an array given both ways, or two shards with one K.
Expected<std::map<std::string, std::vector<std::string>>> list_npy_folder(const std::string& dir);

}  // namespace memc
