// The IR: a Module is one function over static-shaped values. Nodes are kept in schedule
// order; values and nodes are addressed by dense integer ids so passes can copy and index.
#pragma once
#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "ir/attr.h"
#include "ir/dtype.h"
#include "ir/tensor.h"
#include "support/status.h"

namespace memc {

enum class Role : uint8_t {
  kInput,          // data fed per step (images, tokens, labels)
  kParam,          // trainable weight
  kConstant,       // produced by memc.constant
  kActivation,     // computed in forward
  kGrad,           // gradient of a parameter or activation
  kOptimizerState, // moments, velocities
  kMasterWeight,   // fp32 copy under mixed precision
  kScalar,         // per-step runtime scalar (lr, step, loss scale)
  kBuffer,         // model state the forward updates, not trained (BatchNorm's running statistics)
};
// The model's own state, loaded from and written back to its initializers: parameters and buffers.
inline bool is_model_state(Role r) { return r == Role::kParam || r == Role::kBuffer; }
enum class MemSpace : uint8_t { kDevice, kHost };

std::string_view role_name(Role r);
std::optional<Role> parse_role(std::string_view s);
std::string_view space_name(MemSpace s);

struct TensorType {
  DType dtype = DType::kF32;
  Shape shape;
  bool operator==(const TensorType&) const = default;
  int64_t numel() const { return memc::numel(shape); }
  int64_t bytes() const { return numel() * static_cast<int64_t>(dtype_size(dtype)); }
};
std::string type_str(const TensorType& t);  // tensor<2x3xf32>

using ValueId = int32_t;
using NodeId = int32_t;
constexpr ValueId kNoValue = -1;
constexpr NodeId kNoNode = -1;

struct Value {
  ValueId id = kNoValue;
  std::string name;         // unique printable name (MLIR suffix-id charset)
  std::string source_name;  // the ONNX name it came from, for messages and weight lookup
  TensorType type;
  Role role = Role::kActivation;
  MemSpace space = MemSpace::kDevice;
  NodeId producer = kNoNode;  // kNoNode for function arguments
};

struct OpDef;  // ir/op_registry.h

struct Node {
  NodeId id = kNoNode;
  std::string op;  // registry name without the "memc." prefix, e.g. "matmul"
  // The op's registry entry, set when the node is added (nullptr: no such op; the verifier
  // says so). Passes read flags and rules through it instead of looking `op` up.
  const OpDef* def = nullptr;
  std::vector<ValueId> inputs;  // kNoValue marks an absent optional input
  std::vector<ValueId> outputs;
  Attrs attrs;
  std::string source;  // ONNX node name and op, for error messages
  bool dead = false;
};

// Who reads each value: the live nodes reading it, in schedule order (a node reading a value
// twice is listed twice). One array for all values: a rewrite pass that asks once per match
// builds it in one pass over the nodes, with two allocations.
class Users {
 public:
  std::span<const NodeId> operator[](ValueId v) const {
    return {readers_.data() + start_[v], readers_.data() + start_[v + 1]};
  }
  size_t size() const { return start_.empty() ? 0 : start_.size() - 1; }

 private:
  friend class Module;
  std::vector<int32_t> start_;  // by ValueId, and one past the last: where its readers begin
  std::vector<NodeId> readers_;
};

class Module {
 public:
  // Function arguments (inputs, params, scalars) in declaration order.
  ValueId add_argument(const std::string& name, TensorType type, Role role);
  // Drops an argument nothing reads any more (its value goes at the next compact()); fails on
  // one still in use.
  Status remove_argument(ValueId arg);
  // Appends a node whose output types come from the op's shape function.
  // Fails (bad input) when the op rejects its inputs; the message names the op.
  Expected<std::vector<ValueId>> add_node(const std::string& op, std::vector<ValueId> inputs,
                                          Attrs attrs = {}, const std::string& source = "",
                                          int num_outputs = -1);
  // Appends a node with explicit output types (the parser and tests use this).
  NodeId add_node_typed(const std::string& op, std::vector<ValueId> inputs, Attrs attrs,
                        std::vector<TensorType> output_types, std::vector<std::string> output_names,
                        const std::string& source = "");
  ValueId add_constant(Tensor value, const std::string& name_hint = "cst");

  const Value& value(ValueId id) const { return values_.at(id); }
  Value& value(ValueId id) { return values_.at(id); }
  const Node& node(NodeId id) const { return nodes_.at(id); }
  Node& node(NodeId id) { return nodes_.at(id); }
  const std::vector<Value>& values() const { return values_; }
  const std::vector<Node>& nodes() const { return nodes_; }
  // Live nodes in schedule order.
  std::vector<NodeId> schedule() const;
  const std::vector<ValueId>& arguments() const { return arguments_; }
  const std::vector<ValueId>& outputs() const { return outputs_; }
  void set_outputs(std::vector<ValueId> outputs) {
    outputs_ = std::move(outputs);
    output_updates_.assign(outputs_.size(), kNoValue);
  }
  // Appends an output that replaces argument `arg` after each step (a parameter or optimizer
  // state updated in place). The runtime writes it back; the planner may alias the buffers.
  void add_update(ValueId arg, ValueId new_value) {
    outputs_.push_back(new_value);
    output_updates_.resize(outputs_.size(), kNoValue);
    output_updates_.back() = arg;
  }
  void set_output_update(size_t output_index, ValueId arg) {
    output_updates_.resize(outputs_.size(), kNoValue);
    output_updates_.at(output_index) = arg;
  }
  // Keeps the first `count` plain outputs and every update.
  void keep_outputs(size_t count);
  // For each output, the argument it updates, or kNoValue for a plain result.
  const std::vector<ValueId>& output_updates() const { return output_updates_; }
  void set_schedule(const std::vector<NodeId>& order);
  // Moves node n to right before `anchor` in the schedule; out of it where `anchor` is dead or
  // not scheduled.
  void move_before(NodeId n, NodeId anchor);

  ValueId find_value(const std::string& name) const;  // by IR name; kNoValue if absent
  std::string unique_name(const std::string& hint);
  void rename(ValueId id, const std::string& hint);

  // Rewrites every use of `from` (node inputs and module outputs) to `to`.
  void replace_all_uses(ValueId from, ValueId to);
  // The same where the caller knows the readers (a Users entry taken since `from` was last given
  // a new reader): only `readers` and the module outputs are visited, not every node.
  void replace_uses(ValueId from, ValueId to, std::span<const NodeId> readers);
  // Marks nodes whose outputs reach no module output as dead; returns how many.
  int eliminate_dead_nodes();
  // Drops dead nodes and unused values, renumbering ids densely.
  void compact();
  // The live nodes reading each value (recomputed on demand).
  Users users() const;

  // Weights of kParam arguments, by value id. Absent entries mark skeleton weights.
  // Module-level facts (source file, opset, producer), printed as func attributes.
  Attrs& metadata() { return metadata_; }
  const Attrs& metadata() const { return metadata_; }

  std::unordered_map<ValueId, Tensor>& weights() { return weights_; }
  const std::unordered_map<ValueId, Tensor>& weights() const { return weights_; }

 private:
  ValueId new_value(const std::string& name_hint, TensorType type, Role role);
  std::vector<Value> values_;
  std::vector<Node> nodes_;
  std::vector<NodeId> order_;  // schedule: node ids
  std::vector<ValueId> arguments_;
  std::vector<ValueId> outputs_;
  std::vector<ValueId> output_updates_;
  std::unordered_map<std::string, ValueId> by_name_;
  std::unordered_map<std::string, int> next_suffix_;  // unique_name: the next suffix to try per base
  std::unordered_map<ValueId, Tensor> weights_;
  Attrs metadata_;
};

// Makes a string a valid MLIR value name: [A-Za-z_$.-][A-Za-z0-9_$.-]* or digits.
std::string sanitize_name(const std::string& raw);

}  // namespace memc
