// safetensors files (checkpoints, exported weights): an 8-byte little-endian header length,
// a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then the
// tensor bytes. Writes are atomic and add CRC-32C checksums to the metadata: "crc32c:<name>" of
// each tensor's bytes and "crc32c:__header__" of the rest of the header (its canonical JSON).
// Reads validate every offset (the data section must be tiled exactly: no overlap, no hole, no
// trailing bytes), verify the checksums that are present, and never crash on bad files.
#pragma once
#include <map>
#include <string>

#include "ir/tensor.h"
#include "support/status.h"

namespace memc {

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

Status write_safetensors(const std::string& path, const SafetensorsFile& file);
// `require_checksums`: refuse a file without them (checkpoints memc resumes from). The returned
// metadata leaves the checksum entries out.
Expected<SafetensorsFile> read_safetensors(const std::string& path, bool require_checksums = false);

}  // namespace memc
