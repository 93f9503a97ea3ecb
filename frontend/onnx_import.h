// ONNX → IR. Reads ModelProto as real exporters write it, specializes dynamic dims for a
// fixed batch (and sequence length), folds shape subgraphs to constants, lowers ONNX ops onto
// the core op set and fuses exporter idioms (GELU, layernorm, linear, attention).
#pragma once
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include "ir/graph.h"

namespace memc {

struct ImportOptions {
  int64_t batch = -1;  // value for the first dim of inputs when dynamic; -1: the model's, else 1
  int64_t seq = -1;    // value for the second dim of token inputs when dynamic; -1: model's, else error
  std::map<std::string, int64_t> dim_values;  // named symbolic dims (dim_param) → value
  // Float initializers that are constants, not trained parameters (a module's buffers, frozen
  // parameters); a name that is no initializer is an error.
  std::set<std::string> frozen;
  bool load_weights = true;  // false: shapes only (inspect, compile of skeleton models)
  bool fuse = true;          // idiom fusion (tests of raw lowering turn it off)
  bool fuse_attention = true;  // false: leave MatMul→Softmax→MatMul for compile's attention pass
  // A BatchNorm exported in train() normalizes with its batch's statistics and updates its
  // running statistics (buffers); true: it normalizes with the running ones (the evaluation
  // forward, as the module in eval()).
  bool running_statistics = false;
  // The forward runs as one of `ranks` SPMD ranks, each on its slice of the batch: a BatchNorm's
  // batch statistics are then the whole batch's, summed over the ranks (as one device computes
  // them; PyTorch's SyncBatchNorm).
  int64_t ranks = 1;
  // When set, receives the parameter findings (frontend/param_audit.h), one line each.
  std::vector<std::string>* param_findings = nullptr;
};

// Imports the model at `path`; external data is resolved relative to its folder.
// Errors name the file, and for graph problems the node, op type and opset.
Expected<Module> import_onnx(const std::string& path, const ImportOptions& options = {});
// Same from bytes in memory (fuzzing); external data relative to `base_dir`.
Expected<Module> import_onnx_bytes(std::string_view bytes, const std::string& base_dir,
                                   const ImportOptions& options = {}, const std::string& display_name = "<memory>");

// ONNX op types (default domain) the importer lowers.
std::vector<std::string> supported_onnx_ops();

}  // namespace memc
