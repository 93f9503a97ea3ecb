// NumPy .npy / .npz files: the data format of `memc infer`, `memc run --data`, reference
// files and gradient dumps (../shared/CLI.md).
//
// .npy versions 1, 2 and 3; little-endian dtypes <f4 <f8 <f2 (read as f16) <i8 <i4 |b1 |u1.
// Fortran-order arrays (NumPy saves transposed arrays so) are read into row-major order.
// Big-endian, object and structured arrays are refused with a message that names the file and
// the array. An .npz is a zip archive (stored or deflated) of .npy members;
// keys drop the ".npy" suffix ("grad/w.npy" → "grad/w"). NumPy has no bf16: write_npz refuses
// bf16 tensors (cast them to f32 first). Readers never crash on corrupt input (fuzzed).
#pragma once
#include <map>
#include <string>
#include <string_view>

#include "ir/tensor.h"
#include "support/status.h"

namespace memc {

using TensorMap = std::map<std::string, Tensor>;

// Reads every array of an .npz archive. Errors are BadInput and start with `path`.
Expected<TensorMap> read_npz(const std::string& path);
// Same from an archive in memory; `display_name` stands for the file in messages.
Expected<TensorMap> read_npz_bytes(std::string_view bytes, const std::string& display_name = "<memory>");

// Writes an .npz archive (stored members, .npy v1 headers, v2 when a header needs it).
// Atomic: writes `path`.tmp.<pid> beside it and renames, so an existing file is untouched on
// failure. A missing parent folder or an unwritable path is BadInput.
Status write_npz(const std::string& path, const TensorMap& arrays);

// One .npy array from bytes / to bytes (the members of an archive).
// `where` names the file and array in messages ("in.npz: array 'x'").
Expected<Tensor> parse_npy(std::string_view bytes, const std::string& where);
Expected<std::string> serialize_npy(const Tensor& tensor, const std::string& where);

// A .npy file's header: what its data is and where it starts, for readers that take the data
// in pieces (runtime/npy_stream.h). `where` names the file in messages.
struct NpyLayout {
  DType dtype = DType::kF32;
  Shape shape;
  bool fortran_order = false;
  uint64_t data_offset = 0;  // bytes before the data: magic, version, length, dict
  uint64_t data_bytes = 0;
};
// `prefix` holds the file's first bytes (64 KiB covers any header NumPy writes).
Expected<NpyLayout> parse_npy_layout(std::string_view prefix, const std::string& where);

// NumPy's dtype string for a memc dtype ("<f4"), or empty when NumPy has none (bf16).
std::string npy_descr(DType dtype);

}  // namespace memc
