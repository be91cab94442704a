// The CUDA model's projections (the weight GEMMs of a forward step): cuBLAS; at one row the GEMV
// of worker/kernels/gemv.h where it reads the weights closer to the HBM roof; and for up to 64
// rows the TMA + wgmma kernel of worker/kernels/wgmma_gemm.h on shapes wide enough to give every
// SM a block and for QKV (SwiGLU fused into gate|up by both). Not thread-safe: the backend's mutex
// guards every call.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "worker/backend/cuda/device_buffers.h"
#include "worker/kernels/gemv.h"
#include "worker/kernels/wgmma_gemm.h"

namespace lazyrag::cuda_backend {

class Projections {
 public:
  Projections() = default;
  ~Projections();
  Projections(const Projections&) = delete;
  Projections& operator=(const Projections&) = delete;

  // cuBLAS on `stream` and its workspace; `wgmma_gemm` as CudaBackendOptions::wgmma_gemm.
  absl::Status Init(cudaStream_t stream, int wgmma_gemm = 1);

  // y[rows, n] = x[rows, k] * w[n, k]^T, bf16 inputs, fp32 accumulation, y of y_type.
  absl::Status Gemm(const uint16_t* x, const uint16_t* w, void* y, cudaDataType y_type, int rows,
                    int n, int k);
  // The QKV projection of a step of `rows` tokens: Gemm with fp32 y, but with 2-64 rows on the
  // TMA + wgmma kernel whatever its block count (wgmma_gemm >= 1): it launches as a programmatic
  // dependent of the RMSNorm before it and streams the weights while the norm runs, which
  // cuBLAS cannot.
  absl::Status Qkv(const uint16_t* x, const uint16_t* w, float* y, int rows, int n, int k);
  // act[rows, ff] = SwiGLU of x[rows, k] * w[2 * ff, k]^T (gate rows, then up rows); gate_up
  // [rows, 2 * ff] is scratch (unused at one row, where the GEMV fuses the SwiGLU).
  absl::Status GateUpSwiGlu(const uint16_t* x, const uint16_t* w, uint16_t* gate_up, uint16_t* act,
                            int rows, int ff, int k);

  // One-token steps with each RMSNorm folded into the GEMVs around it and the QKV split fused
  // into its GEMV (gemv.h): whether every projection of a layer of these sizes takes the GEMV
  // at one row (QKV [q_dim + 2 kv_dim, hidden] split in heads of head_dim, O [hidden, q_dim],
  // gate|up [2 ff, hidden], down [hidden, ff]).
  static bool OneRowNormsFold(int hidden, int q_dim, int kv_dim, int head_dim, int ff);
  // y[n] = w[n, k] x[k] added to the residual: `out` as GemvResidualOut describes (O, down).
  absl::Status GemvToResidual(const uint16_t* x, const uint16_t* w, int n, int k,
                              const cuda_model::GemvResidualOut& out);
  // The projection after a folded norm: x is GemvToResidual's `scaled`, `norm` its parts; y as
  // Gemm's at one row, or with swiglu as GateUpSwiGlu's act (n = ff).
  absl::Status GemvFromResidual(const uint16_t* x, const cuda_model::GemvNormIn& norm,
                                const uint16_t* w, void* y, cudaDataType y_type, bool swiglu,
                                int n, int k);
  // The QKV projection of one token split to q and the pool (gemv.h, GemvQkvOut); `norm` as
  // GemvFromResidual's, or unset (sum_squares null) for an input already normed. n =
  // out.q_dim + 2 out.kv_dim.
  absl::Status GemvQkv(const uint16_t* x, const cuda_model::GemvNormIn& norm, const uint16_t* w,
                       int k, const cuda_model::GemvQkvOut& out);

  // Steps of 2-64 rows with the FFN's RMSNorm folded into the wgmma O and gate|up projections
  // (wgmma_gemm.h, WgmmaResidualOut / WgmmaNormIn): whether both take a step of `rows` rows
  // (O [hidden, q_dim], gate|up [2 ff, hidden]).
  bool FoldsFfnNorm(int rows, int hidden, int q_dim, int ff) const;
  // y[rows, n] = x[rows, k] w[n, k]^T added to the residual as `out` describes; *parts: the
  // sum-of-squares parts per row it writes (the WgmmaNormIn::parts of the projection after).
  absl::Status WgmmaToResidual(const uint16_t* x, const uint16_t* w, int rows, int n, int k,
                               const kernels::WgmmaResidualOut& out, int* parts);
  // act[rows, ff] = SwiGLU of (1/rms) x[rows, k] w[2 ff, k]^T: x is WgmmaToResidual's `scaled`,
  // `norm` its parts (or cuda_model::LaunchResidualScale's).
  absl::Status GateUpSwiGluNormed(const uint16_t* x, const kernels::WgmmaNormIn& norm,
                                  const uint16_t* w, uint16_t* act, int rows, int ff, int k);
  // Whether the wgmma QKV projection [n, hidden] of a step of `rows` rows takes a folded norm
  // (QkvNormed): 2-64 rows, the kernel on.
  bool FoldsQkvNorm(int rows, int n, int hidden) const;
  // y[rows, n] = (1/rms) x[rows, k] w[n, k]^T in fp32: x and `norm` as GateUpSwiGluNormed's.
  absl::Status QkvNormed(const uint16_t* x, const kernels::WgmmaNormIn& norm, const uint16_t* w,
                         float* y, int rows, int n, int k);

 private:
  // Gemm; `any_shape`: on the wgmma kernel wherever it is on, not only where every SM gets a block.
  absl::Status Project(const uint16_t* x, const uint16_t* w, void* y, cudaDataType y_type, int rows,
                       int n, int k, bool any_shape);
  // Whether kernels::LaunchWgmmaGemm takes y[rows, n] (n = 2 ff with swiglu) of this step.
  bool UseWgmma(const void* x, const void* w, int rows, int n, int k, bool swiglu,
                bool any_shape = false) const;

  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  int wgmma_gemm_ = 0;  // 0 off, 1 where every SM gets a block, 2 every shape it takes
  int sms_ = 0;
  DeviceBuffer workspace_;
};

}  // namespace lazyrag::cuda_backend
