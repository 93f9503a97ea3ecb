// safetensors files (checkpoints, exported weights): an 8-byte little-endian header length,
// a JSON header {name: {dtype, shape, data_offsets}, "__metadata__": {str: str}}, then the
// tensor bytes. Writes are atomic; reads validate every offset and never crash on bad files.
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
Expected<SafetensorsFile> read_safetensors(const std::string& path);

}  // namespace memc
