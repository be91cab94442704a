// Fused elementwise kernels of the CUDA model forward (everything but the GEMMs, which are
// cuBLAS, and attention, which is worker/kernels). Each kernel: a __device__ body, a
// __global__ entry taking its params struct, and the host launcher below (stream in, Status
// out). bf16 tensors are passed as their raw 16-bit patterns (uint16_t); no CUDA type leaks
// to includers except cudaStream_t.
//
// Every kernel has a plain C++ reference: cpu_backend.cc's forward (RMSNorm, RoPE on K,
// SwiGLU), PagedAttentionCpu / MaterializeCpu (the fallback attention and materialize), the
// loader's synthetic fill (worker/model/model_source.cc).
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "worker/attention/segment_view.h"
#include "worker/kernels/materialize.h"

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace lazyrag::cuda_model {

// cos/sin of every new key's RoPE angles, computed once per forward step in double (as
// worker/attention/rope.h does on the CPU) and shared by every layer and KV head.
struct RopeTableParams {
  const int32_t* pos = nullptr;     // [num_tokens] rotation positions (kv_pos)
  const float* inv_freq = nullptr;  // [half]
  float* table = nullptr;           // [num_tokens, half, 2] = (cos, sin)
  int num_tokens = 0;
  int half = 0;  // head_dim / 2
};
absl::Status LaunchRopeTable(const RopeTableParams& p, cudaStream_t stream);

// RMSNorm of fp32 rows into bf16: out[r] = x_r / rms(x_r) * weight. The source row is
// x[rows ? rows[r] : r] (plus residual[rows ? rows[r] : r] when `residual` is set: the
// residual add is fused), or, when `embedding` is set, the bf16 embedding row of tokens[r]
// (the gather is fused). When x_out is set, the source row is stored to x_out[r] (the
// residual stream; x_out may equal x when rows is null).
struct RmsNormParams {
  const float* x = nullptr;             // [*, dim]
  const int32_t* rows = nullptr;        // [num_rows] or null (identity)
  const uint16_t* residual = nullptr;   // [*, dim] bf16, or null
  const uint16_t* embedding = nullptr;  // [vocab, dim] bf16, or null
  const int32_t* tokens = nullptr;      // [num_rows] when embedding is set
  float* x_out = nullptr;               // [num_rows, dim] or null
  const float* weight = nullptr;        // [dim]
  uint16_t* out = nullptr;              // [num_rows, dim] bf16
  int num_rows = 0;
  int dim = 0;
  float eps = 1e-5f;
};
absl::Status LaunchRmsNorm(const RmsNormParams& p, cudaStream_t stream);
// Whether LaunchRmsNorm(p) splits each row over a cluster of blocks (rows of the residual
// stream, x set and no embedding, dim a multiple of 16 up to 8,192, and few enough rows that
// one block a row would leave most multiprocessors idle: rows x 4 <= SMs). Measured faster for
// the 32-row step, whose two norms a layer sit between projections (bench/README.md); the
// result differs from one block a row only in the order of the sum of squares. Needs the
// current device.
bool RmsNormUsesClusters(const RmsNormParams& p);

// The RMSNorm between two projections of a few rows, folded into the projection after it
// (kernels::WgmmaNormIn, wgmma_gemm.h): the residual add and the norm's operand without 1/rms,
// with per-row sums of squares over 128-column parts, which that projection sums (a fixed order)
// and applies. Unlike LaunchRmsNorm no block waits for a whole row: one warp per (row, part).
struct ResidualScaleParams {
  float* x = nullptr;               // [rows, dim] fp32 residual, in place: v = x + delta
  const uint16_t* delta = nullptr;  // [rows, dim] bf16 projection output
  const float* weight = nullptr;    // [dim]: the norm's weight g
  uint16_t* scaled = nullptr;       // [rows, dim] bf16: bf16(v * g)
  // [rows, ResidualScaleParts(dim)]: at t * parts + b the sum of v^2 over row t's columns
  // [128 b, 128 b + 128).
  float* sum_squares = nullptr;
  int rows = 0;
  int dim = 0;
};
int ResidualScaleParts(int dim);
// INVALID_ARGUMENT for a pointer unset, x, delta, weight or scaled not 16-byte aligned, rows < 0
// or dim < 1.
absl::Status LaunchResidualScale(const ResidualScaleParams& p, cudaStream_t stream);

// Splits the fused QKV projection: Q to bf16 (un-rotated; attention rotates it per segment),
// K rotated at its token's position (rotate-half layout) and written with V to the token's
// slot of this layer's paged pool.
struct QkvScatterParams {
  const float* qkv = nullptr;        // [num_tokens, q_dim + 2 * kv_dim]: Q | K | V
  const float* rope = nullptr;       // RopeTableParams::table
  const int64_t* kv_slot = nullptr;  // [num_tokens] page * page_size + offset
  uint16_t* q = nullptr;             // [num_tokens, q_dim] bf16
  uint16_t* k_cache = nullptr;       // [num_slots, kv_dim] bf16 (this layer)
  uint16_t* v_cache = nullptr;
  int num_tokens = 0;
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
};
absl::Status LaunchQkvScatter(const QkvScatterParams& p, cudaStream_t stream);

// out[t, i] = silu(gate[t, i]) * up[t, i] with gate = gate_up[t, 0:ff), up = gate_up[t, ff:2ff).
struct SwiGluParams {
  const uint16_t* gate_up = nullptr;  // [num_tokens, 2 * ff] bf16
  uint16_t* out = nullptr;            // [num_tokens, ff] bf16
  int num_tokens = 0;
  int ff = 0;
};
absl::Status LaunchSwiGlu(const SwiGluParams& p, cudaStream_t stream);

// ids[r] = the index of the largest of logits[r, 0:vocab) (the lowest index among equal
// maxima; NaNs are skipped; an all-NaN row gives 0) for each of num_rows rows: greedy sampling
// on the device. Each row is cut into ArgmaxRowsParts(vocab) parts reduced by their own blocks
// into partial_value / partial_index ([num_rows, parts] each), then merged; same ids whatever
// the cut.
constexpr int kArgmaxMaxParts = 64;
int ArgmaxRowsParts(int vocab);
struct ArgmaxRowsParams {
  const float* logits = nullptr;     // [num_rows, vocab]
  int32_t* ids = nullptr;            // [num_rows]
  float* partial_value = nullptr;    // [num_rows, ArgmaxRowsParts(vocab)]
  int32_t* partial_index = nullptr;  // [num_rows, ArgmaxRowsParts(vocab)]
  int num_rows = 0;
  int vocab = 0;
};
absl::Status LaunchArgmaxRows(const ArgmaxRowsParams& p, cudaStream_t stream);

// Synthetic weights in device memory, bit-identical to the loader's fp32 values before bf16
// rounding: dst[i] = bf16(bound * u(seed, tag, g(i))) when bound > 0 (linear weights),
// bf16(u(seed, tag, g(i))) when bound == 0 (embeddings), where g(i) is the element's index in
// the whole tensor: first + i for a contiguous range (cols == 0), or, for a block of columns of
// a row-major [rows, global_cols] matrix (a tensor-parallel rank's slice of wo / w_down),
// first + (i / cols) * global_cols + i % cols.
struct SyntheticFillParams {
  uint16_t* dst = nullptr;
  int64_t n = 0;
  uint64_t seed = 0;
  uint32_t tag = 0;
  float bound = 0.0f;
  int64_t first = 0;
  int64_t cols = 0;
  int64_t global_cols = 0;
};
absl::Status LaunchSyntheticFill(const SyntheticFillParams& p, cudaStream_t stream);

// dst[i] = bf16(src[i]), round to nearest even (host fp32 weights on upload).
absl::Status LaunchFloatToBf16(const float* src, uint16_t* dst, int64_t n, cudaStream_t stream);
// dst[i] = float(src[i]) (reading weights back for tests).
absl::Status LaunchBf16ToFloat(const uint16_t* src, float* dst, int64_t n, cudaStream_t stream);

// CUDA-core attention for head dims the tensor-core kernels do not take (they take 64 and
// 128; synthetic:tiny has 16). Same contract as PagedAttentionCpu with rotated-local keys;
// q rotated per segment in fp32 with double-precision angles. One warp per (row, head).
// REQUIRES: head_dim even and <= 256.
struct FallbackAttentionParams {
  int num_heads = 0;
  int num_kv_heads = 0;
  int head_dim = 0;
  float scale = 0.0f;
  const uint16_t* q = nullptr;        // [num_q, num_heads, head_dim] bf16, not rotated
  const uint16_t* k_cache = nullptr;  // [num_slots, num_kv_heads, head_dim] bf16
  const uint16_t* v_cache = nullptr;
  uint16_t* out = nullptr;               // [num_q, num_heads, head_dim] bf16
  const float* inv_freq = nullptr;       // [head_dim / 2]
  const int32_t* row_request = nullptr;  // [num_q] request of each query row
  SegmentView view;                      // device arrays
};
absl::Status LaunchFallbackAttention(const FallbackAttentionParams& p, cudaStream_t stream);

// MATERIALIZE for head dims the tensor-core materialize kernel does not take; same contract
// as kernels::Materialize (worker/kernels/materialize.h), keys re-rotated with double angles.
// The same parameters as the tensor-core kernel (worker/kernels/materialize.h).
using FallbackMaterializeParams = kernels::MaterializeParams;
absl::Status LaunchFallbackMaterialize(const FallbackMaterializeParams& p, cudaStream_t stream);

}  // namespace lazyrag::cuda_model
