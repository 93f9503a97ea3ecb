#include "runtime/safetensors.h"

#include <algorithm>
#include <cstring>
#include <tuple>
#include <vector>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "support/atomic_file.h"
#include "support/crc32c.h"

namespace memc {

using json = nlohmann::json;
static const std::string kChecksumPrefix = "crc32c:";
static const std::string kHeaderChecksumKey = "crc32c:__header__";

static const char* st_dtype(DType t) {
  switch (t) {
    case DType::kF32: return "F32";
    case DType::kF16: return "F16";
    case DType::kBF16: return "BF16";
    case DType::kF64: return "F64";
    case DType::kI64: return "I64";
    case DType::kI32: return "I32";
    case DType::kBool: return "BOOL";
    case DType::kU8: return "U8";
  }
  return "?";
}

// The header as checksummed: the JSON object without the header checksum itself, dumped with
// sorted keys and no spaces, so the order and spacing of the stored text do not matter.
static std::string canonical_header(json header) {
  if (header.contains("__metadata__") && header["__metadata__"].is_object()) {
    header["__metadata__"].erase(kHeaderChecksumKey);
    if (header["__metadata__"].empty()) header.erase("__metadata__");
  }
  return header.dump();
}

static std::optional<DType> parse_st_dtype(const std::string& s) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI64, DType::kI32, DType::kBool, DType::kU8}) {
    if (s == st_dtype(t)) return t;
  }
  return std::nullopt;
}

Status write_safetensors(const std::string& path, const SafetensorsFile& file) {
  json header = json::object();
  size_t offset = 0;
  for (const auto& [name, t] : file.tensors) {
    header[name] = {{"dtype", st_dtype(t.dtype())}, {"shape", t.shape()}, {"data_offsets", {offset, offset + t.nbytes()}}};
    offset += t.nbytes();
  }
  json metadata = file.metadata;
  for (const auto& [name, t] : file.tensors) metadata[kChecksumPrefix + name] = crc32c_hex(crc32c(t.raw(), t.nbytes()));
  header["__metadata__"] = metadata;
  const std::string canonical = canonical_header(header);
  header["__metadata__"][kHeaderChecksumKey] = crc32c_hex(crc32c(canonical.data(), canonical.size()));
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');  // align the data to 8 bytes
  std::string out(8, '\0');
  const uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xff);
  out += text;
  out.reserve(out.size() + offset);
  for (const auto& [name, t] : file.tensors) out.append(static_cast<const char*>(t.raw()), t.nbytes());
  return write_file_atomic(path, out);
}

namespace {

// Where one tensor's bytes lie in the data section.
struct Extent {
  uint64_t begin, end;
  std::string name;
};

// The parsed header and where the data section lies in `bytes`.
struct Header {
  json entries;
  size_t data_start = 0, data_size = 0;
};

// The whole file, or an error naming it.
Expected<std::string> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::BadInput(path + ": cannot open");
  std::stringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

// The length prefix fits the file and the header is a JSON object.
Expected<Header> parse_header(const std::string& bytes, const std::string& path) {
  if (bytes.size() < 8) return Status::BadInput(path + ": not a safetensors file (shorter than its header length)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (n > bytes.size() - 8) return Status::BadInput(str_cat(path, ": header length ", n, " exceeds the file (", bytes.size(), " bytes): truncated or corrupt"));
  Header header;
  header.entries = json::parse(bytes.substr(8, n), nullptr, false);
  if (header.entries.is_discarded() || !header.entries.is_object()) return Status::BadInput(path + ": safetensors header is not a JSON object");
  header.data_start = 8 + n;
  header.data_size = bytes.size() - header.data_start;
  return header;
}

// Every metadata value is a string.
Status read_metadata(const json& entry, const std::string& path, std::map<std::string, std::string>& metadata) {
  if (!entry.is_object()) return Status::BadInput(path + ": __metadata__ is not an object");
  for (auto m = entry.begin(); m != entry.end(); ++m) {
    if (!m->is_string()) return Status::BadInput(path + ": metadata '" + m.key() + "' is not a string");
    metadata[m.key()] = m->get<std::string>();
  }
  return Status::Ok();
}

// A tensor and where its bytes were.
struct StoredTensor {
  Tensor tensor;
  Extent extent;
};

// The tensor of header entry `name`, copied out of `bytes`: its dtype is known, its shape
// bounded and its offsets span exactly its bytes inside the data section.
Expected<StoredTensor> read_tensor(const json& e, const std::string& name, const std::string& path, const std::string& bytes,
                                   const Header& header) {
  const std::string where = path + ": tensor '" + name + "'";
  if (!e.is_object() || !e.contains("dtype") || !e.contains("shape") || !e.contains("data_offsets") || !e["dtype"].is_string() ||
      !e["shape"].is_array() || !e["data_offsets"].is_array() || e["data_offsets"].size() != 2) {
    return Status::BadInput(where + ": malformed entry");
  }
  auto dtype = parse_st_dtype(e["dtype"].get<std::string>());
  if (!dtype) return Status::BadInput(where + ": unsupported dtype " + e["dtype"].get<std::string>());
  Shape shape;
  int64_t count = 1;
  for (const json& d : e["shape"]) {
    if (!d.is_number_unsigned() || d.get<uint64_t>() > (uint64_t{1} << 40)) return Status::BadInput(where + ": bad shape");
    shape.push_back(d.get<int64_t>());
    count *= shape.back();
    if (count > (int64_t{1} << 40)) return Status::BadInput(where + ": shape too large");
  }
  const json& off = e["data_offsets"];
  if (!off[0].is_number_unsigned() || !off[1].is_number_unsigned()) return Status::BadInput(where + ": bad data_offsets");
  const uint64_t begin = off[0].get<uint64_t>(), end = off[1].get<uint64_t>();
  const uint64_t nbytes = static_cast<uint64_t>(count) * dtype_size(*dtype);
  if (begin > end || end > header.data_size || end - begin != nbytes) {
    return Status::BadInput(str_cat(where, ": data_offsets [", begin, ", ", end, ") do not fit ", nbytes, " bytes within the file's ",
                                    header.data_size, " data bytes"));
  }
  Tensor t = Tensor::zeros(*dtype, shape);
  if (nbytes) std::memcpy(t.raw(), bytes.data() + header.data_start + begin, nbytes);
  return StoredTensor{std::move(t), Extent{begin, end, name}};
}

// The data section is tiled exactly: no overlap, no hole, nothing after the last tensor.
Status check_tiling(std::vector<Extent> extents, size_t data_size, const std::string& path) {
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) { return std::tie(a.begin, a.end) < std::tie(b.begin, b.end); });
  uint64_t covered = 0;
  for (const Extent& e : extents) {
    if (e.begin < covered) {
      return Status::BadInput(str_cat(path, ": tensor '", e.name, "' data_offsets [", e.begin, ", ", e.end, ") overlap another tensor's bytes"));
    }
    if (e.begin > covered) return Status::BadInput(str_cat(path, ": data bytes [", covered, ", ", e.begin, ") belong to no tensor"));
    covered = e.end;
  }
  if (covered != data_size) return Status::BadInput(str_cat(path, ": ", data_size - covered, " trailing bytes after the last tensor's data"));
  return Status::Ok();
}

// Checksums (memc writes them; files from elsewhere may lack them unless required) match the
// header and every tensor's bytes.
Status verify_checksums(const json& header, const SafetensorsFile& file, bool require_checksums, const std::string& path) {
  if (auto stored = file.metadata.find(kHeaderChecksumKey); stored != file.metadata.end()) {
    const std::string canonical = canonical_header(header);
    const std::string computed = crc32c_hex(crc32c(canonical.data(), canonical.size()));
    if (stored->second != computed) {
      return Status::BadInput(str_cat(path, ": header checksum mismatch (stored ", stored->second, ", computed ", computed, "): the file is corrupt"));
    }
  } else if (require_checksums) {
    return Status::BadInput(path + ": has no header checksum (not written by this memc, or edited)");
  }
  for (const auto& [name, t] : file.tensors) {
    auto stored = file.metadata.find(kChecksumPrefix + name);
    if (stored == file.metadata.end()) {
      if (require_checksums) return Status::BadInput(path + ": tensor '" + name + "' has no checksum (not written by this memc, or edited)");
      continue;
    }
    const std::string computed = crc32c_hex(crc32c(t.raw(), t.nbytes()));
    if (stored->second != computed) {
      return Status::BadInput(str_cat(path, ": tensor '", name, "': checksum mismatch (stored ", stored->second, ", computed ", computed,
                                      "): the file is corrupt"));
    }
  }
  return Status::Ok();
}

}  // namespace

Expected<SafetensorsFile> read_safetensors(const std::string& path, bool require_checksums) {
  MEMC_ASSIGN_OR_RETURN(const std::string bytes, read_bytes(path));
  MEMC_ASSIGN_OR_RETURN(const Header header, parse_header(bytes, path));
  SafetensorsFile file;
  std::vector<Extent> extents;
  for (auto it = header.entries.begin(); it != header.entries.end(); ++it) {
    if (it.key() == "__metadata__") {
      MEMC_RETURN_IF_ERROR(read_metadata(*it, path, file.metadata));
      continue;
    }
    MEMC_ASSIGN_OR_RETURN(StoredTensor stored, read_tensor(*it, it.key(), path, bytes, header));
    file.tensors[it.key()] = std::move(stored.tensor);
    extents.push_back(std::move(stored.extent));
  }
  MEMC_RETURN_IF_ERROR(check_tiling(std::move(extents), header.data_size, path));
  MEMC_RETURN_IF_ERROR(verify_checksums(header.entries, file, require_checksums, path));
  for (auto it = file.metadata.begin(); it != file.metadata.end();) {  // callers see their own metadata only
    it = it->first.rfind(kChecksumPrefix, 0) == 0 ? file.metadata.erase(it) : std::next(it);
  }
  return file;
}

}  // namespace memc
