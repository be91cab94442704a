// The CUDA model's projections (the weight GEMMs of a forward step): cuBLAS, and at one row the
// GEMV of worker/kernels/gemv.h, which reads the weights closer to the HBM roof and fuses the
// work around the projection (SwiGLU; the QKV split; the residual add + RMSNorm after O and
// down) into it. Not thread-safe: the backend's mutex guards every call.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "worker/backend/cuda/device_buffers.h"
#include "worker/kernels/model_kernels.h"
#include "worker/model/config.h"

namespace lazyrag::cuda_backend {

// Whether a one-token step of `config` takes the GEMV with its fused QKV split and norms on
// every QKV, O and down projection (never across a tensor-parallel all-reduce).
bool OneRowFusionApplies(const ModelConfig& config, bool tensor_parallel);

class Projections {
 public:
  Projections() = default;
  ~Projections();
  Projections(const Projections&) = delete;
  Projections& operator=(const Projections&) = delete;

  // cuBLAS on `stream`, its workspace and the fused norm's counter. `config` is the model
  // (the shard's shapes with tensor parallelism) whose one-row fusion FusesOneRow reports;
  // `tensor_parallel`: no fusion across the all-reduce that sits between a projection and its
  // norm there.
  absl::Status Init(const ModelConfig& config, bool tensor_parallel, cudaStream_t stream);

  // Whether a one-row step takes QkvScatterOneRow and ProjectThenNormOneRow (every QKV, O and
  // down projection of `config` fits the GEMV and its fused epilogues).
  bool FusesOneRow() const { return fuses_one_row_; }

  // y[rows, n] = x[rows, k] * w[n, k]^T, bf16 inputs, fp32 accumulation, y of y_type.
  absl::Status Gemm(const uint16_t* x, const uint16_t* w, void* y, cudaDataType y_type, int rows,
                    int n, int k);
  // act[rows, ff] = SwiGLU of x[rows, k] * w[2 * ff, k]^T (gate rows, then up rows); gate_up
  // [rows, 2 * ff] is scratch (unused at one row, where the GEMV fuses the SwiGLU).
  absl::Status GateUpSwiGlu(const uint16_t* x, const uint16_t* w, uint16_t* gate_up, uint16_t* act,
                            int rows, int ff, int k);
  // One token's QKV projection of x[k] by w[n, k] split as cuda_model::LaunchQkvScatter does
  // (scatter.qkv unused, scatter.num_tokens 1). REQUIRES: FusesOneRow().
  absl::Status QkvScatterOneRow(const uint16_t* x, const uint16_t* w,
                                const cuda_model::QkvScatterParams& scatter, int n, int k);
  // y[n] = w[n, k] x[k] (bf16), then `norm` (one row, residual y) as cuda_model::LaunchRmsNorm
  // does. REQUIRES: FusesOneRow(); n the model's hidden size.
  absl::Status ProjectThenNormOneRow(const uint16_t* x, const uint16_t* w, uint16_t* y, int n,
                                     int k, const cuda_model::RmsNormParams& norm);

 private:
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer workspace_;
  DeviceBuffer counter_;  // one unsigned, 0 between launches (gemv.h's then_norm)
  bool fuses_one_row_ = false;
};

}  // namespace lazyrag::cuda_backend
