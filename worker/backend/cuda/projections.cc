#include "worker/backend/cuda/projections.h"

#include "common/status.h"
#include "worker/kernels/cuda_check.h"
#include "worker/kernels/gemv.h"

namespace lazyrag::cuda_backend {
namespace {

constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;  // NVIDIA's advice for Hopper

// A 256-byte aligned stand-in for device pointers: GemvPreferred looks only at alignment.
uint16_t* const kAligned = reinterpret_cast<uint16_t*>(uintptr_t(1) << 20);

bool OneRowPreferred(int n, int k) {
  cuda_model::GemvParams g;
  g.w = g.x = kAligned;
  g.y = kAligned;
  g.n = n;
  g.k = k;
  return cuda_model::GemvPreferred(g);
}

}  // namespace

bool OneRowFusionApplies(const ModelConfig& c, bool tensor_parallel) {
  const int d = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.intermediate_size;
  return !tensor_parallel && c.head_dim % 2 == 0 && d % 4 == 0 && d <= 8192 &&
         OneRowPreferred(qd + 2 * kvd, d) && OneRowPreferred(d, qd) && OneRowPreferred(d, ff);
}

Projections::~Projections() {
  if (cublas_ != nullptr) cublasDestroy(cublas_);
}

absl::Status Projections::Init(const ModelConfig& c, bool tensor_parallel, cudaStream_t stream) {
  stream_ = stream;
  LAZYRAG_RETURN_IF_CUBLAS_ERROR(cublasCreate(&cublas_));
  LAZYRAG_RETURN_IF_CUBLAS_ERROR(cublasSetStream(cublas_, stream_));
  RETURN_IF_ERROR(workspace_.Allocate(kCublasWorkspaceBytes));
  LAZYRAG_RETURN_IF_CUBLAS_ERROR(cublasSetWorkspace(cublas_, workspace_.data(), workspace_.size()));
  RETURN_IF_ERROR(counter_.Allocate(sizeof(unsigned)));
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(counter_.data(), 0, sizeof(unsigned), stream_));
  fuses_one_row_ = OneRowFusionApplies(c, tensor_parallel);
  return absl::OkStatus();
}

absl::Status Projections::Gemm(const uint16_t* x, const uint16_t* w, void* y, cudaDataType y_type,
                               int rows, int n, int k) {
  if (rows == 0) return absl::OkStatus();
  if (rows == 1) {  // one token: the GEMV reads the weights closer to the HBM roof (gemv.h)
    cuda_model::GemvParams g;
    g.w = w;
    g.x = x;
    g.y = y;
    g.y_fp32 = y_type == CUDA_R_32F;
    g.n = n;
    g.k = k;
    if (cuda_model::GemvPreferred(g)) return cuda_model::LaunchGemv(g, stream_);
  }
  const float alpha = 1.0f, beta = 0.0f;
  // Column-major view: y^T[n, rows] = w[n, k] (stored as k x n, transposed) * x^T[k, rows].
  LAZYRAG_RETURN_IF_CUBLAS_ERROR(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &alpha,
                                              w, CUDA_R_16BF, k, x, CUDA_R_16BF, k, &beta, y,
                                              y_type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::Status Projections::GateUpSwiGlu(const uint16_t* x, const uint16_t* w, uint16_t* gate_up,
                                       uint16_t* act, int rows, int ff, int k) {
  if (rows == 1) {  // the GEMV with SwiGLU fused: no gate_up round trip, one launch less
    cuda_model::GemvParams g;
    g.w = w;
    g.x = x;
    g.y = act;
    g.swiglu = true;
    g.n = ff;
    g.k = k;
    if (cuda_model::GemvPreferred(g)) return cuda_model::LaunchGemv(g, stream_);
  }
  RETURN_IF_ERROR(Gemm(x, w, gate_up, CUDA_R_16BF, rows, 2 * ff, k));
  return cuda_model::LaunchSwiGlu({gate_up, act, rows, ff}, stream_);
}

absl::Status Projections::QkvScatterOneRow(const uint16_t* x, const uint16_t* w,
                                           const cuda_model::QkvScatterParams& scatter, int n,
                                           int k) {
  cuda_model::GemvParams g;
  g.w = w;
  g.x = x;
  g.qkv_scatter = true;
  g.scatter = scatter;
  g.scatter.qkv = nullptr;
  g.n = n;
  g.k = k;
  return cuda_model::LaunchGemv(g, stream_);
}

absl::Status Projections::ProjectThenNormOneRow(const uint16_t* x, const uint16_t* w, uint16_t* y,
                                                int n, int k,
                                                const cuda_model::RmsNormParams& norm) {
  cuda_model::GemvParams g;
  g.w = w;
  g.x = x;
  g.y = y;
  g.then_norm = true;
  g.norm = norm;
  g.counter = reinterpret_cast<unsigned*>(counter_.data());
  g.n = n;
  g.k = k;
  return cuda_model::LaunchGemv(g, stream_);
}

}  // namespace lazyrag::cuda_backend
