// Element types of the IR. f16/bf16 are storage types: the CPU backend computes in f32
// and rounds to nearest even when it stores them.
#pragma once
#include <cstdint>
#include <cstring>
#include <optional>
#include <string>
#include <string_view>

#include "support/float16.h"

namespace memc {

enum class DType : uint8_t { kF32, kF16, kBF16, kF64, kI64, kI32, kBool, kU8 };

size_t dtype_size(DType t);
bool is_float(DType t);
bool is_integer(DType t);  // i64, i32, u8 (not bool)
bool is_16bit_float(DType t);  // bf16, f16
// MLIR spelling: f32, f16, bf16, f64, i64, i32, i1, ui8.
std::string_view dtype_name(DType t);
std::optional<DType> parse_dtype(std::string_view name);

// 16-bit float conversions with round-to-nearest-even: support/float16.h (host and device).

// Distinct storage types so templates can tell them apart from uint16_t.
struct f16_t {
  uint16_t bits;
};
struct bf16_t {
  uint16_t bits;
};

// Converts between storage and compute types: load<T>(ptr) -> float/double/int, store<T>(ptr, v).
template <typename T>
struct Compute {
  using type = T;
};
template <>
struct Compute<f16_t> {
  using type = float;
};
template <>
struct Compute<bf16_t> {
  using type = float;
};
template <typename T>
inline typename Compute<T>::type load(const T& v) {
  return v;
}
template <>
inline float load<f16_t>(const f16_t& v) {
  return f16_to_f32(v.bits);
}
template <>
inline float load<bf16_t>(const bf16_t& v) {
  return bf16_to_f32(v.bits);
}
template <typename T, typename C>
inline T store(C v) {
  return static_cast<T>(v);
}
template <>
inline f16_t store<f16_t, float>(float v) {
  return f16_t{f32_to_f16(v)};
}
template <>
inline bf16_t store<bf16_t, float>(float v) {
  return bf16_t{f32_to_bf16(v)};
}

// Calls fn.template operator()<T>() with T the C++ storage type of `t`.
template <typename Fn>
decltype(auto) dispatch_dtype(DType t, Fn&& fn) {
  switch (t) {
    case DType::kF32: return fn.template operator()<float>();
    case DType::kF16: return fn.template operator()<f16_t>();
    case DType::kBF16: return fn.template operator()<bf16_t>();
    case DType::kF64: return fn.template operator()<double>();
    case DType::kI64: return fn.template operator()<int64_t>();
    case DType::kI32: return fn.template operator()<int32_t>();
    case DType::kBool: return fn.template operator()<bool>();
    case DType::kU8: return fn.template operator()<uint8_t>();
  }
  return fn.template operator()<float>();
}

}  // namespace memc
