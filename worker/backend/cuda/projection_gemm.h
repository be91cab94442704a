// The forward step's projections, y[rows, n] = x[rows, k] * w[n, k]^T (bf16 inputs, fp32
// accumulation): cuBLAS, or (use_small_gemm) kernels::SmallGemm for rows <= 64 on the shapes it
// takes and cuBLAS for the rest (issue 29; measured slower than cuBLAS on the Llama-3-8B shapes
// on 2026-12-04, so the backend's default is cuBLAS: bench/README.md). Queues work on one stream
// only: no allocation or synchronization per call, so steps that use it can be captured into
// CUDA graphs. Not thread-safe (the backend calls it under its mutex).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "worker/backend/cuda/device_buffers.h"

namespace lazyrag::cuda_backend {

class ProjectionGemm {
 public:
  // `use_small_gemm` false: cuBLAS for every shape (CudaBackendOptions::small_gemm);
  // `programmatic`: kernels::SmallGemmParams::programmatic (CudaBackendOptions::small_gemm_pdl).
  ProjectionGemm(bool use_small_gemm, bool programmatic)
      : use_small_gemm_(use_small_gemm), programmatic_(programmatic) {}
  ~ProjectionGemm();
  ProjectionGemm(const ProjectionGemm&) = delete;
  ProjectionGemm& operator=(const ProjectionGemm&) = delete;

  // On the current device: the cuBLAS handle on `stream` and both workspaces.
  absl::Status Init(cudaStream_t stream);
  // Destroys the cuBLAS handle (before the stream goes); the destructor calls it too.
  void Destroy();

  // y of y_type (CUDA_R_32F or CUDA_R_16BF): [rows, n].
  absl::Status Run(const uint16_t* x, const uint16_t* w, void* y, cudaDataType y_type, int rows,
                   int n, int k);

  // act[rows, ff] = bf16(silu(g) * u) with [g | u] = x * w_gate_up^T rounded to bf16
  // (cuda_model::LaunchSwiGlu's contract): one fused SmallGemm where it takes the shape, else the
  // projection into gate_up ([rows, 2 ff] bf16 scratch) and LaunchSwiGlu.
  absl::Status GateUpSwiGlu(const uint16_t* x, const uint16_t* w_gate_up, uint16_t* gate_up,
                            uint16_t* act, int rows, int ff, int k);

 private:
  const bool use_small_gemm_;
  const bool programmatic_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer cublas_workspace_;
  DeviceBuffer small_workspace_;  // kernels::SmallGemm's counters (zeroed once)
                                  // and partials
};

}  // namespace lazyrag::cuda_backend
