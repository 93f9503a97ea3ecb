#include "runtime/npz.h"

#include <unistd.h>
#include <zip.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <vector>

namespace memc {
namespace {

constexpr std::string_view kMagic = "\x93NUMPY";
// Beyond this a single array is surely a corrupt header, not data (also bounds fuzzing).
constexpr uint64_t kMaxArrayBytes = uint64_t{1} << 40;
// Deflate cannot expand more than ~1032:1; a member claiming more is corrupt.
constexpr uint64_t kMaxDeflateRatio = 1100;

struct DTypeSpelling {
  std::string_view descr;
  DType dtype;
};
// What NumPy writes for each memc dtype; '<u1' and '|i1'-style variants are NumPy aliases.
constexpr DTypeSpelling kSpellings[] = {
    {"<f4", DType::kF32}, {"<f8", DType::kF64}, {"<f2", DType::kF16}, {"<i8", DType::kI64},
    {"<i4", DType::kI32}, {"|b1", DType::kBool}, {"|u1", DType::kU8},  {"<u1", DType::kU8},
    {"<b1", DType::kBool},
};

struct NpyHeader {
  DType dtype = DType::kF32;
  Shape shape;
  bool fortran_order = false;  // column-major data (NumPy writes it for transposed arrays)
  uint64_t header_bytes = 0;  // magic + version + length + dict
  uint64_t data_bytes = 0;
};

// A cursor over the header's Python dict literal:
//   {'descr': '<f4', 'fortran_order': False, 'shape': (2, 3), }
class DictParser {
 public:
  explicit DictParser(std::string_view text) : text_(text) {}

  void skip_space() {
    while (pos_ < text_.size() && (text_[pos_] == ' ' || text_[pos_] == '\t' || text_[pos_] == '\n' || text_[pos_] == '\r'))
      ++pos_;
  }
  bool eat(char c) {
    skip_space();
    if (pos_ < text_.size() && text_[pos_] == c) {
      ++pos_;
      return true;
    }
    return false;
  }
  char peek() {
    skip_space();
    return pos_ < text_.size() ? text_[pos_] : '\0';
  }
  std::optional<std::string> string() {
    skip_space();
    if (pos_ >= text_.size() || (text_[pos_] != '\'' && text_[pos_] != '"')) return std::nullopt;
    const char quote = text_[pos_++];
    std::string out;
    while (pos_ < text_.size() && text_[pos_] != quote) {
      if (text_[pos_] == '\\') return std::nullopt;  // NumPy never escapes in its keys/dtypes
      out += text_[pos_++];
    }
    if (pos_ >= text_.size()) return std::nullopt;
    ++pos_;
    return out;
  }
  std::optional<bool> boolean() {
    skip_space();
    for (auto [word, value] : {std::pair{std::string_view("True"), true}, {std::string_view("False"), false}}) {
      if (text_.substr(pos_, word.size()) == word) {
        pos_ += word.size();
        return value;
      }
    }
    return std::nullopt;
  }
  // "(2, 3)", "(5,)", "()"; Python 2 "3L" is accepted.
  std::optional<Shape> tuple() {
    if (!eat('(')) return std::nullopt;
    Shape dims;
    while (!eat(')')) {
      skip_space();
      if (pos_ >= text_.size() || text_[pos_] < '0' || text_[pos_] > '9') return std::nullopt;
      uint64_t v = 0;
      while (pos_ < text_.size() && text_[pos_] >= '0' && text_[pos_] <= '9') {
        v = v * 10 + static_cast<uint64_t>(text_[pos_++] - '0');
        if (v > kMaxArrayBytes) return std::nullopt;
      }
      if (pos_ < text_.size() && text_[pos_] == 'L') ++pos_;
      dims.push_back(static_cast<int64_t>(v));
      if (!eat(',')) {
        if (!eat(')')) return std::nullopt;
        break;
      }
    }
    return dims;
  }

 private:
  std::string_view text_;
  size_t pos_ = 0;
};

uint32_t read_le(std::string_view bytes, size_t offset, size_t width) {
  uint32_t v = 0;
  for (size_t i = 0; i < width; ++i) v |= static_cast<uint32_t>(static_cast<uint8_t>(bytes[offset + i])) << (8 * i);
  return v;
}

// Bytes of the prelude (magic, version, header length) for the version at bytes[6].
Expected<size_t> prelude_size(std::string_view bytes, const std::string& where) {
  if (bytes.size() < 8) return Status::BadInput(where + ": truncated .npy header");
  if (bytes.substr(0, 6) != kMagic) return Status::BadInput(where + ": not a .npy array (bad magic)");
  const int major = static_cast<uint8_t>(bytes[6]);
  if (major < 1 || major > 3)
    return Status::BadInput(str_cat(where, ": unsupported .npy format version ", major));
  return size_t{major == 1 ? 10u : 12u};
}

Expected<NpyHeader> parse_header(std::string_view bytes, const std::string& where) {
  MEMC_ASSIGN_OR_RETURN(const size_t prelude, prelude_size(bytes, where));
  if (bytes.size() < prelude) return Status::BadInput(where + ": truncated .npy header");
  const uint64_t dict_len = read_le(bytes, 8, prelude - 8);
  if (bytes.size() < prelude + dict_len) return Status::BadInput(where + ": truncated .npy header");
  const std::string_view dict = bytes.substr(prelude, dict_len);
  const auto bad = [&](const std::string& what) { return Status::BadInput(where + ": malformed .npy header: " + what); };

  DictParser p(dict);
  if (!p.eat('{')) return bad("expected '{'");
  std::optional<std::string> descr;
  std::optional<bool> fortran;
  std::optional<Shape> shape;
  while (!p.eat('}')) {
    auto key = p.string();
    if (!key) return bad("expected a quoted key");
    if (!p.eat(':')) return bad("expected ':' after '" + *key + "'");
    if (*key == "descr") {
      if (p.peek() == '[') return Status::BadInput(where + ": structured arrays are not supported");
      descr = p.string();
      if (!descr) return bad("'descr' is not a string");
    } else if (*key == "fortran_order") {
      fortran = p.boolean();
      if (!fortran) return bad("'fortran_order' is not True or False");
    } else if (*key == "shape") {
      shape = p.tuple();
      if (!shape) return bad("'shape' is not a tuple of integers");
    } else {
      return bad("unexpected key '" + *key + "'");
    }
    if (!p.eat(',')) {
      if (!p.eat('}')) return bad("expected ',' or '}'");
      break;
    }
  }
  if (!descr || !fortran || !shape) return bad("missing 'descr', 'fortran_order' or 'shape'");

  NpyHeader header;
  bool known = false;
  for (const auto& s : kSpellings) {
    if (s.descr == *descr) {
      header.dtype = s.dtype;
      known = true;
    }
  }
  if (!known) {
    const std::string& d = *descr;
    if (!d.empty() && d[0] == '>')
      return Status::BadInput(where + ": big-endian dtype '" + d + "' is not supported (save it little-endian)");
    if (d.find('O') != std::string::npos)
      return Status::BadInput(where + ": object arrays are not supported");
    return Status::BadInput(where + ": dtype '" + d + "' is not supported (f4, f8, f2, i8, i4, b1, u1)");
  }
  header.fortran_order = *fortran;

  uint64_t count = 1;
  for (int64_t d : *shape) {
    if (__builtin_mul_overflow(count, static_cast<uint64_t>(d), &count) || count > kMaxArrayBytes)
      return Status::BadInput(where + ": array shape is too large");
  }
  header.shape = std::move(*shape);
  header.header_bytes = prelude + dict_len;
  header.data_bytes = count * dtype_size(header.dtype);
  if (header.data_bytes > kMaxArrayBytes) return Status::BadInput(where + ": array shape is too large");
  return header;
}

// Column-major data → row-major, in place of the tensor's storage.
void fortran_to_c(Tensor& t) {
  if (t.rank() < 2 || t.numel() == 0) return;
  const Tensor column_major = t.clone();
  const size_t elem = dtype_size(t.dtype());
  const Shape& shape = t.shape();
  const int rank = static_cast<int>(shape.size());
  std::vector<int64_t> f_strides(rank, 1), index(rank, 0);
  for (int k = 1; k < rank; ++k) f_strides[k] = f_strides[k - 1] * shape[k - 1];
  const auto* src = static_cast<const char*>(column_major.raw());
  auto* dst = static_cast<char*>(t.raw());
  int64_t src_offset = 0;
  for (int64_t i = 0, count = t.numel(); i < count; ++i) {
    std::memcpy(dst + i * elem, src + src_offset * elem, elem);
    for (int k = rank - 1; k >= 0; --k) {  // row-major increment of the multi-index
      src_offset += f_strides[k];
      if (++index[k] < shape[k]) break;
      src_offset -= f_strides[k] * shape[k];
      index[k] = 0;
    }
  }
}

// NumPy's bool is one byte 0/1; normalize so later reads of `bool` are well defined.
void normalize_bools(Tensor& t) {
  if (t.dtype() != DType::kBool) return;
  auto* p = static_cast<uint8_t*>(t.raw());
  for (int64_t i = 0, count = t.numel(); i < count; ++i) p[i] = p[i] != 0;
}

std::string zip_message(zip_error_t* error) { return zip_error_strerror(error); }

// Reads exactly n bytes from a member; false on a short read or a libzip error (CRC, inflate).
bool read_exact(zip_file_t* file, void* out, uint64_t n) {
  auto* dst = static_cast<char*>(out);
  while (n > 0) {
    const zip_int64_t got = zip_fread(file, dst, n);
    if (got <= 0) return false;
    dst += got;
    n -= static_cast<uint64_t>(got);
  }
  return true;
}

struct ZipFileCloser {
  void operator()(zip_file_t* f) const { zip_fclose(f); }
};

Expected<Tensor> read_member(zip_t* archive, zip_uint64_t index, uint64_t archive_bytes, const std::string& where) {
  zip_stat_t st;
  zip_stat_init(&st);
  if (zip_stat_index(archive, index, 0, &st) != 0)
    return Status::BadInput(where + ": " + zip_message(zip_get_error(archive)));
  if ((st.valid & ZIP_STAT_COMP_METHOD) && st.comp_method != ZIP_CM_STORE && st.comp_method != ZIP_CM_DEFLATE)
    return Status::BadInput(str_cat(where, ": compression method ", st.comp_method,
                                    " is not supported (use np.savez or np.savez_compressed)"));
  const bool sizes_known = (st.valid & ZIP_STAT_SIZE) && (st.valid & ZIP_STAT_COMP_SIZE);
  if (!sizes_known) return Status::BadInput(where + ": zip member has no recorded size");
  if (st.comp_size > archive_bytes) return Status::BadInput(where + ": zip member is larger than the archive (truncated file?)");
  const uint64_t max_size = st.comp_method == ZIP_CM_STORE ? st.comp_size : st.comp_size * kMaxDeflateRatio + 1024;
  if (st.size > max_size) return Status::BadInput(where + ": zip member sizes are inconsistent (corrupt file)");

  std::unique_ptr<zip_file_t, ZipFileCloser> file(zip_fopen_index(archive, index, 0));
  if (!file) return Status::BadInput(where + ": " + zip_message(zip_get_error(archive)));
  const auto read_error = [&] {
    zip_error_t* e = zip_file_get_error(file.get());
    const int code = e ? zip_error_code_zip(e) : 0;
    return Status::BadInput(where + ": " + (code ? zip_message(e) : std::string("truncated array data")));
  };

  // Prelude first (its length depends on the version), then the dict, then the data in place.
  std::string head(10, '\0');
  if (st.size < 10 || !read_exact(file.get(), head.data(), 10)) {
    if (st.size < 10) return Status::BadInput(where + ": truncated .npy header");
    return read_error();
  }
  MEMC_ASSIGN_OR_RETURN(const size_t prelude, prelude_size(head, where));
  if (prelude > 10) {
    head.resize(prelude);
    if (!read_exact(file.get(), head.data() + 10, prelude - 10)) return read_error();
  }
  const uint64_t dict_len = read_le(head, 8, prelude - 8);
  if (prelude + dict_len > st.size) return Status::BadInput(where + ": truncated .npy header");
  head.resize(prelude + dict_len);
  if (!read_exact(file.get(), head.data() + prelude, dict_len)) return read_error();
  MEMC_ASSIGN_OR_RETURN(NpyHeader header, parse_header(head, where));
  if (header.header_bytes + header.data_bytes != st.size)
    return Status::BadInput(str_cat(where, ": array data is ", st.size - header.header_bytes, " bytes, shape (",
                                    shape_str(header.shape), ") of ", npy_descr(header.dtype), " needs ",
                                    header.data_bytes, " (truncated or corrupt)"));
  Tensor tensor = Tensor::zeros(header.dtype, header.shape);
  if (!read_exact(file.get(), tensor.raw(), header.data_bytes)) return read_error();
  // Reading to the end makes libzip check the CRC.
  char extra;
  if (zip_fread(file.get(), &extra, 1) != 0) return read_error();
  if (header.fortran_order) fortran_to_c(tensor);
  normalize_bools(tensor);
  return tensor;
}

Expected<TensorMap> read_archive(zip_t* archive, uint64_t archive_bytes, const std::string& display) {
  const zip_int64_t count = zip_get_num_entries(archive, 0);
  if (count < 0) return Status::BadInput(display + ": cannot list the zip archive");
  TensorMap arrays;
  for (zip_int64_t i = 0; i < count; ++i) {
    const char* raw_name = zip_get_name(archive, static_cast<zip_uint64_t>(i), 0);
    if (!raw_name) return Status::BadInput(str_cat(display, ": zip member ", i, ": ", zip_message(zip_get_error(archive))));
    std::string key = raw_name;
    if (!key.empty() && key.back() == '/') continue;  // a folder entry
    if (key.size() > 4 && key.compare(key.size() - 4, 4, ".npy") == 0) key.resize(key.size() - 4);
    const std::string where = display + ": array '" + key + "'";
    if (arrays.count(key)) return Status::BadInput(where + ": appears twice in the archive");
    MEMC_ASSIGN_OR_RETURN(Tensor t, read_member(archive, static_cast<zip_uint64_t>(i), archive_bytes, where));
    arrays.emplace(std::move(key), std::move(t));
  }
  return arrays;
}

struct ZipCloser {
  void operator()(zip_t* z) const { zip_discard(z); }
};

std::string errno_text(int err) { return std::strerror(err); }

// A stored-only archive with no members: libzip refuses to write one, NumPy reads it fine.
constexpr char kEmptyZip[22] = {'P', 'K', 5, 6};

}  // namespace

std::string npy_descr(DType dtype) {
  for (const auto& s : kSpellings)
    if (s.dtype == dtype) return std::string(s.descr);
  return "";
}

Expected<NpyLayout> parse_npy_layout(std::string_view prefix, const std::string& where) {
  MEMC_ASSIGN_OR_RETURN(NpyHeader header, parse_header(prefix, where));
  return NpyLayout{header.dtype, header.shape, header.fortran_order, header.header_bytes, header.data_bytes};
}

Expected<Tensor> parse_npy(std::string_view bytes, const std::string& where) {
  MEMC_ASSIGN_OR_RETURN(NpyHeader header, parse_header(bytes, where));
  if (bytes.size() - header.header_bytes != header.data_bytes)
    return Status::BadInput(str_cat(where, ": array data is ", bytes.size() - header.header_bytes, " bytes, needs ",
                                    header.data_bytes, " (truncated or corrupt)"));
  Tensor tensor = Tensor::zeros(header.dtype, header.shape);
  if (header.data_bytes) std::memcpy(tensor.raw(), bytes.data() + header.header_bytes, header.data_bytes);
  if (header.fortran_order) fortran_to_c(tensor);
  normalize_bools(tensor);
  return tensor;
}

Expected<std::string> serialize_npy(const Tensor& tensor, const std::string& where) {
  const std::string descr = npy_descr(tensor.dtype());
  if (descr.empty())
    return Status::BadInput(str_cat(where, ": dtype ", dtype_name(tensor.dtype()),
                                    " has no NumPy equivalent (cast to f32 first)"));
  std::string shape = "(";
  for (size_t i = 0; i < tensor.shape().size(); ++i) {
    if (tensor.shape()[i] < 0) return Status::Internal(where + ": negative dimension");
    shape += std::to_string(tensor.shape()[i]);
    shape += tensor.shape().size() == 1 ? "," : (i + 1 < tensor.shape().size() ? ", " : "");
  }
  shape += ")";
  std::string dict = "{'descr': '" + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  // NumPy pads prelude + dict + '\n' to a multiple of 64 so data is aligned.
  size_t prelude = 10;
  if (dict.size() + 1 + prelude > 65535) prelude = 12;
  const size_t total = (prelude + dict.size() + 1 + 63) / 64 * 64;
  dict.append(total - prelude - dict.size() - 1, ' ');
  dict += '\n';
  std::string out(kMagic);
  out += static_cast<char>(prelude == 10 ? 1 : 2);
  out += '\0';
  const size_t len = dict.size();
  for (size_t i = 0; i < prelude - 8; ++i) out += static_cast<char>((len >> (8 * i)) & 0xff);
  out += dict;
  if (tensor.numel() > 0 && !tensor.raw()) return Status::Internal(where + ": tensor has no data");
  out.append(static_cast<const char*>(tensor.raw()), tensor.nbytes());
  return out;
}

Expected<TensorMap> read_npz(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec)) return Status::BadInput(path + ": no such file");
  if (std::filesystem::is_directory(path, ec)) return Status::BadInput(path + ": is a directory, not an .npz file");
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return Status::BadInput(path + ": cannot read (" + ec.message() + ")");
  if (size == 0) return Status::BadInput(path + ": empty file, not an .npz archive");
  int code = 0;
  std::unique_ptr<zip_t, ZipCloser> archive(zip_open(path.c_str(), ZIP_RDONLY, &code));
  if (!archive) {
    zip_error_t error;
    zip_error_init_with_code(&error, code);
    std::string msg = path + ": not a readable .npz archive (" + zip_message(&error) + ")";
    zip_error_fini(&error);
    return Status::BadInput(msg);
  }
  return read_archive(archive.get(), size, path);
}

Expected<TensorMap> read_npz_bytes(std::string_view bytes, const std::string& display_name) {
  if (bytes.empty()) return Status::BadInput(display_name + ": empty file, not an .npz archive");
  zip_error_t error;
  zip_error_init(&error);
  zip_source_t* source = zip_source_buffer_create(bytes.data(), bytes.size(), 0, &error);
  if (!source) {
    std::string msg = display_name + ": " + zip_message(&error);
    zip_error_fini(&error);
    return Status::BadInput(msg);
  }
  std::unique_ptr<zip_t, ZipCloser> archive(zip_open_from_source(source, ZIP_RDONLY, &error));
  if (!archive) {
    zip_source_free(source);
    std::string msg = display_name + ": not a readable .npz archive (" + zip_message(&error) + ")";
    zip_error_fini(&error);
    return Status::BadInput(msg);
  }
  zip_error_fini(&error);
  return read_archive(archive.get(), bytes.size(), display_name);
}

Status write_npz(const std::string& path, const TensorMap& arrays) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::path target(path);
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  if (!fs::is_directory(parent, ec))
    return Status::BadInput(path + ": cannot write: folder '" + parent.string() + "' does not exist");
  if (fs::is_directory(target, ec)) return Status::BadInput(path + ": cannot write: is a directory");

  std::vector<std::string> members;
  members.reserve(arrays.size());
  for (const auto& [key, tensor] : arrays) {
    MEMC_ASSIGN_OR_RETURN(std::string bytes, serialize_npy(tensor, path + ": array '" + key + "'"));
    members.push_back(std::move(bytes));
  }

  const std::string tmp = str_cat(path, ".tmp.", getpid());
  const auto fail = [&](const std::string& why) {
    fs::remove(tmp, ec);
    return Status::BadInput(path + ": cannot write: " + why);
  };
  if (arrays.empty()) {
    FILE* f = std::fopen(tmp.c_str(), "wb");
    if (!f) return fail(errno_text(errno));
    const bool ok = std::fwrite(kEmptyZip, 1, sizeof(kEmptyZip), f) == sizeof(kEmptyZip);
    if (std::fclose(f) != 0 || !ok) return fail("short write");
  } else {
    int code = 0;
    zip_t* archive = zip_open(tmp.c_str(), ZIP_CREATE | ZIP_TRUNCATE, &code);
    if (!archive) {
      zip_error_t error;
      zip_error_init_with_code(&error, code);
      std::string why = zip_message(&error);
      zip_error_fini(&error);
      return fail(why);
    }
    size_t i = 0;
    for (const auto& [key, tensor] : arrays) {
      const std::string& bytes = members[i++];
      zip_source_t* source = zip_source_buffer(archive, bytes.data(), bytes.size(), 0);
      const zip_int64_t index =
          source ? zip_file_add(archive, (key + ".npy").c_str(), source, ZIP_FL_ENC_UTF_8 | ZIP_FL_OVERWRITE) : -1;
      if (index < 0) {
        std::string why = zip_message(zip_get_error(archive));
        if (source) zip_source_free(source);
        zip_discard(archive);
        return fail("array '" + key + "': " + why);
      }
      zip_set_file_compression(archive, static_cast<zip_uint64_t>(index), ZIP_CM_STORE, 0);
      // A fixed time (1980-01-01, zip's first) rather than now: the same arrays give the same
      // bytes, so ranks that each write a file compare equal (check_same_file_on_all_ranks).
      zip_file_set_mtime(archive, static_cast<zip_uint64_t>(index), 315532800, 0);
    }
    if (zip_close(archive) != 0) {
      std::string why = zip_message(zip_get_error(archive));
      zip_discard(archive);
      return fail(why);
    }
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) return fail(errno_text(errno));
  return Status::Ok();
}

}  // namespace memc
