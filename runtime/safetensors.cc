#include "runtime/safetensors.h"

#include <cstring>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "runtime/atomic_file.h"

namespace memc {

using json = nlohmann::json;

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
  if (!file.metadata.empty()) header["__metadata__"] = file.metadata;
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

Expected<SafetensorsFile> read_safetensors(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::BadInput(path + ": cannot open");
  std::stringstream buffer;
  buffer << in.rdbuf();
  const std::string bytes = buffer.str();
  if (bytes.size() < 8) return Status::BadInput(path + ": not a safetensors file (shorter than its header length)");
  uint64_t n = 0;
  for (int i = 0; i < 8; ++i) n |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[i])) << (8 * i);
  if (n > bytes.size() - 8) return Status::BadInput(str_cat(path, ": header length ", n, " exceeds the file (", bytes.size(), " bytes): truncated or corrupt"));
  json header = json::parse(bytes.substr(8, n), nullptr, false);
  if (header.is_discarded() || !header.is_object()) return Status::BadInput(path + ": safetensors header is not a JSON object");
  const size_t data_start = 8 + n, data_size = bytes.size() - data_start;
  SafetensorsFile file;
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object()) return Status::BadInput(path + ": __metadata__ is not an object");
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string()) return Status::BadInput(path + ": metadata '" + m.key() + "' is not a string");
        file.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    const json& e = *it;
    const std::string where = path + ": tensor '" + it.key() + "'";
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
    if (begin > end || end > data_size || end - begin != nbytes) {
      return Status::BadInput(str_cat(where, ": data_offsets [", begin, ", ", end, ") do not fit ", nbytes, " bytes within the file's ", data_size, " data bytes"));
    }
    Tensor t = Tensor::zeros(*dtype, shape);
    if (nbytes) std::memcpy(t.raw(), bytes.data() + data_start + begin, nbytes);
    file.tensors[it.key()] = std::move(t);
  }
  return file;
}

}  // namespace memc
