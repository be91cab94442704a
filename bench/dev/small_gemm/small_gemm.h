// bench/dev experiment (issue 29), not used by serving: a small-M bf16 GEMM for the forward
// step's projections, y[rows, n] = x[rows, k] * w[n, k]^T with rows <= 64 (decode batches, 32-token
// query blocks), where the step is bound by reading w once. It measured slower than cuBLAS on the
// Llama-3-8B projections, so the CUDA backend calls cuBLAS; the numbers, the verdict and how to run
// the test and the benchmark are in bench/README.md ("bench/dev experiments"), the variants tried
// and the next directions in bench/HISTORY.md (with the backend integration that was measured).
//
// Design: tensor cores (mma.sync m16n8k16, fp32 accumulation) with the operands swapped: weight
// rows are the MMA's M dimension, tokens its N. Each thread loads 16 contiguous bytes of a weight
// row straight into the A fragment registers (no shared memory); the k order inside a 32-element
// chunk is permuted identically for x and w, which leaves the dot product unchanged. Split-K across
// blocks (chosen from the SM count) is reduced in the same kernel: the last block of a tile sums
// the partials in split order (deterministic) and runs the epilogue. Launched as a programmatic
// dependent: the first weight loads are issued before the previous kernel on the stream has
// finished (weights must not be written by that kernel), unless SmallGemmParams::programmatic is
// false.
//
// Plain C++ reference: the double-precision dot products of small_gemm_test.cc, which also compares
// every element with cuBLAS.
#pragma once

#include <cstdint>

#include "absl/status/status.h"

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace lazyrag::kernels {

enum class SmallGemmEpilogue {
  kFloat,  // y: [rows, n] fp32
  kBf16,   // y: [rows, n] bf16, round to nearest even
  // The fused SwiGLU of the gate_up projection: w holds gate rows [0, n/2) then up rows [n/2, n);
  // y: [rows, n/2] bf16 = bf16(silu(g) * u) with g and u the projections rounded to bf16 first
  // (cuda_model::LaunchSwiGlu's rounding, applied to cuBLAS's bf16 output).
  kSwiGluBf16,
};

// Bytes of workspace that let the launcher split k over blocks for every shape it takes (the tile
// counters and the fp32 partials); with less (or none), it splits less (or not at all).
constexpr int64_t kSmallGemmWorkspaceBytes = int64_t(16) << 20;

struct SmallGemmParams {
  const uint16_t* x = nullptr;  // [rows, k] bf16, 16-byte aligned
  const uint16_t* w = nullptr;  // [n, k] bf16 row-major, 16-byte aligned
  void* y = nullptr;            // see SmallGemmEpilogue
  int rows = 0;                 // 0 .. kSmallGemmMaxRows
  int n = 0;
  int k = 0;  // a multiple of kSmallGemmKMultiple
  SmallGemmEpilogue epilogue = SmallGemmEpilogue::kFloat;
  // Device memory, 16-byte aligned, whose first kSmallGemmCounterBytes bytes were zero before the
  // first launch (every launch leaves them zero again); or null. Launches that share it must be
  // ordered (one stream). Read and written only after the PDL wait.
  void* workspace = nullptr;
  int64_t workspace_bytes = 0;
  // true: launched as a programmatic dependent of the previous kernel (the weight prologue runs
  // before that kernel has finished; the next kernel may be scheduled once every block of this one
  // has passed its wait). false: an ordinary launch.
  bool programmatic = true;
};

constexpr int kSmallGemmMaxRows = 64;
constexpr int kSmallGemmKMultiple = 32;
// kSwiGluBf16: n / 2 must be a multiple of this (gate and up rows of one tile in one block).
constexpr int kSmallGemmSwiGluMultiple = 64;
constexpr int64_t kSmallGemmCounterBytes = 4096 * 4;

// OK when SmallGemm takes the shape and epilogue (the caller uses cuBLAS otherwise);
// INVALID_ARGUMENT naming what it does not take. Pointers are not checked.
absl::Status CheckSmallGemmShape(int rows, int n, int k, SmallGemmEpilogue epilogue);

// Queries (once per device) the occupancy the launcher plans with; call before capturing a CUDA
// graph that launches SmallGemm (the launch itself then makes no runtime queries but
// cudaGetDevice). Optional: the first launch does it otherwise.
absl::Status PrepareSmallGemm();

// Queues the GEMM on `stream`: no allocation, no synchronization (graph-capturable).
// INVALID_ARGUMENT for shapes CheckSmallGemmShape rejects, null or misaligned pointers.
absl::Status SmallGemm(const SmallGemmParams& p, cudaStream_t stream);

}  // namespace lazyrag::kernels
