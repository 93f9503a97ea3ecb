// GEMMs on CUDA through cuBLASLt: linear, matmul and convolution (backends/cuda/ops.h) call gemm().
//
// Layout: memc tensors are row-major; cuBLASLt is column-major. A row-major [R, C] matrix is a
// column-major [C, R] one, so y = x·op(w) is computed as yᵀ = op(w)ᵀ·xᵀ with the operands
// swapped: D (col-major N×R) = op(W) (N×K) · X (K×R). The bias epilogue adds a length-N vector
// to every column of D, i.e. to every row of y, as linear's bias does.
// Numerics: f32 computes in f32 (TF32 off, so results match the CPU within rounding of the
// summation order; `set_tf32(true)` allows it); bf16/f16 accumulate in f32, as the CPU kernels.
// Scratch: the node's planned workspace (backends/cuda/workspace.cc: 32 MiB on Hopper).
// Descriptors and the algorithm are made on a shape's first call and kept for the process.
#include <cublasLt.h>
#include <cuda_runtime.h>

#include <map>
#include <string>
#include <memory>
#include <mutex>

#include "backends/cuda/gemm.h"

namespace memc::cuda {
namespace {

bool g_tf32 = false;

Status check_lt(cublasStatus_t s, const char* what) {
  if (s == CUBLAS_STATUS_SUCCESS) return Status::Ok();
  return Status::Internal(str_cat("cuBLASLt ", what, ": status ", static_cast<int>(s)));
}

// One handle per process (per device once several are opened: issue 11's ranks own one each).
Expected<cublasLtHandle_t> handle() {
  static cublasLtHandle_t h = nullptr;
  if (!h) MEMC_RETURN_IF_ERROR(check_lt(cublasLtCreate(&h), "create"));
  return h;
}

Expected<cudaDataType_t> data_type(DType t) {
  switch (t) {
    case DType::kF32: return CUDA_R_32F;
    case DType::kBF16: return CUDA_R_16BF;
    case DType::kF16: return CUDA_R_16F;
    default: return Status::BadInput(str_cat("cuBLASLt GEMM: dtype ", dtype_name(t), " is not f32, bf16 or f16"));
  }
}

// Descriptors released on every path.
struct Descriptors {
  cublasLtMatmulDesc_t op = nullptr;
  cublasLtMatrixLayout_t a = nullptr, b = nullptr, d = nullptr;
  cublasLtMatmulPreference_t preference = nullptr;
  ~Descriptors() {
    if (preference) cublasLtMatmulPreferenceDestroy(preference);
    if (d) cublasLtMatrixLayoutDestroy(d);
    if (b) cublasLtMatrixLayoutDestroy(b);
    if (a) cublasLtMatrixLayoutDestroy(a);
    if (op) cublasLtMatmulDescDestroy(op);
  }
};

Status layout(cublasLtMatrixLayout_t* out, cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld, int64_t batch,
              int64_t stride) {
  MEMC_RETURN_IF_ERROR(check_lt(cublasLtMatrixLayoutCreate(out, type, rows, cols, ld), "layout"));
  if (batch > 1) {
    const int32_t count = static_cast<int32_t>(batch);
    MEMC_RETURN_IF_ERROR(check_lt(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_BATCH_COUNT, &count, sizeof(count)), "batch"));
    MEMC_RETURN_IF_ERROR(check_lt(cublasLtMatrixLayoutSetAttribute(*out, CUBLASLT_MATRIX_LAYOUT_STRIDED_BATCH_OFFSET, &stride, sizeof(stride)), "stride"));
  }
  return Status::Ok();
}

}  // namespace

void set_tf32(bool allowed) { g_tf32 = allowed; }

namespace {

// A GEMM's shape as cuBLASLt sees it: its descriptors and algorithm are made once per shape (and
// device, precision mode and workspace) and reused by every later call, so a step's launches do
// not each create descriptors and ask the heuristic again.
struct GemmKey {
  int device = 0;
  DType dtype = DType::kF32;
  bool tf32 = false, trans_a = false, trans_b = false, bias = false, accumulate = false, y_f32 = false;
  int bias_grad = 0;  // 0: none; 1: of a; 2: of b
  int64_t m = 0, n = 0, k = 0, batch = 1, stride_a = 0, stride_b = 0, stride_y = 0, lda = 0, ldb = 0, ldy = 0, workspace = 0;
  uint32_t align_a = 256, align_b = 256, align_y = 256;  // bytes every matrix of the operand starts on
  auto operator<=>(const GemmKey&) const = default;
};
struct Prepared {
  Descriptors desc;
  cublasLtMatmulAlgo_t algo{};
  size_t limit = 0;
  std::string refused;  // a bias-gradient epilogue cuBLASLt has no algorithm for (kept: asked once)
};

Status prepare(const GemmCall& c, const GemmKey& key, cublasLtHandle_t h, Prepared& p) {
  MEMC_ASSIGN_OR_RETURN(cudaDataType_t type, data_type(c.dtype));
  MEMC_ASSIGN_OR_RETURN(cudaDataType_t y_type, data_type(c.y_dtype()));
  const cublasComputeType_t compute = key.tf32 ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
  Descriptors& desc = p.desc;
  MEMC_RETURN_IF_ERROR(check_lt(cublasLtMatmulDescCreate(&desc.op, compute, CUDA_R_32F), "matmul desc"));
  // Column-major view (header): D[N×M] = op(B)[N×K] · op(A)[K×M], A and B swapped.
  const cublasOperation_t op_first = c.trans_b ? CUBLAS_OP_T : CUBLAS_OP_N;  // B (row-major [K,N] or [N,K])
  const cublasOperation_t op_second = c.trans_a ? CUBLAS_OP_T : CUBLAS_OP_N;  // A (row-major [M,K] or [K,M])
  MEMC_RETURN_IF_ERROR(check_lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSA, &op_first, sizeof(op_first)), "transa"));
  MEMC_RETURN_IF_ERROR(check_lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_TRANSB, &op_second, sizeof(op_second)), "transb"));
  if (key.bias) {
    const cublasLtEpilogue_t epilogue = CUBLASLT_EPILOGUE_BIAS;
    MEMC_RETURN_IF_ERROR(check_lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)), "epilogue"));
    MEMC_RETURN_IF_ERROR(check_lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias, sizeof(c.bias)), "bias"));
  }
  if (key.bias_grad) {
    // Column-major view: memc's a is cuBLASLt's B and memc's b its A. op(a)'s rows summed over k
    // are B's bias gradient (one per column of D); op(b)'s columns are A's (one per row of D).
    const cublasLtEpilogue_t epilogue = key.bias_grad == 1 ? CUBLASLT_EPILOGUE_BGRADB : CUBLASLT_EPILOGUE_BGRADA;
    MEMC_RETURN_IF_ERROR(check_lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof(epilogue)), "epilogue"));
    MEMC_RETURN_IF_ERROR(check_lt(cublasLtMatmulDescSetAttribute(desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias_grad, sizeof(c.bias_grad)), "bias gradient"));
  }
  // Stored column-major shapes: row-major B [K,N] is N×K (ld N); transposed, row-major [N,K] is
  // K×N (ld K). Likewise A [M,K] is K×M (ld K), or M×K (ld M) when transposed. A row step
  // (ldb, lda, ldy) replaces the packed ld.
  const int64_t b_rows = c.trans_b ? c.k : c.n, b_cols = c.trans_b ? c.n : c.k;
  const int64_t a_rows = c.trans_a ? c.m : c.k, a_cols = c.trans_a ? c.k : c.m;
  MEMC_RETURN_IF_ERROR(layout(&desc.a, type, b_rows, b_cols, c.ldb ? c.ldb : b_rows, c.batch, c.stride_b));
  MEMC_RETURN_IF_ERROR(layout(&desc.b, type, a_rows, a_cols, c.lda ? c.lda : a_rows, c.batch, c.stride_a));
  MEMC_RETURN_IF_ERROR(layout(&desc.d, y_type, c.n, c.m, c.ldy ? c.ldy : c.n, c.batch, c.stride_y ? c.stride_y : c.n * c.m));
  MEMC_RETURN_IF_ERROR(check_lt(cublasLtMatmulPreferenceCreate(&desc.preference), "preference"));
  p.limit = static_cast<size_t>(key.workspace);
  MEMC_RETURN_IF_ERROR(check_lt(cublasLtMatmulPreferenceSetAttribute(desc.preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &p.limit, sizeof(p.limit)), "workspace"));
  // The heuristic assumes 256-byte-aligned matrices unless told otherwise; an attention chunk's
  // operands (an entry's offset, a head's row step) may be aligned less.
  const std::pair<cublasLtMatmulPreferenceAttributes_t, uint32_t> alignments[] = {
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, key.align_b}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, key.align_a},
      {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, key.align_y}, {CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, key.align_y}};
  for (const auto& [attribute, bytes] : alignments) {
    MEMC_RETURN_IF_ERROR(check_lt(cublasLtMatmulPreferenceSetAttribute(desc.preference, attribute, &bytes, sizeof(bytes)), "alignment"));
  }
  cublasLtMatmulHeuristicResult_t result{};
  int found = 0;
  const cublasStatus_t asked = cublasLtMatmulAlgoGetHeuristic(h, desc.op, desc.a, desc.b, desc.d, desc.d, desc.preference, 1, &result, &found);
  if (key.bias_grad && (asked != CUBLAS_STATUS_SUCCESS || found == 0)) {
    p.refused = str_cat("cuBLASLt offers no algorithm for ", c.m, "x", c.n, "x", c.k, " with the bias-gradient epilogue (status ",
                        static_cast<int>(asked), ")");
    return Status::Ok();
  }
  MEMC_RETURN_IF_ERROR(check_lt(asked, "heuristic"));
  if (found == 0) return Status::Internal(str_cat("cuBLASLt found no algorithm for ", c.m, "x", c.n, "x", c.k, " within ", key.workspace, " bytes of workspace"));
  p.algo = result.algo;
  return Status::Ok();
}

// The alignment every matrix of an operand starts on, in bytes (at most 256): the largest power
// of two dividing its address and its batch stride. (Row steps are the layouts' leading
// dimensions, which the heuristic reads itself.)
uint32_t alignment(const void* data, int64_t batch_stride, DType dtype) {
  const uint64_t bits = reinterpret_cast<uintptr_t>(data) | 256 | static_cast<uint64_t>(batch_stride) * dtype_size(dtype);
  return static_cast<uint32_t>(bits & (~bits + 1));
}

// The prepared form of `c`, made on its shape's first call.
Expected<Prepared*> prepared(const GemmCall& c, int64_t workspace_bytes, cublasLtHandle_t h) {
  GemmKey key{.dtype = c.dtype, .tf32 = c.dtype == DType::kF32 && g_tf32, .trans_a = c.trans_a, .trans_b = c.trans_b, .bias = c.bias != nullptr,
              .accumulate = c.accumulate, .y_f32 = c.y_f32,
              .bias_grad = c.bias_grad ? 1 + c.bias_grad_of : 0, .m = c.m, .n = c.n, .k = c.k, .batch = c.batch, .stride_a = c.stride_a, .stride_b = c.stride_b,
              .stride_y = c.stride_y, .lda = c.lda, .ldb = c.ldb, .ldy = c.ldy, .workspace = workspace_bytes,
              .align_a = alignment(c.a, c.batch > 1 ? c.stride_a : 0, c.dtype),
              .align_b = alignment(c.b, c.batch > 1 ? c.stride_b : 0, c.dtype),
              .align_y = alignment(c.y, c.batch > 1 ? (c.stride_y ? c.stride_y : c.m * c.n) : 0, c.y_dtype())};
  if (cudaGetDevice(&key.device) != cudaSuccess) return Status::Internal("cuBLASLt GEMM: cudaGetDevice failed");
  static std::mutex mutex;
  static std::map<GemmKey, std::unique_ptr<Prepared>> cache;
  std::lock_guard<std::mutex> lock(mutex);
  std::unique_ptr<Prepared>& slot = cache[key];
  if (!slot) {
    auto made = std::make_unique<Prepared>();
    if (Status st = prepare(c, key, h, *made); !st.ok()) {
      cache.erase(key);
      return st;
    }
    slot = std::move(made);
  }
  return slot.get();
}

}  // namespace

Status gemm(const GemmCall& c, void* workspace, int64_t workspace_bytes, void* stream) {
  if (c.m == 0 || c.n == 0 || c.batch == 0) return Status::Ok();
  MEMC_ASSIGN_OR_RETURN(cublasLtHandle_t h, handle());
  if (c.bias_grad && (c.batch != 1 || c.bias)) return Status::BadInput("cuBLASLt GEMM: a bias gradient needs one matrix and no bias");
  MEMC_ASSIGN_OR_RETURN(Prepared* p, prepared(c, workspace_bytes, h));
  if (!p->refused.empty()) return Status::BadInput(p->refused);
  if (c.bias_grad) MEMC_RETURN_IF_ERROR(check_lt(cublasLtMatmulDescSetAttribute(p->desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias_grad, sizeof(c.bias_grad)), "bias gradient"));
  // The bias lives where this call's node has it: the one attribute set per call.
  if (c.bias) MEMC_RETURN_IF_ERROR(check_lt(cublasLtMatmulDescSetAttribute(p->desc.op, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &c.bias, sizeof(c.bias)), "bias"));
  const float alpha = 1.f, beta = c.accumulate ? 1.f : 0.f;  // C is D: matmul_acc adds into y
  const cublasStatus_t done = cublasLtMatmul(h, p->desc.op, &alpha, c.b, p->desc.a, c.a, p->desc.b, &beta, c.y, p->desc.d, c.y,
                                             p->desc.d, &p->algo, workspace, p->limit, static_cast<cudaStream_t>(stream));
  if (c.bias_grad && (done == CUBLAS_STATUS_NOT_SUPPORTED || done == CUBLAS_STATUS_INVALID_VALUE)) {
    // The heuristic's algorithm refused the epilogue at launch (nothing was queued): remember it,
    // and the op runs its fallback from now on.
    p->refused = str_cat("cuBLASLt refused the bias-gradient epilogue for ", c.m, "x", c.n, "x", c.k, " (status ", static_cast<int>(done), ")");
    return Status::BadInput(p->refused);
  }
  return check_lt(done, "matmul");
}

}  // namespace memc::cuda
