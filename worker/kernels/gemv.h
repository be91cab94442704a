// One token's projection, y[n] = w[n, k] x[k] (bf16 weights and input, fp32 accumulation): the
// CUDA backend's projections at one row (decode at batch 1, the lm_head of one logit row),
// where cuBLAS reads the weights at 56-62% of the HBM read ceiling on the small-n shapes (QKV,
// O) and adds a split-K reduce kernel on down. Every block reads whole 16-byte weight chunks,
// 4 KiB contiguous per block step, and issues its first weight loads before waiting on the
// previous kernel (programmatic dependent launch: weights are never written by a step).
#pragma once

#include <cstdint>

#include "absl/status/status.h"

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace lazyrag::cuda_model {

struct GemvParams {
  const uint16_t* w = nullptr;  // [n, k] bf16 row-major; with swiglu [2 * n, k]: gate, then up
  const uint16_t* x = nullptr;  // [k] bf16
  void* y = nullptr;            // [n]: fp32 when y_fp32, else bf16 (round to nearest even)
  bool y_fp32 = false;
  // y[j] = bf16(silu(bf16(gate_j)) * bf16(up_j)): cuda_model::LaunchSwiGlu applied to the bf16
  // gate_up projection, fused. REQUIRES: !y_fp32.
  bool swiglu = false;
  int n = 0;
  int k = 0;
};

// Whether LaunchGemv takes these operands: k a positive multiple of 8, n > 0, w and x 16-byte
// aligned, y 4-byte aligned (fp32) or 2-byte aligned (bf16), no fp32 output with swiglu.
bool GemvSupports(const GemvParams& p);

// Whether the GEMV is the faster choice (bench/gemv_bench on an H200): supported, k >= 2048 (below,
// threads of a block idle: a block step covers 2048 values of k) and n <= 32768 (cuBLAS reads a
// vocabulary-sized lm_head at 97% of the read ceiling, the GEMV at 94%).
bool GemvPreferred(const GemvParams& p);

// Launched as a programmatic dependent of the previous kernel on the stream (it reads x only
// after that kernel has finished). INVALID_ARGUMENT when !GemvSupports(p).
absl::Status LaunchGemv(const GemvParams& p, cudaStream_t stream);

}  // namespace lazyrag::cuda_model
