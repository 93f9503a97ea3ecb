// cuDNN SDPA graphs (backends/cuda/cudnn_sdpa.h). Plain C++ over the header-only cuDNN frontend;
// compiled only into memc_cudnn_sdpa (cmake/cudnn_frontend.cmake), which defines the macro below:
// memc_core's glob of backends/cuda/*.cc sees an empty file where there is no frontend.
#ifdef MEMC_HAVE_CUDNN_FRONTEND
#include "backends/cuda/cudnn_sdpa.h"

#include <cudnn_frontend.h>

#include <cuda_runtime.h>

#include <array>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace memc::cuda {
namespace {

namespace fe = cudnn_frontend;
using Graph = fe::graph::Graph;
using TensorPtr = std::shared_ptr<fe::graph::Tensor_attributes>;

constexpr const char* kUnsupported = "not supported by cuDNN SDPA: ";

std::vector<int64_t> packed_strides(const std::vector<int64_t>& dims) {
  std::vector<int64_t> strides(dims.size(), 1);
  for (size_t i = dims.size() - 1; i > 0; --i) strides[i - 1] = strides[i] * dims[i];
  return strides;
}

fe::graph::Tensor_attributes packed(const char* name, int64_t uid, const std::vector<int64_t>& dims) {
  return fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(packed_strides(dims));
}

void set_packed_output(const TensorPtr& t, int64_t uid, const std::vector<int64_t>& dims) {
  t->set_output(true).set_uid(uid).set_dim(dims).set_stride(packed_strides(dims));
}

// The steps of an operand [B, H, T, E] stored in `layout`.
std::vector<int64_t> layout_strides(AttentionLayout layout, const std::vector<int64_t>& dims) {
  const std::array<int64_t, 4> steps = attention_steps(layout, dims[0], dims[1], dims[2], dims[3]);
  return {steps.begin(), steps.end()};
}

// q, k, v, o and their gradients, in the shape's layout.
fe::graph::Tensor_attributes operand(const SdpaShape& s, const char* name, int64_t uid, const std::vector<int64_t>& dims) {
  return fe::graph::Tensor_attributes().set_name(name).set_uid(uid).set_dim(dims).set_stride(layout_strides(s.layout, dims));
}
void set_operand_output(const SdpaShape& s, const TensorPtr& t, int64_t uid, const std::vector<int64_t>& dims) {
  t->set_output(true).set_uid(uid).set_dim(dims).set_stride(layout_strides(s.layout, dims));
}

// The shape checks the frontend leaves to the caller, and the storage types cuDNN takes. f32 is
// refused here, not by the frontend: its validate() passes f32 q/k/v/o (its composite node
// lowers them), but cuDNN's SDPA support matrix (frontend docs, Attention) lists bf16, f16 and
// fp8 engines only, so f32 attention stays on memc's own kernel.
Status check_shape(const SdpaShape& s) {
  if (s.batch <= 0 || s.heads <= 0 || s.tq <= 0 || s.tk <= 0 || s.d <= 0 || s.dv <= 0) {
    return Status::Internal(str_cat("cuDNN SDPA: non-positive dims B=", s.batch, " H=", s.heads, " Tq=", s.tq,
                                    " Tk=", s.tk, " D=", s.d, " Dv=", s.dv));
  }
  if (s.dropout < 0.f || s.dropout >= 1.f) return Status::Internal(str_cat("cuDNN SDPA: dropout ", s.dropout));
  switch (s.dtype) {
    case DType::kBF16:
    case DType::kF16: return Status::Ok();
    case DType::kF32: return Status::BadInput(str_cat(kUnsupported, "f32 (cuDNN attention takes bf16, f16 or fp8)"));
    default: return Status::BadInput(str_cat(kUnsupported, "a non-float-16 storage type"));
  }
}

// Dims of the operands shared by both graphs.
struct Dims {
  std::vector<int64_t> q, k, v, o, stats, bias;
};
Dims dims_of(const SdpaShape& s) {
  return Dims{.q = {s.batch, s.heads, s.tq, s.d},
              .k = {s.batch, s.heads, s.tk, s.d},
              .v = {s.batch, s.heads, s.tk, s.dv},
              .o = {s.batch, s.heads, s.tq, s.dv},
              .stats = {s.batch, s.heads, s.tq, 1},
              .bias = {s.batch, s.bias_broadcast_heads ? 1 : s.heads, s.bias_broadcast_rows ? 1 : s.tq, s.tk}};
}

// The target and the data types go on the graph before any node: a node copies the graph's
// context when it is added.
std::shared_ptr<Graph> new_graph(const SdpaShape& s, int sm_version) {
  auto graph = std::make_shared<Graph>();
  graph->set_io_data_type(s.dtype == DType::kF16 ? fe::DataType_t::HALF : fe::DataType_t::BFLOAT16)
      .set_intermediate_data_type(fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  if (sm_version > 0) graph->set_sm_version(sm_version);
  return graph;
}

// Bias, causal mask and dropout: the same settings on the forward's and the backward's attributes.
template <typename Attributes>
void add_masks(Graph& graph, const SdpaShape& s, const Dims& dims, Attributes& attributes) {
  if (s.has_bias) attributes.set_bias(graph.tensor(packed("bias", kSdpaBias, dims.bias)));
  if (s.causal) {
    attributes.set_diagonal_alignment(fe::DiagonalAlignment_t::TOP_LEFT).set_diagonal_band_right_bound(0);
  }
  if (s.dropout > 0.f) {
    auto seed = graph.tensor(packed("seed", kSdpaSeed, {1, 1, 1, 1}).set_data_type(fe::DataType_t::INT64));
    auto offset = graph.tensor(packed("offset", kSdpaOffset, {1, 1, 1, 1}).set_data_type(fe::DataType_t::INT64));
    attributes.set_dropout(s.dropout, seed, offset);
  }
}

// o, stats = softmax(scale·q·kᵀ + bias)·v with dropout, and each row's log-sum-exp.
void add_forward(Graph& graph, const SdpaShape& s) {
  const Dims dims = dims_of(s);
  auto q = graph.tensor(operand(s, "q", kSdpaQ, dims.q));
  auto k = graph.tensor(operand(s, "k", kSdpaK, dims.k));
  auto v = graph.tensor(operand(s, "v", kSdpaV, dims.v));
  auto attributes = fe::graph::SDPA_attributes().set_name("memc_attention").set_generate_stats(true).set_attn_scale(s.scale);
  add_masks(graph, s, dims, attributes);
  auto [o, stats] = graph.sdpa(q, k, v, attributes);
  set_operand_output(s, o, kSdpaO, dims.o);
  set_packed_output(stats, kSdpaStats, dims.stats);
  stats->set_data_type(fe::DataType_t::FLOAT);
}

// dq, dk, dv from the forward's o and stats and the output gradient do.
void add_backward(Graph& graph, const SdpaShape& s) {
  const Dims dims = dims_of(s);
  auto q = graph.tensor(operand(s, "q", kSdpaQ, dims.q));
  auto k = graph.tensor(operand(s, "k", kSdpaK, dims.k));
  auto v = graph.tensor(operand(s, "v", kSdpaV, dims.v));
  auto o = graph.tensor(operand(s, "o", kSdpaO, dims.o));
  auto d_o = graph.tensor(operand(s, "do", kSdpaDO, dims.o));
  auto stats = graph.tensor(packed("stats", kSdpaStats, dims.stats).set_data_type(fe::DataType_t::FLOAT));
  auto attributes = fe::graph::SDPA_backward_attributes().set_name("memc_attention_grad").set_attn_scale(s.scale);
  add_masks(graph, s, dims, attributes);
  auto [dq, dk, dv] = graph.sdpa_backward(q, k, v, o, d_o, stats, attributes);
  set_operand_output(s, dq, kSdpaDQ, dims.q);
  set_operand_output(s, dk, kSdpaDK, dims.k);
  set_operand_output(s, dv, kSdpaDV, dims.v);
}

// The frontend's refusals (GRAPH_NOT_SUPPORTED) are cuDNN saying no; anything else is memc
// building a malformed graph or a library failure.
Status status_of(fe::error_t error, const char* step) {
  if (error.is_good()) return Status::Ok();
  if (error.get_code() == fe::error_code_t::GRAPH_NOT_SUPPORTED) return Status::BadInput(kUnsupported + error.get_message());
  return Status::Internal(str_cat("cuDNN SDPA ", step, ": ", error.get_message()));
}

// The graph for `shape`, validated. The frontend throws where it finds no implementation at all.
Expected<std::shared_ptr<Graph>> validated_graph(const SdpaShape& shape, int sm_version, bool backward) {
  MEMC_RETURN_IF_ERROR(check_shape(shape));
  try {
    auto graph = new_graph(shape, sm_version);
    backward ? add_backward(*graph, shape) : add_forward(*graph, shape);
    MEMC_RETURN_IF_ERROR(status_of(graph->validate(), "validate"));
    return graph;
  } catch (const std::exception& e) {
    return Status::BadInput(str_cat(kUnsupported, e.what()));
  }
}

}  // namespace

Status validate_sdpa(const SdpaShape& shape, int sm_version, bool backward) {
  return validated_graph(shape, sm_version, backward).status();
}

Expected<int64_t> sdpa_workspace_bytes(const SdpaShape& shape, bool backward, cudnnContext* handle) {
  MEMC_ASSIGN_OR_RETURN(std::shared_ptr<Graph> graph, validated_graph(shape, 0, backward));
  try {
    MEMC_RETURN_IF_ERROR(status_of(graph->build_operation_graph(handle), "build_operation_graph"));
    MEMC_RETURN_IF_ERROR(status_of(graph->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans"));
    MEMC_RETURN_IF_ERROR(status_of(graph->check_support(), "check_support"));
    MEMC_RETURN_IF_ERROR(status_of(graph->build_plans(), "build_plans"));
    int64_t bytes = 0;
    MEMC_RETURN_IF_ERROR(status_of(graph->get_workspace_size(bytes), "get_workspace_size"));
    return bytes;
  } catch (const std::exception& e) {
    return Status::Internal(str_cat("cuDNN SDPA: ", e.what()));
  }
}

namespace {

// One cuDNN handle per device, made on first use there.
Expected<cudnnHandle_t> handle_for_current_device() {
  static std::map<int, cudnnHandle_t> handles;
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) return Status::Internal("cuDNN SDPA: no current CUDA device");
  cudnnHandle_t& h = handles[device];
  if (!h && cudnnCreate(&h) != CUDNN_STATUS_SUCCESS) {
    h = nullptr;
    return Status::BadInput(str_cat(kUnsupported, "cudnnCreate failed on device ", device));
  }
  return h;
}

std::string key_of(const SdpaShape& s, bool backward, int device) {
  return str_cat(device, backward ? "b" : "f", s.batch, ",", s.heads, ",", s.tq, ",", s.tk, ",", s.d, ",", s.dv, ",", static_cast<int>(s.dtype), ",",
                 s.has_bias, s.bias_broadcast_heads, s.bias_broadcast_rows, ",", s.scale, ",", s.causal, ",",
                 attention_layout_name(s.layout));
}

// A graph built for the device, with its workspace size; or why cuDNN cannot run the shape.
struct Built {
  std::shared_ptr<Graph> graph;
  int64_t workspace = 0;
  Status refusal = Status::Ok();
};

Built build(const SdpaShape& shape, bool backward, cudnnHandle_t handle) {
  Built b;
  Expected<std::shared_ptr<Graph>> graph = validated_graph(shape, 0, backward);
  if (!graph.ok()) return Built{nullptr, 0, graph.status()};
  try {
    Status st = status_of((*graph)->build_operation_graph(handle), "build_operation_graph");
    if (st.ok()) st = status_of((*graph)->create_execution_plans({fe::HeurMode_t::A}), "create_execution_plans");
    if (st.ok()) st = status_of((*graph)->check_support(), "check_support");
    if (st.ok()) st = status_of((*graph)->build_plans(), "build_plans");
    if (st.ok()) st = status_of((*graph)->get_workspace_size(b.workspace), "get_workspace_size");
    if (!st.ok()) return Built{nullptr, 0, st};
  } catch (const std::exception& e) {
    return Built{nullptr, 0, Status::BadInput(str_cat(kUnsupported, e.what()))};
  }
  b.graph = *graph;
  return b;
}

}  // namespace

Status run_sdpa(const SdpaShape& shape, bool backward, const SdpaPointers& p, void* workspace, int64_t workspace_bytes, void* stream) {
  if (shape.dropout > 0.f) return Status::BadInput(str_cat(kUnsupported, "dropout (memc draws its own masks)"));
  static std::mutex mutex;
  static std::unordered_map<std::string, Built> built;
  std::lock_guard<std::mutex> lock(mutex);
  MEMC_ASSIGN_OR_RETURN(cudnnHandle_t handle, handle_for_current_device());
  int device = 0;
  cudaGetDevice(&device);
  const std::string key = key_of(shape, backward, device);
  auto it = built.find(key);
  if (it == built.end()) it = built.emplace(key, build(shape, backward, handle)).first;
  const Built& b = it->second;
  if (!b.refusal.ok()) return b.refusal;
  if (b.workspace > workspace_bytes) {
    return Status::BadInput(str_cat(kUnsupported, "its engine wants ", b.workspace, " bytes of workspace, the plan has ", workspace_bytes));
  }
  std::unordered_map<int64_t, void*> pack = {{kSdpaQ, const_cast<void*>(p.q)}, {kSdpaK, const_cast<void*>(p.k)},
                                             {kSdpaV, const_cast<void*>(p.v)}, {kSdpaO, p.o}, {kSdpaStats, p.stats}};
  if (shape.has_bias) pack[kSdpaBias] = const_cast<void*>(p.bias);
  if (backward) {
    pack[kSdpaDO] = const_cast<void*>(p.d_o), pack[kSdpaDQ] = p.dq, pack[kSdpaDK] = p.dk, pack[kSdpaDV] = p.dv;
  }
  if (cudnnSetStream(handle, static_cast<cudaStream_t>(stream)) != CUDNN_STATUS_SUCCESS) {
    return Status::Internal("cuDNN SDPA: cudnnSetStream failed");
  }
  try {
    return status_of(b.graph->execute(handle, pack, workspace), "execute");
  } catch (const std::exception& e) {
    return Status::Internal(str_cat("cuDNN SDPA execute: ", e.what()));
  }
}

}  // namespace memc::cuda
#endif  // MEMC_HAVE_CUDNN_FRONTEND
