// A projection of a few token rows, y[rows, n] = x[rows, k] w[n, k]^T (bf16 inputs, fp32
// accumulation), on Hopper's path: TMA copies of the weight rows into a shared-memory ring and
// wgmma with the weight rows as M, one block per 128 (or 64) weight rows over all of k, launched
// as a programmatic dependent that issues its first weight copies before the previous kernel ends.
// It reads the weights at 97-99% of the HBM read ceiling where the shape gives every SM a block
// (the lm_head, gate|up), where cuBLAS reads them at 87-91% (bench/dev/small_gemm's
// small_gemm_bench); with fewer blocks than SMs (QKV, O and down of Llama-3-8B) cuBLAS is
// faster, and splitting k over a cluster's blocks measured slower still (bench/HISTORY.md).
// Tested against cuBLAS and a CPU reference by bench/dev/small_gemm/small_gemm_test.cc
// (WgmmaGemm.*), whose harness it shares with the experiment it grew from.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace lazyrag::kernels {

constexpr int kWgmmaGemmMaxRows = 64;

// The RMSNorm between two projections folded into them per token row, as the one-token GEMVs
// fold it (cuda_model::GemvResidualOut / GemvNormIn): the projection before the norm adds its
// bf16-rounded output to the fp32 residual and writes the norm's input times the norm weight and
// each block's sum of squares per row; the projection after it sums those parts (a fixed order:
// deterministic) and multiplies its sums by that row's 1/rms. So y = (1/rms) W bf16(v * g)
// where LaunchRmsNorm then the projection compute W bf16(v (1/rms) g): one bf16 rounding moves,
// and the norm kernel and its launch go.
struct WgmmaResidualOut {
  float* residual = nullptr;           // [rows, n] fp32, in place: v = residual + bf16(y)
  const float* norm_weight = nullptr;  // [n]: the next RMSNorm's weight g
  uint16_t* scaled = nullptr;          // [rows, n] bf16: bf16(v * g), the next projection's x
  // [rows, parts], parts = WgmmaGemmNormParts of the launch: at t * parts + b the sum of v^2
  // over row t's outputs of block b.
  float* sum_squares = nullptr;
};
struct WgmmaNormIn {
  // A WgmmaResidualOut's parts (x its `scaled`), or cuda_model::LaunchResidualScale's.
  const float* sum_squares = nullptr;
  int parts = 0;    // parts per row: that launch's WgmmaGemmNormParts (or ResidualScaleParts)
  float eps = 0.f;  // 1/rms of row t = 1 / sqrt(sum(parts of t) / k + eps)
};

struct WgmmaGemmParams {
  const uint16_t* x = nullptr;  // [rows, k] bf16, 16-byte aligned
  const uint16_t* w = nullptr;  // [n, k] bf16 row-major, 16-byte aligned
  void* y = nullptr;            // [rows, n] (swiglu: [rows, n / 2]), fp32 or bf16 (nearest even)
  bool y_fp32 = false;
  // y[t, j] = bf16(silu(bf16(gate)) * bf16(up)) with gate rows [0, n / 2) of w and up rows
  // [n / 2, n): cuda_model::LaunchSwiGlu of the bf16 gate|up projection, fused. REQUIRES: !y_fp32.
  bool swiglu = false;
  int rows = 0;  // 0 .. kWgmmaGemmMaxRows
  int n = 0;     // > 0, even with swiglu
  int k = 0;     // a positive multiple of 8
  // A programmatic dependent of the previous kernel on the stream (weights must not be written by
  // it); false: an ordinary launch.
  bool programmatic = true;
  // Weight rows a block computes, 64 or 128; 0: the launcher's choice (128 with swiglu or where
  // that gives every SM a block, else 64 with a deeper ring). Set for comparisons (benchmarks).
  int rows_per_block = 0;
  // On when residual is set: y is not written (may be null). REQUIRES: !swiglu, !y_fp32.
  WgmmaResidualOut residual_out;
  WgmmaNormIn norm_in;  // on when sum_squares is set
};

// Whether the shape is one LaunchWgmmaGemm takes (pointers aside).
bool WgmmaGemmShapeOk(int rows, int n, int k, bool swiglu);
// Weight rows per block of a launch of `p` (128 or 64), and its blocks: one per 64 outputs with
// swiglu (their gate and up rows), else one per rows_per_block outputs.
int WgmmaGemmRowsPerBlock(const WgmmaGemmParams& p);
int WgmmaGemmBlocks(int n, bool swiglu, int rows_per_block);
// The sum-of-squares parts per row that a launch of `p` with residual_out writes: its blocks.
int WgmmaGemmNormParts(const WgmmaGemmParams& p);
// Whether the current device runs it (compute capability 9.0, the kernel built for sm_90a, the
// driver's tensor-map encoder present). Cached on first call.
bool WgmmaGemmSupported();

// Queues the GEMM on `stream` (no allocation, no synchronization: graph-capturable).
// INVALID_ARGUMENT for a shape WgmmaGemmShapeOk rejects, null or misaligned pointers, fp32 y with
// swiglu, a residual output with a pointer unset or with swiglu or fp32 y, a norm input with
// parts < 1 or eps < 0; FAILED_PRECONDITION when !WgmmaGemmSupported().
absl::Status LaunchWgmmaGemm(const WgmmaGemmParams& p, cudaStream_t stream);

}  // namespace lazyrag::kernels
