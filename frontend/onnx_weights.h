// Reading initializer values from an ONNX file by name (memc run streams weights this way) and
// writing trained values back into a copy of the model (memc export).
#pragma once
#include <functional>
#include <map>
#include <set>
#include <utility>
#include <string>
#include <vector>

#include "ir/attr.h"
#include "ir/tensor.h"
#include "support/status.h"

namespace memc {

// Decodes the named initializers one at a time and hands each to `sink` (which copies it where
// it belongs, e.g. into a planned arena), so no more than one decoded weight is held at once.
Status stream_onnx_initializers(const std::string& path, const std::set<std::string>& names,
                                const std::function<Status(const std::string& name, const Tensor& value)>& sink);

// The external-data files the model's initializers read, as stored (relative to the model's
// folder), each once, in order of first use.
Expected<std::vector<std::string>> onnx_external_data_files(const std::string& path);

// Copies the model at `in_path` to `out_path` with each named initializer replaced by the
// given tensor (same shape; converted to the initializer's element type). Replaced values
// are stored inline, or in `out_path`.data when the model would pass protobuf's 2 GB limit.
// Each of `untied` moves a use of an initializer the exporter merged by value to a tensor of its
// own, added as an initializer with the value the model file holds: node `node`'s input `input`
// reads `name` instead of `source`, or, with input -1, the Identity of `source` whose output is
// `name` goes. A trained parameter's value is then written from `weights` like the rest; a
// running statistic (no weight) keeps the model's value. With no `source`, `name` is a bias the
// exporter removed for being zero: node `node` (with `input` inputs) reads it again as its last
// input, written from `weights` (a bias that was not trained stays removed, zero as before).
// With `copy_of`, node `node` is first added as a copy of node `copy_of` (one output, named
// `node`), and node `reader`'s input `reader_input` reads it: the exporter computed two FX values
// once (the same Expand of two equal tokens), and the copy reads the parameter untied from it.
struct UntiedUse {
  std::string name, source, node;
  int input = -1;
  std::string copy_of, reader;
  int reader_input = -1;
};
Status write_onnx_with_weights(const std::string& in_path, const std::string& out_path,
                               const std::map<std::string, Tensor>& weights, const std::vector<UntiedUse>& untied = {});
// The importer's record of them (module metadata "untied_uses": name, source, node, input, ...;
// "untied_copies": node, copy_of, reader, reader_input, ...).
std::vector<UntiedUse> untied_uses(const Attrs& metadata);

}  // namespace memc
