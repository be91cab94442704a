// One token's projection, y[n] = w[n, k] x[k] (bf16 weights and input, fp32 accumulation): the
// CUDA backend's projections at one row (decode at batch 1, the lm_head of one logit row),
// where cuBLAS reads the weights at 56-62% of the HBM read ceiling on the small-n shapes (QKV,
// O) and adds a split-K reduce kernel on down. Every block reads whole 16-byte weight chunks,
// 4 KiB contiguous per block step, and issues its first weight loads before waiting on the
// previous kernel (programmatic dependent launch: weights are never written by a step).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "worker/kernels/model_kernels.h"

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
  // The fused QKV split of one token (cuda_model::LaunchQkvScatter's output from the fp32
  // projection, bit for bit): Q to scatter.q, K rotated and V to the token's slot; y unused.
  // REQUIRES: scatter.num_tokens == 1, scatter.qkv unused, n == (num_heads + 2 *
  // num_kv_heads) * head_dim, head_dim even.
  bool qkv_scatter = false;
  QkvScatterParams scatter;
  // After every block has stored y (bf16), the grid's last block runs LaunchRmsNorm's row body
  // on `norm` (the same bits): the residual add + RMSNorm that follows the O and down
  // projections. `counter` is a device word that is 0 between launches (the last block resets
  // it); launches that share it must not overlap. REQUIRES: !y_fp32, !swiglu, !qkv_scatter,
  // norm.num_rows == 1, norm.rows and norm.embedding null, norm.residual == y, norm.dim == n,
  // n % 4 == 0 and n <= 8192.
  bool then_norm = false;
  RmsNormParams norm;
  unsigned* counter = nullptr;
  int n = 0;
  int k = 0;
};

// Whether LaunchGemv takes these operands: k a positive multiple of 8, n > 0, w and x 16-byte
// aligned, y 4-byte aligned (fp32) or 2-byte aligned (bf16), no fp32 output with swiglu, at
// most one epilogue (swiglu, qkv_scatter, then_norm) and its REQUIRES above.
bool GemvSupports(const GemvParams& p);

// Whether the GEMV is the faster choice (bench/gemv_bench on an H200): supported, k >= 2048 (below,
// threads of a block idle: a block step covers 2048 values of k) and n <= 32768 (cuBLAS reads a
// vocabulary-sized lm_head at 97% of the read ceiling, the GEMV at 94%).
bool GemvPreferred(const GemvParams& p);

// Launched as a programmatic dependent of the previous kernel on the stream (it reads x only
// after that kernel has finished). INVALID_ARGUMENT when !GemvSupports(p).
absl::Status LaunchGemv(const GemvParams& p, cudaStream_t stream);

}  // namespace lazyrag::cuda_model
