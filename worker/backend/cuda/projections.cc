#include "worker/backend/cuda/projections.h"

#include "common/status.h"
#include "worker/kernels/cuda_check.h"
#include "worker/kernels/gemv.h"
#include "worker/kernels/model_kernels.h"
#include "worker/kernels/wgmma_gemm.h"

namespace lazyrag::cuda_backend {
namespace {

constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;  // NVIDIA's advice for Hopper

// The GEMV's operands for y[n] = w[n, k] x[k] (with swiglu: n = ff outputs of 2 ff rows).
cuda_model::GemvParams OneRow(const uint16_t* x, const uint16_t* w, void* y, bool y_fp32,
                              bool swiglu, int n, int k) {
  cuda_model::GemvParams g;
  g.w = w;
  g.x = x;
  g.y = y;
  g.y_fp32 = y_fp32;
  g.swiglu = swiglu;
  g.n = n;
  g.k = k;
  return g;
}

// The wgmma kernel's operands for y[rows, n] = x[rows, k] w[n, k]^T (bf16 y unless set after).
kernels::WgmmaGemmParams Rows(const uint16_t* x, const uint16_t* w, void* y, int rows, int n,
                              int k) {
  kernels::WgmmaGemmParams g;
  g.x = x;
  g.w = w;
  g.y = y;
  g.rows = rows;
  g.n = n;
  g.k = k;
  return g;
}

}  // namespace

Projections::~Projections() {
  if (cublas_ != nullptr) cublasDestroy(cublas_);
}

absl::Status Projections::Init(cudaStream_t stream, int wgmma_gemm) {
  stream_ = stream;
  int device = 0;
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  LAZYRAG_RETURN_IF_CUDA_ERROR(
      cudaDeviceGetAttribute(&sms_, cudaDevAttrMultiProcessorCount, device));
  wgmma_gemm_ = wgmma_gemm > 0 && kernels::WgmmaGemmSupported() ? wgmma_gemm : 0;
  LAZYRAG_RETURN_IF_CUBLAS_ERROR(cublasCreate(&cublas_));
  LAZYRAG_RETURN_IF_CUBLAS_ERROR(cublasSetStream(cublas_, stream_));
  RETURN_IF_ERROR(workspace_.Allocate(kCublasWorkspaceBytes));
  LAZYRAG_RETURN_IF_CUBLAS_ERROR(cublasSetWorkspace(cublas_, workspace_.data(), workspace_.size()));
  return absl::OkStatus();
}

absl::Status Projections::Gemm(const uint16_t* x, const uint16_t* w, void* y, cudaDataType y_type,
                               int rows, int n, int k) {
  return Project(x, w, y, y_type, rows, n, k, false);
}

absl::Status Projections::Qkv(const uint16_t* x, const uint16_t* w, float* y, int rows, int n,
                              int k) {
  return Project(x, w, y, CUDA_R_32F, rows, n, k, /*any_shape=*/rows >= 2);
}

absl::Status Projections::Project(const uint16_t* x, const uint16_t* w, void* y,
                                  cudaDataType y_type, int rows, int n, int k, bool any_shape) {
  if (rows == 0) return absl::OkStatus();
  if (rows == 1) {  // one token: the GEMV reads the weights closer to the HBM roof (gemv.h)
    const cuda_model::GemvParams g = OneRow(x, w, y, y_type == CUDA_R_32F, false, n, k);
    if (cuda_model::GemvPreferred(g)) return cuda_model::LaunchGemv(g, stream_);
  }
  if (UseWgmma(x, w, rows, n, k, false, any_shape)) {
    kernels::WgmmaGemmParams g = Rows(x, w, y, rows, n, k);
    g.y_fp32 = y_type == CUDA_R_32F;
    return kernels::LaunchWgmmaGemm(g, stream_);
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
    const cuda_model::GemvParams g = OneRow(x, w, act, false, true, ff, k);
    if (cuda_model::GemvPreferred(g)) return cuda_model::LaunchGemv(g, stream_);
  }
  if (UseWgmma(x, w, rows, 2 * ff, k, true)) {  // SwiGLU fused: no gate_up round trip
    kernels::WgmmaGemmParams g = Rows(x, w, act, rows, 2 * ff, k);
    g.swiglu = true;
    return kernels::LaunchWgmmaGemm(g, stream_);
  }
  RETURN_IF_ERROR(Gemm(x, w, gate_up, CUDA_R_16BF, rows, 2 * ff, k));
  return cuda_model::LaunchSwiGlu({gate_up, act, rows, ff}, stream_);
}

bool Projections::UseWgmma(const void* x, const void* w, int rows, int n, int k, bool swiglu,
                           bool any_shape) const {
  if (wgmma_gemm_ == 0 || rows < 1 || !kernels::WgmmaGemmShapeOk(rows, n, k, swiglu)) return false;
  if (reinterpret_cast<uintptr_t>(x) % 16 != 0 || reinterpret_cast<uintptr_t>(w) % 16 != 0) {
    return false;
  }
  return wgmma_gemm_ == 2 || any_shape || kernels::WgmmaGemmBlocks(n, swiglu, 128) >= sms_;
}

bool Projections::FoldsFfnNorm(int rows, int hidden, int q_dim, int ff) const {
  return wgmma_gemm_ != 0 && rows >= 2 && rows <= kernels::kWgmmaGemmMaxRows &&
         kernels::WgmmaGemmShapeOk(rows, hidden, q_dim, false) &&
         kernels::WgmmaGemmShapeOk(rows, 2 * ff, hidden, true);
}

absl::Status Projections::WgmmaToResidual(const uint16_t* x, const uint16_t* w, int rows, int n,
                                          int k, const kernels::WgmmaResidualOut& out, int* parts) {
  kernels::WgmmaGemmParams g = Rows(x, w, nullptr, rows, n, k);
  g.residual_out = out;
  *parts = kernels::WgmmaGemmNormParts(g);
  return kernels::LaunchWgmmaGemm(g, stream_);
}

absl::Status Projections::GateUpSwiGluNormed(const uint16_t* x, const kernels::WgmmaNormIn& norm,
                                             const uint16_t* w, uint16_t* act, int rows, int ff,
                                             int k) {
  kernels::WgmmaGemmParams g = Rows(x, w, act, rows, 2 * ff, k);
  g.swiglu = true;
  g.norm_in = norm;
  return kernels::LaunchWgmmaGemm(g, stream_);
}

bool Projections::FoldsQkvNorm(int rows, int n, int hidden) const {
  return wgmma_gemm_ != 0 && rows >= 2 && rows <= kernels::kWgmmaGemmMaxRows &&
         kernels::WgmmaGemmShapeOk(rows, n, hidden, false);
}

absl::Status Projections::QkvNormed(const uint16_t* x, const kernels::WgmmaNormIn& norm,
                                    const uint16_t* w, float* y, int rows, int n, int k) {
  kernels::WgmmaGemmParams g = Rows(x, w, y, rows, n, k);
  g.y_fp32 = true;
  g.norm_in = norm;
  return kernels::LaunchWgmmaGemm(g, stream_);
}

bool Projections::OneRowNormsFold(int hidden, int q_dim, int kv_dim, int head_dim, int ff) {
  static uint16_t* const aligned = reinterpret_cast<uint16_t*>(uintptr_t(1) << 20);
  const auto gemv = [](int n, int k, bool swiglu) {
    return cuda_model::GemvPreferred(OneRow(aligned, aligned, aligned, false, swiglu, n, k));
  };
  cuda_model::GemvParams qkv =
      OneRow(aligned, aligned, nullptr, false, false, q_dim + 2 * kv_dim, hidden);
  cuda_model::GemvQkvOut& split = qkv.qkv_out;
  split.rope = reinterpret_cast<const float*>(aligned);
  split.kv_slot = reinterpret_cast<const int64_t*>(aligned);
  split.q = split.k_cache = split.v_cache = aligned;
  split.q_dim = q_dim;
  split.kv_dim = kv_dim;
  split.head_dim = head_dim;
  return cuda_model::GemvPreferred(qkv) && gemv(hidden, q_dim, false) && gemv(ff, hidden, true) &&
         gemv(hidden, ff, false);
}

absl::Status Projections::GemvToResidual(const uint16_t* x, const uint16_t* w, int n, int k,
                                         const cuda_model::GemvResidualOut& out) {
  cuda_model::GemvParams g = OneRow(x, w, nullptr, false, false, n, k);
  g.residual_out = out;
  return cuda_model::LaunchGemv(g, stream_);
}

absl::Status Projections::GemvFromResidual(const uint16_t* x, const cuda_model::GemvNormIn& norm,
                                           const uint16_t* w, void* y, cudaDataType y_type,
                                           bool swiglu, int n, int k) {
  cuda_model::GemvParams g = OneRow(x, w, y, y_type == CUDA_R_32F, swiglu, n, k);
  g.norm_in = norm;
  return cuda_model::LaunchGemv(g, stream_);
}

absl::Status Projections::GemvQkv(const uint16_t* x, const cuda_model::GemvNormIn& norm,
                                  const uint16_t* w, int k, const cuda_model::GemvQkvOut& out) {
  cuda_model::GemvParams g = OneRow(x, w, nullptr, false, false, out.q_dim + 2 * out.kv_dim, k);
  g.norm_in = norm;
  g.qkv_out = out;
  return cuda_model::LaunchGemv(g, stream_);
}

}  // namespace lazyrag::cuda_backend
