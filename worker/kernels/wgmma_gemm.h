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
};

// Whether the shape is one LaunchWgmmaGemm takes (pointers aside).
bool WgmmaGemmShapeOk(int rows, int n, int k, bool swiglu);
// Weight rows per block of a launch of `p` (128 or 64), and its blocks: one per 64 outputs with
// swiglu (their gate and up rows), else one per rows_per_block outputs.
int WgmmaGemmRowsPerBlock(const WgmmaGemmParams& p);
int WgmmaGemmBlocks(int n, bool swiglu, int rows_per_block);
// Whether the current device runs it (compute capability 9.0, the kernel built for sm_90a, the
// driver's tensor-map encoder present). Cached on first call.
bool WgmmaGemmSupported();

// Queues the GEMM on `stream` (no allocation, no synchronization: graph-capturable).
// INVALID_ARGUMENT for a shape WgmmaGemmShapeOk rejects, null or misaligned pointers, fp32 y with
// swiglu; FAILED_PRECONDITION when !WgmmaGemmSupported().
absl::Status LaunchWgmmaGemm(const WgmmaGemmParams& p, cudaStream_t stream);

}  // namespace lazyrag::kernels
