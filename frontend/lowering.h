// One lowering function per ONNX op (default domain), split by family:
// lower_elementwise.cc, lower_shape.cc, lower_nn.cc, lower_pool.cc, lower_rnn.cc. Each reads the current node from the
// context, emits core ops and binds the node's outputs.
#pragma once
#include <map>
#include <string>

#include "frontend/import_context.h"

namespace memc {

using LowerFn = Status (*)(ImportContext& ctx);
using LoweringTable = std::map<std::string, LowerFn>;

void add_elementwise_lowerings(LoweringTable& table);
void add_shape_lowerings(LoweringTable& table);
void add_nn_lowerings(LoweringTable& table);
void add_pool_lowerings(LoweringTable& table);
void add_rnn_lowerings(LoweringTable& table);  // lower_rnn.cc: LSTM, GRU, RNN unrolled

// A BatchNormalization that normalizes with its batch's statistics (ONNX's training_mode, its
// running statistics' outputs, or the dynamo exporter's FX node of a module in train()) and
// updates its running statistics (momentum other than ONNX's 1, PyTorch's 0).
bool updates_running_statistics(const onnx::NodeProto& node);

// Every lowering, by ONNX op type.
const LoweringTable& onnx_lowerings();

}  // namespace memc
