#include "runtime/npy_stream.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "runtime/npz.h"

namespace memc {

namespace {

// Reads exactly `bytes` at `offset`, retrying short reads; false on an error or end of file.
bool pread_exact(int fd, void* dst, uint64_t bytes, uint64_t offset) {
  auto* out = static_cast<char*>(dst);
  while (bytes > 0) {
    const ssize_t got = ::pread(fd, out, bytes, static_cast<off_t>(offset));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) return false;
    out += got, bytes -= static_cast<uint64_t>(got), offset += static_cast<uint64_t>(got);
  }
  return true;
}

// "x.12.npy" → {"x", 12}; "x.npy" → {"x", -1}; not .npy → {"", -1}.
std::pair<std::string, int64_t> npy_name(const std::string& file) {
  const std::string suffix = ".npy";
  if (file.size() <= suffix.size() || file.compare(file.size() - suffix.size(), suffix.size(), suffix) != 0) return {"", -1};
  std::string stem = file.substr(0, file.size() - suffix.size());
  const size_t dot = stem.rfind('.');
  if (dot == std::string::npos || dot + 1 == stem.size() || dot + 19 < stem.size() ||
      stem.find_first_not_of("0123456789", dot + 1) != std::string::npos) {
    return {stem, -1};
  }
  return {stem.substr(0, dot), std::stoll(stem.substr(dot + 1))};
}

}  // namespace

Expected<std::map<std::string, std::vector<std::string>>> list_npy_folder(const std::string& dir) {
  std::error_code ec;
  if (!std::filesystem::is_directory(dir, ec)) return Status::BadInput(str_cat(dir, ": not a folder of .npy files"));
  std::map<std::string, std::map<int64_t, std::string>> found;  // name → shard index (-1: whole) → path
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    if (!entry.is_regular_file(ec)) continue;
    const auto [name, index] = npy_name(entry.path().filename().string());
    if (name.empty()) continue;
    auto& shards = found[name];
    if (!shards.emplace(index, entry.path().string()).second) {
      return Status::BadInput(str_cat(dir, ": array '", name, "' has two shards numbered ", index, " (", shards[index], ", ",
                                      entry.path().string(), ")"));
    }
  }
  if (ec) return Status::BadInput(str_cat(dir, ": cannot list: ", ec.message()));
  if (found.empty()) return Status::BadInput(str_cat(dir, ": holds no .npy files (expected x.npy and y.npy, or shards x.0.npy …)"));
  std::map<std::string, std::vector<std::string>> arrays;
  for (auto& [name, shards] : found) {
    if (shards.count(-1) && shards.size() > 1) {
      return Status::BadInput(str_cat(dir, ": array '", name, "' is both ", name, ".npy and shards ", name, ".K.npy; keep one"));
    }
    for (auto& [index, path] : shards) arrays[name].push_back(path);
  }
  return arrays;
}

Expected<std::shared_ptr<const NpyColumn>> NpyColumn::open(const std::vector<std::string>& shard_paths, const std::string& name) {
  std::shared_ptr<NpyColumn> column(new NpyColumn());
  column->name_ = name;
  for (const std::string& path : shard_paths) {
    Shard shard{path};
    shard.fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (shard.fd < 0) return Status::BadInput(str_cat(path, ": cannot open: ", std::strerror(errno)));
    column->shards_.push_back(shard);  // closed by the column from here on
    std::string prefix(65536, '\0');
    const ssize_t got = ::pread(shard.fd, prefix.data(), prefix.size(), 0);
    if (got < 0) return Status::BadInput(str_cat(path, ": cannot read: ", std::strerror(errno)));
    prefix.resize(static_cast<size_t>(got));
    MEMC_ASSIGN_OR_RETURN(const NpyLayout layout, parse_npy_layout(prefix, path));
    if (layout.shape.empty()) return Status::BadInput(str_cat(path, ": a 0-d array; samples lie along dim 0"));
    if (layout.fortran_order && layout.shape.size() > 1) {
      return Status::BadInput(str_cat(path, ": Fortran-ordered; save it C-ordered (np.ascontiguousarray) to read it by samples"));
    }
    struct stat st {};
    if (::fstat(shard.fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < layout.data_offset + layout.data_bytes) {
      return Status::BadInput(str_cat(path, ": array data is ", st.st_size - static_cast<int64_t>(layout.data_offset), " bytes, needs ",
                                      layout.data_bytes, " (truncated)"));
    }
    const Shape sample(layout.shape.begin() + 1, layout.shape.end());
    if (column->shards_.size() == 1) {
      column->dtype_ = layout.dtype;
      column->sample_shape_ = sample;
      column->sample_bytes_ = static_cast<int64_t>(dtype_size(layout.dtype));
      for (int64_t d : sample) column->sample_bytes_ *= d;
    } else if (layout.dtype != column->dtype_ || sample != column->sample_shape_) {
      return Status::BadInput(str_cat(path, ": ", dtype_name(layout.dtype), "[N, ", shape_str(sample), "] does not match ", shard_paths.front(),
                                      "'s ", dtype_name(column->dtype_), "[N, ", shape_str(column->sample_shape_), "]"));
    }
    Shard& last = column->shards_.back();
    last.data_offset = layout.data_offset;
    last.first_row = column->rows_;
    last.rows = layout.shape[0];
    column->rows_ += last.rows;
  }
  return std::shared_ptr<const NpyColumn>(std::move(column));
}

NpyColumn::~NpyColumn() {
  for (const Shard& s : shards_) {
    if (s.fd >= 0) ::close(s.fd);
  }
}

const NpyColumn::Shard& NpyColumn::shard_of(int64_t row) const {
  auto it = std::upper_bound(shards_.begin(), shards_.end(), row, [](int64_t r, const Shard& s) { return r < s.first_row; });
  return *std::prev(it);
}

Status NpyColumn::read(int64_t row, void* dst) const {
  MEMC_CHECK(row >= 0 && row < rows_);
  const Shard& s = shard_of(row);
  const uint64_t offset = s.data_offset + static_cast<uint64_t>(row - s.first_row) * static_cast<uint64_t>(sample_bytes_);
  errno = 0;
  if (!pread_exact(s.fd, dst, static_cast<uint64_t>(sample_bytes_), offset)) {
    return Status::BadInput(str_cat(where(row), ": cannot read ", sample_bytes_, " bytes", errno ? str_cat(": ", std::strerror(errno)) : ""));
  }
  if (dtype_ == DType::kBool) {  // NumPy's bool is one byte; any nonzero is true
    auto* p = static_cast<uint8_t*>(dst);
    for (int64_t i = 0; i < sample_bytes_; ++i) p[i] = p[i] != 0;
  }
  return Status::Ok();
}

Expected<Tensor> NpyColumn::read_all() const {
  Shape shape{rows_};
  shape.insert(shape.end(), sample_shape_.begin(), sample_shape_.end());
  Tensor t = Tensor::zeros(dtype_, shape);
  auto* out = static_cast<char*>(t.raw());
  for (const Shard& s : shards_) {
    const uint64_t bytes = static_cast<uint64_t>(s.rows) * static_cast<uint64_t>(sample_bytes_);
    if (bytes && !pread_exact(s.fd, out + s.first_row * sample_bytes_, bytes, s.data_offset)) {
      return Status::BadInput(str_cat(s.path, ": cannot read its ", bytes, " bytes of data"));
    }
  }
  if (dtype_ == DType::kBool) {
    auto* p = static_cast<uint8_t*>(t.raw());
    for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = p[i] != 0;
  }
  return t;
}

std::string NpyColumn::where(int64_t row) const {
  const Shard& s = shard_of(row);
  return str_cat(s.path, " row ", row - s.first_row);
}

}  // namespace memc
