#include "worker/backend/cuda/projection_gemm.h"

#include "common/status.h"
#include "worker/kernels/cuda_check.h"
#include "worker/kernels/model_kernels.h"
#include "worker/kernels/small_gemm.h"

namespace lazyrag::cuda_backend {
namespace {

constexpr size_t kCublasWorkspaceBytes = size_t(32) << 20;  // NVIDIA's advice for Hopper

}  // namespace

ProjectionGemm::~ProjectionGemm() { Destroy(); }

void ProjectionGemm::Destroy() {
  if (cublas_ != nullptr) cublasDestroy(cublas_);
  cublas_ = nullptr;
}

absl::Status ProjectionGemm::Init(cudaStream_t stream) {
  stream_ = stream;
  LAZYRAG_RETURN_IF_CUBLAS_ERROR(cublasCreate(&cublas_));
  LAZYRAG_RETURN_IF_CUBLAS_ERROR(cublasSetStream(cublas_, stream_));
  RETURN_IF_ERROR(cublas_workspace_.Allocate(kCublasWorkspaceBytes));
  LAZYRAG_RETURN_IF_CUBLAS_ERROR(
      cublasSetWorkspace(cublas_, cublas_workspace_.data(), cublas_workspace_.size()));
  if (!use_small_gemm_) return absl::OkStatus();
  RETURN_IF_ERROR(small_workspace_.Allocate(size_t(kernels::kSmallGemmWorkspaceBytes)));
  LAZYRAG_RETURN_IF_CUDA_ERROR(
      cudaMemsetAsync(small_workspace_.data(), 0, small_workspace_.size(), stream_));
  return kernels::PrepareSmallGemm();  // occupancy queried before any graph
                                       // capture
}

absl::Status ProjectionGemm::Run(const uint16_t* x, const uint16_t* w, void* y, cudaDataType y_type,
                                 int rows, int n, int k) {
  if (rows == 0) return absl::OkStatus();
  const kernels::SmallGemmEpilogue epilogue =
      y_type == CUDA_R_32F ? kernels::SmallGemmEpilogue::kFloat : kernels::SmallGemmEpilogue::kBf16;
  if (use_small_gemm_ && kernels::CheckSmallGemmShape(rows, n, k, epilogue).ok()) {
    kernels::SmallGemmParams p;
    p.x = x;
    p.w = w;
    p.y = y;
    p.rows = rows;
    p.n = n;
    p.k = k;
    p.epilogue = epilogue;
    p.workspace = small_workspace_.data();
    p.workspace_bytes = int64_t(small_workspace_.size());
    p.programmatic = programmatic_;
    return kernels::SmallGemm(p, stream_);
  }
  const float alpha = 1.0f, beta = 0.0f;
  // Column-major view: y^T[n, rows] = w[n, k] (stored as k x n, transposed) * x^T[k, rows].
  LAZYRAG_RETURN_IF_CUBLAS_ERROR(cublasGemmEx(cublas_, CUBLAS_OP_T, CUBLAS_OP_N, n, rows, k, &alpha,
                                              w, CUDA_R_16BF, k, x, CUDA_R_16BF, k, &beta, y,
                                              y_type, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

absl::Status ProjectionGemm::GateUpSwiGlu(const uint16_t* x, const uint16_t* w_gate_up,
                                          uint16_t* gate_up, uint16_t* act, int rows, int ff,
                                          int k) {
  if (rows == 0) return absl::OkStatus();
  const auto fused = kernels::SmallGemmEpilogue::kSwiGluBf16;
  if (use_small_gemm_ && kernels::CheckSmallGemmShape(rows, 2 * ff, k, fused).ok()) {
    kernels::SmallGemmParams p;
    p.x = x;
    p.w = w_gate_up;
    p.y = act;
    p.rows = rows;
    p.n = 2 * ff;
    p.k = k;
    p.epilogue = fused;
    p.workspace = small_workspace_.data();
    p.workspace_bytes = int64_t(small_workspace_.size());
    p.programmatic = programmatic_;
    return kernels::SmallGemm(p, stream_);
  }
  RETURN_IF_ERROR(Run(x, w_gate_up, gate_up, CUDA_R_16BF, rows, 2 * ff, k));
  return cuda_model::LaunchSwiGlu({gate_up, act, rows, ff}, stream_);
}

}  // namespace lazyrag::cuda_backend
