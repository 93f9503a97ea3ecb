// State shared by the ONNX lowering functions: the Module under construction, the map from
// ONNX value names to IR values, the values known at import time (folded constants), and
// the node being lowered (for attribute access and error messages).
#pragma once
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "frontend/onnx_import.h"
#include "onnx/onnx_pb.h"

namespace memc {

class ImportContext {
 public:
  ImportContext(Module& module, const ImportOptions& options, std::string file, int64_t opset)
      : module_(module), options_(options), file_(std::move(file)), opset_(opset) {}

  Module& module() { return module_; }
  const ImportOptions& options() const { return options_; }
  const std::string& file() const { return file_; }
  int64_t opset() const { return opset_; }
  // The export was made in training mode: a Dropout whose training_mode is a constant true, or
  // torch's exporter (whose only Dropout without training_mode is SDPA's dropout_p, which torch's
  // modules set to 0 outside training). A Dropout with a ratio and no training_mode then trains.
  bool training_export() const { return training_export_; }
  void set_training_export(bool v) { training_export_ = v; }
  // torch wrote the model: its BatchNorm's running variance is the batch's unbiased variance
  // (ONNX's own is the biased one).
  bool pytorch_export() const { return pytorch_export_; }
  void set_pytorch_export(bool v) { pytorch_export_ = v; }

  // Embedding tables whose lookups skip a padding row in their gradient, by initializer name,
  // where the export keeps no padding index (Importer::find_padding_rows).
  void set_padding_rows(std::map<std::string, int64_t> rows) { padding_rows_ = std::move(rows); }
  int64_t padding_row(const std::string& initializer) const {
    auto it = padding_rows_.find(initializer);
    return it == padding_rows_.end() ? -1 : it->second;
  }

  // Buffers the forward updates (BatchNorm's running statistics): the argument and its next
  // value, made module updates once the graph's outputs are set.
  void add_update(ValueId buffer, ValueId next) { updates_.emplace_back(buffer, next); }
  const std::vector<std::pair<ValueId, ValueId>>& updates() const { return updates_; }

  // ONNX names → IR values.
  void define(const std::string& onnx_name, ValueId id) { names_[onnx_name] = id; }
  ValueId lookup(const std::string& onnx_name) const;

  // ONNX sequences (SplitToSequence's output) → their tensors, read by SequenceAt at a known
  // position. memc has no sequence values: a sequence is its items, each an IR tensor.
  void define_sequence(const std::string& onnx_name, std::vector<ValueId> items) { sequences_[onnx_name] = std::move(items); }
  const std::vector<ValueId>* sequence(const std::string& onnx_name) const {
    auto it = sequences_.find(onnx_name);
    return it == sequences_.end() ? nullptr : &it->second;
  }

  // Values whose contents are known at import time.
  const Tensor* constant_of(ValueId v) const;
  // Adds a memc.constant holding `value` and records it as known.
  ValueId constant(Tensor value, const std::string& name_hint = "cst");
  ValueId scalar(double v, DType dtype);

  // ---- the node being lowered
  void begin_node(const onnx::NodeProto* node, int index);
  const onnx::NodeProto& node() const { return *node_; }
  int node_index() const { return node_index_; }
  const std::string& source() const { return source_; }
  const std::string& op_type() const { return node_->op_type(); }

  int num_inputs() const { return node_->input_size(); }
  int num_outputs() const { return node_->output_size(); }
  bool has_input(int i) const { return i >= 0 && i < node_->input_size() && !node_->input(i).empty(); }
  bool has_output(int i) const { return i >= 0 && i < node_->output_size() && !node_->output(i).empty(); }
  // The IR value of input i (must be present).
  Expected<ValueId> input(int i) const;
  const TensorType& type(ValueId v) const { return module_.value(v).type; }
  // The known contents of input i, or nullptr when it is computed at run time or absent.
  const Tensor* input_constant(int i) const;
  // Input i as a list of integers; fails (naming `what`) when it depends on runtime data.
  Expected<std::vector<int64_t>> input_ints(int i, const char* what) const;
  Expected<double> input_scalar(int i, const char* what) const;

  // Attributes of the current node.
  const onnx::AttributeProto* attr(const std::string& name) const;
  int64_t attr_int(const std::string& name, int64_t fallback) const;
  double attr_float(const std::string& name, double fallback) const;
  std::string attr_string(const std::string& name, const std::string& fallback) const;
  std::vector<int64_t> attr_ints(const std::string& name, std::vector<int64_t> fallback = {}) const;
  // An ONNX element-type attribute (EyeLike's and Bernoulli's `dtype`), or `fallback` without one.
  Expected<DType> attr_dtype(const std::string& name, DType fallback) const;
  bool has_attr(const std::string& name) const { return attr(name) != nullptr; }

  // Appends a node (folding it to constants when every input is known) and returns its outputs.
  Expected<std::vector<ValueId>> emit_multi(const std::string& op, std::vector<ValueId> inputs, Attrs attrs,
                                            int num_outputs);
  Expected<ValueId> emit(const std::string& op, std::vector<ValueId> inputs, Attrs attrs = {});
  // Common emitters.
  Expected<ValueId> reshape(ValueId x, const Shape& shape);
  Expected<ValueId> transpose(ValueId x, const std::vector<int64_t>& perm);
  Expected<ValueId> cast(ValueId x, DType to);
  // Ones of `shape` and `dtype` as a fill node, not a constant as large as the activation it
  // stands beside (Dropout's inference mask, Bernoulli's draws, a scatter's count).
  Expected<ValueId> ones(const Shape& shape, DType dtype);

  // Binds ONNX output i to `v` (naming the IR value after the ONNX output when it is new).
  Status bind(int i, ValueId v);
  // "<file>: node '<name>' (<OpType>, opset <N>): <msg>"
  Status error(const std::string& msg) const;

  int64_t normalize_axis(int64_t axis, int64_t rank, bool* ok) const;

 private:
  Module& module_;
  const ImportOptions& options_;
  std::string file_;
  int64_t opset_;
  bool training_export_ = false;
  bool pytorch_export_ = false;
  std::vector<std::pair<ValueId, ValueId>> updates_;
  std::map<std::string, int64_t> padding_rows_;
  std::unordered_map<std::string, ValueId> names_;
  std::unordered_map<std::string, std::vector<ValueId>> sequences_;
  std::unordered_map<ValueId, Tensor> constants_;
  const onnx::NodeProto* node_ = nullptr;
  int node_index_ = 0;
  std::string source_;
};

// Normalizes `axis` into [0, rank) or returns an error naming it.
Expected<int64_t> checked_axis(const ImportContext& ctx, int64_t axis, int64_t rank);
Expected<std::vector<int64_t>> checked_axes(const ImportContext& ctx, std::vector<int64_t> axes, int64_t rank);

}  // namespace memc
