#include "frontend/onnx_tensor.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>

namespace memc {

Expected<DType> dtype_from_onnx(int onnx_type) {
  using TP = onnx::TensorProto;
  switch (onnx_type) {
    case TP::FLOAT: return DType::kF32;
    case TP::FLOAT16: return DType::kF16;
    case TP::BFLOAT16: return DType::kBF16;
    case TP::DOUBLE: return DType::kF64;
    case TP::INT64: return DType::kI64;
    case TP::INT32: return DType::kI32;
    case TP::BOOL: return DType::kBool;
    case TP::UINT8: return DType::kU8;
    default: break;
  }
  const std::string name = TP::DataType_IsValid(onnx_type)
                               ? TP::DataType_Name(static_cast<TP::DataType>(onnx_type))
                               : std::to_string(onnx_type);
  return Status::BadInput("element type " + name + " is not supported (memc has f32, f16, bf16, f64, i64, i32, bool, u8)");
}

int onnx_type_from_dtype(DType dtype) {
  using TP = onnx::TensorProto;
  switch (dtype) {
    case DType::kF32: return TP::FLOAT;
    case DType::kF16: return TP::FLOAT16;
    case DType::kBF16: return TP::BFLOAT16;
    case DType::kF64: return TP::DOUBLE;
    case DType::kI64: return TP::INT64;
    case DType::kI32: return TP::INT32;
    case DType::kBool: return TP::BOOL;
    case DType::kU8: return TP::UINT8;
  }
  return TP::UNDEFINED;
}

Expected<Shape> shape_from_proto(const onnx::TensorProto& proto) {
  Shape shape;
  int64_t count = 1;
  for (int64_t d : proto.dims()) {
    if (d < 0) return Status::BadInput(str_cat("negative dim ", d));
    if (d > 0 && count > (int64_t{1} << 40) / d) return Status::BadInput("tensor has more than 2^40 elements");
    count *= d;
    shape.push_back(d);
  }
  return shape;
}

static int64_t numel_of_dims(const onnx::TensorProto& proto) {
  int64_t n = 1;
  for (int64_t d : proto.dims()) {
    if (d <= 0) return 0;
    if (n > (int64_t{1} << 40) / d) return int64_t{1} << 40;  // saturate: only > 0 matters here
    n *= d;
  }
  return n;
}

bool tensor_proto_has_no_data(const onnx::TensorProto& proto) {
  return !proto.has_raw_data() && proto.float_data_size() == 0 && proto.int32_data_size() == 0 &&
         proto.int64_data_size() == 0 && proto.double_data_size() == 0 && proto.uint64_data_size() == 0 &&
         proto.external_data_size() == 0 && proto.string_data_size() == 0 && numel_of_dims(proto) > 0;
}

static Status read_external(const onnx::TensorProto& proto, const std::string& base_dir, std::string& bytes) {
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& kv : proto.external_data()) {
    if (kv.key() == "location") location = kv.value();
    else if (kv.key() == "offset") offset = std::strtoll(kv.value().c_str(), nullptr, 10);
    else if (kv.key() == "length") length = std::strtoll(kv.value().c_str(), nullptr, 10);
  }
  if (location.empty()) return Status::BadInput("external data without a location");
  namespace fs = std::filesystem;
  const fs::path rel(location);
  if (rel.is_absolute() || location.find("..") != std::string::npos) {
    return Status::BadInput("external data location '" + location + "' leaves the model's folder");
  }
  const fs::path path = fs::path(base_dir.empty() ? "." : base_dir) / rel;
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::BadInput("cannot open external data file " + path.string());
  in.seekg(0, std::ios::end);
  const int64_t size = static_cast<int64_t>(in.tellg());
  if (offset < 0 || offset > size) return Status::BadInput(str_cat("external data offset ", offset, " outside ", path.string(), " (", size, " bytes)"));
  if (length < 0) length = size - offset;
  if (length > size - offset) return Status::BadInput(str_cat("external data [", offset, ", +", length, ") runs past the end of ", path.string(), " (", size, " bytes)"));
  bytes.resize(static_cast<size_t>(length));
  in.seekg(offset);
  in.read(bytes.data(), length);
  if (!in) return Status::BadInput("short read from " + path.string());
  return Status::Ok();
}

template <typename Field, typename Fn>
static Status copy_typed(const Field& field, int64_t count, Fn&& put, const char* field_name) {
  if (field.size() != count) {
    return Status::BadInput(str_cat(field_name, " holds ", field.size(), " values, dims need ", count));
  }
  for (int64_t i = 0; i < count; ++i) put(i, field.Get(static_cast<int>(i)));
  return Status::Ok();
}

Expected<Tensor> tensor_from_proto(const onnx::TensorProto& proto, const std::string& base_dir) {
  MEMC_ASSIGN_OR_RETURN(DType dtype, dtype_from_onnx(proto.data_type()));
  MEMC_ASSIGN_OR_RETURN(Shape shape, shape_from_proto(proto));
  const int64_t count = numel(shape);
  const size_t nbytes = static_cast<size_t>(count) * dtype_size(dtype);
  if (proto.data_location() == onnx::TensorProto::EXTERNAL || proto.external_data_size() > 0) {
    std::string bytes;
    MEMC_RETURN_IF_ERROR(read_external(proto, base_dir, bytes));
    if (bytes.size() != nbytes) return Status::BadInput(str_cat("external data has ", bytes.size(), " bytes, dims need ", nbytes));
    Tensor t = Tensor::zeros(dtype, shape);
    std::memcpy(t.raw(), bytes.data(), nbytes);
    return t;
  }
  if (proto.has_raw_data()) {
    if (proto.raw_data().size() != nbytes) {
      return Status::BadInput(str_cat("raw_data has ", proto.raw_data().size(), " bytes, dims need ", nbytes));
    }
    Tensor t = Tensor::zeros(dtype, shape);
    if (nbytes) std::memcpy(t.raw(), proto.raw_data().data(), nbytes);
    return t;
  }
  if (count > 0 && tensor_proto_has_no_data(proto)) return Status::BadInput("has dims but no data (skeleton model)");
  // Check the typed field's length before allocating: hostile dims may claim 2^40 elements.
  const int64_t stored = std::max({proto.float_data_size(), proto.double_data_size(), proto.int64_data_size(),
                                   proto.int32_data_size()});
  if (stored != count) return Status::BadInput(str_cat("typed data holds ", stored, " values, dims need ", count));
  Tensor t = Tensor::zeros(dtype, shape);
  switch (dtype) {
    case DType::kF32:
      MEMC_RETURN_IF_ERROR(copy_typed(proto.float_data(), count, [&](int64_t i, float v) { t.data<float>()[i] = v; }, "float_data"));
      break;
    case DType::kF64:
      MEMC_RETURN_IF_ERROR(copy_typed(proto.double_data(), count, [&](int64_t i, double v) { t.data<double>()[i] = v; }, "double_data"));
      break;
    case DType::kI64:
      MEMC_RETURN_IF_ERROR(copy_typed(proto.int64_data(), count, [&](int64_t i, int64_t v) { t.data<int64_t>()[i] = v; }, "int64_data"));
      break;
    case DType::kI32:
      MEMC_RETURN_IF_ERROR(copy_typed(proto.int32_data(), count, [&](int64_t i, int32_t v) { t.data<int32_t>()[i] = v; }, "int32_data"));
      break;
    case DType::kF16: case DType::kBF16:  // bit patterns stored in int32_data
      MEMC_RETURN_IF_ERROR(copy_typed(proto.int32_data(), count, [&](int64_t i, int32_t v) { t.data<uint16_t>()[i] = static_cast<uint16_t>(v); }, "int32_data"));
      break;
    case DType::kBool:
      MEMC_RETURN_IF_ERROR(copy_typed(proto.int32_data(), count, [&](int64_t i, int32_t v) { t.data<bool>()[i] = v != 0; }, "int32_data"));
      break;
    case DType::kU8:
      MEMC_RETURN_IF_ERROR(copy_typed(proto.int32_data(), count, [&](int64_t i, int32_t v) { t.data<uint8_t>()[i] = static_cast<uint8_t>(v); }, "int32_data"));
      break;
  }
  return t;
}

void tensor_to_proto(const Tensor& tensor, onnx::TensorProto& proto) {
  proto.clear_dims();
  for (int64_t d : tensor.shape()) proto.add_dims(d);
  proto.set_data_type(onnx_type_from_dtype(tensor.dtype()));
  proto.clear_float_data();
  proto.clear_int32_data();
  proto.clear_int64_data();
  proto.clear_double_data();
  proto.clear_external_data();
  proto.set_data_location(onnx::TensorProto::DEFAULT);
  proto.set_raw_data(std::string(static_cast<const char*>(tensor.raw()), tensor.nbytes()));
}

}  // namespace memc
