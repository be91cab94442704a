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

// The RMSNorm between two one-row projections, folded into them (a one-token step where every
// projection takes the GEMV): the projection before the norm (O, down) adds its bf16-rounded
// output to the fp32 residual and writes the norm's input times the norm weight and each
// block's sum of squares; the projection after it (QKV, gate|up) sums those parts in every block
// (in a fixed order: deterministic) and multiplies its sums by 1/rms. So y = (1/rms) W bf16(v * g)
// where LaunchRmsNorm then LaunchGemv compute W bf16(v (1/rms) g): one bf16 rounding moves, and
// the norm kernel and its launch go. Both run blocks of 4 outputs (fewer parts to read).
struct GemvResidualOut {
  float* residual = nullptr;           // fp32 [n], in place: v_j = residual_j + bf16(y_j)
  const float* norm_weight = nullptr;  // fp32 [n]: the next RMSNorm's weight g
  uint16_t* scaled = nullptr;          // bf16 [n]: bf16(v_j * g_j), the next GEMV's x
  float* sum_squares = nullptr;        // [GemvNormParts(n)]: block b's sum of v_j^2
};
struct GemvNormIn {
  const float* sum_squares = nullptr;  // a GemvResidualOut's parts (and x its `scaled`)
  int parts = 0;                       // GemvNormParts of that projection's n
  float eps = 0.f;                     // 1/rms = 1 / sqrt(sum(parts) / k + eps)
};

// The QKV projection of one token split as LaunchQkvScatter (model_kernels.h) splits it, fused
// into its epilogue: Q to bf16, K rotated at the token's position (rotate-half) and V, both
// written to the token's pool slot; the same values bit for bit, one kernel and its launch
// fewer, and the attention after it launches as this kernel's dependent. A block of 4 outputs
// in K holds two rotated pairs (i, i + 1, i + half, i + 1 + half) of one head.
struct GemvQkvOut {
  const float* rope = nullptr;       // [head_dim / 2, 2]: (cos, sin) at the token's position
  const int64_t* kv_slot = nullptr;  // [1]: page * page_size + offset of the token
  uint16_t* q = nullptr;             // [q_dim] bf16, un-rotated
  uint16_t* k_cache = nullptr;       // [slots, kv_dim] bf16 (this layer)
  uint16_t* v_cache = nullptr;       // [slots, kv_dim] bf16 (this layer)
  int q_dim = 0;                     // heads * head_dim
  int kv_dim = 0;                    // kv heads * head_dim
  int head_dim = 0;                  // a positive multiple of 4
};

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
  // On when residual is set: y is not written (may be null). REQUIRES: !swiglu, !y_fp32, norm_in
  // off.
  GemvResidualOut residual_out;
  GemvNormIn norm_in;  // on when sum_squares is set
  // On when q is set: y is not written (may be null). REQUIRES: n == q_dim + 2 * kv_dim, !swiglu,
  // !y_fp32, residual_out off.
  GemvQkvOut qkv_out;
};

// The number of GemvResidualOut::sum_squares parts of a projection with n outputs.
int GemvNormParts(int n);

// Whether LaunchGemv takes these operands: k a positive multiple of 8, n > 0, w and x 16-byte
// aligned, y 4-byte aligned (fp32) or 2-byte aligned (bf16), no fp32 output with swiglu; a
// residual output with every pointer set and aligned, and none of swiglu, fp32 y and norm_in; a
// norm input with parts > 0 and eps >= 0; a QKV output with every pointer set, head_dim a
// positive multiple of 4, q_dim and kv_dim positive multiples of it with n = q_dim + 2 kv_dim,
// and none of swiglu, fp32 y and a residual output.
bool GemvSupports(const GemvParams& p);

// Whether the GEMV is the faster choice (bench/gemv_bench on an H200): supported, k >= 2048 (below,
// threads of a block idle: a block step covers 2048 values of k) and n <= 32768 (cuBLAS reads a
// vocabulary-sized lm_head at 97% of the read ceiling, the GEMV at 94%).
bool GemvPreferred(const GemvParams& p);

// Launched as a programmatic dependent of the previous kernel on the stream (it reads x only
// after that kernel has finished). INVALID_ARGUMENT when !GemvSupports(p).
absl::Status LaunchGemv(const GemvParams& p, cudaStream_t stream);

}  // namespace lazyrag::cuda_model
