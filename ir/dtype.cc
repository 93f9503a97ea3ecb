#include "ir/dtype.h"

#include <cmath>

namespace memc {

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kF32: case DType::kI32: return 4;
    case DType::kF16: case DType::kBF16: return 2;
    case DType::kF64: case DType::kI64: return 8;
    case DType::kBool: case DType::kU8: return 1;
  }
  return 0;
}

bool is_float(DType t) {
  return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16 || t == DType::kF64;
}
bool is_integer(DType t) { return t == DType::kI64 || t == DType::kI32 || t == DType::kU8; }
bool is_16bit_float(DType t) { return t == DType::kBF16 || t == DType::kF16; }

std::string_view dtype_name(DType t) {
  switch (t) {
    case DType::kF32: return "f32";
    case DType::kF16: return "f16";
    case DType::kBF16: return "bf16";
    case DType::kF64: return "f64";
    case DType::kI64: return "i64";
    case DType::kI32: return "i32";
    case DType::kBool: return "i1";
    case DType::kU8: return "ui8";
  }
  return "?";
}

std::optional<DType> parse_dtype(std::string_view name) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kF64, DType::kI64, DType::kI32,
                  DType::kBool, DType::kU8}) {
    if (dtype_name(t) == name) return t;
  }
  return std::nullopt;
}

}  // namespace memc
