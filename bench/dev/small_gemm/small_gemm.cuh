// Internal to bench/dev/small_gemm (small_gemm.cu, small_gemm_bench.cu): the body, entry and
// planning of SmallGemm (small_gemm.h), templated on the launch configuration so that
// small_gemm_bench can time variants beside the configuration small_gemm.cu instantiates. Layout of
// the work:
//   * a tile is 16 weight rows per warp of the block (kSwiGluBf16: half of them gate rows, half the
//     up rows of the same features), every token of the row bucket (8/16/32/64) in the warp;
//   * k is cut into 32-element chunks; a tile's chunks are split over `splits` work items (tile,
//     split) so that the grid fills the SMs; the grid is persistent (at most one wave, items
//     strided over the blocks);
//   * per chunk, thread (g = lane / 4, t = lane % 4) loads elements [8t, 8t + 8) of weight rows g
//     and g + 8 of its warp's 16 (one 16-byte load each) and of tokens g, g + 8, ... of x; MMA
//     k-step s (two per chunk) takes words 2s and 2s + 1 of each load, so the MMA's logical k index
//     (2t, 2t + 1, 2t + 8, 2t + 9) maps to the physical 8t + 4s + (0, 1, 2, 3) for both operands
//     alike;
//   * weight chunks are prefetched kQueue deep into registers (ld.global.nc, no L1 allocation,
//     optionally the 256-byte L2 prefetch), x one chunk ahead (L1-cached: the warps of a block read
//     the same x);
//   * splits > 1: every item stores its fp32 partial tile to the workspace in fragment order; the
//     last of a tile's items (a counter per tile) sums them in split order and runs the epilogue,
//     then zeroes the counter.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>

#include "absl/status/status.h"
#include "bench/dev/small_gemm/small_gemm.h"
#include "worker/kernels/attention_internal.cuh"  // LaunchPdlKernel, PdlWait
#include "worker/kernels/cuda_check.h"

namespace lazyrag::kernels::small_gemm_internal {

constexpr int kChunk = 32;  // k elements per load step
constexpr int kMinChunksPerSplit = 8;
constexpr int kMaxSplits = 16;
constexpr int kMaxCounters = int(kSmallGemmCounterBytes / 4);

// What the host plan adds to SmallGemmParams.
struct SmallGemmKernelParams {
  const uint16_t* x;
  const uint16_t* w;
  void* y;
  int rows, n, k;
  SmallGemmEpilogue epilogue;
  int half;            // kSwiGluBf16: n / 2 (the gate rows); else 0
  int tiles;           // tiles of 16 * warps weight rows
  int splits;          // work items per tile
  int chunks;          // k / kChunk
  unsigned* counters;  // [tiles] when splits > 1
  // [tiles * splits, warps, token tiles, 32 lanes] when splits > 1
  float4* partials;
};

// kL2Promote: the 256-byte L2 prefetch hint (each 64-byte row segment pulls in the next three).
template <bool kL2Promote>
__device__ __forceinline__ uint4 LoadWeights(const uint16_t* p) {
  uint4 v;
  if constexpr (kL2Promote) {
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  } else {
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p));
  }
  return v;
}
__device__ __forceinline__ uint4 LoadActivations(const uint16_t* p) {
  return __ldg(reinterpret_cast<const uint4*>(p));
}

// d += a * b for one m16n8k16 bf16 MMA.
__device__ __forceinline__ void Mma(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2,
                                    uint32_t a3, uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, "
      "%2, %3}, {%4, %5, %6, %7}, "
      "{%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// One chunk: the two k-steps over every token tile. wa / wb: rows g and g + 8.
template <int kTokenTiles>
__device__ __forceinline__ void MmaChunk(float (&acc)[kTokenTiles][4], const uint4& wa,
                                         const uint4& wb, const uint4 (&x)[kTokenTiles]) {
#pragma unroll
  for (int j = 0; j < kTokenTiles; ++j) {
    Mma(acc[j], wa.x, wb.x, wa.y, wb.y, x[j].x, x[j].y);
    Mma(acc[j], wa.z, wb.z, wa.w, wb.w, x[j].z, x[j].w);
  }
}

__device__ __forceinline__ float RoundBf16(float f) {
  return __bfloat162float(__float2bfloat16_rn(f));
}
__device__ __forceinline__ uint16_t ToBf16Bits(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}
// cuda_model's SwiGLU (model_kernels.cu): silu in fp32 with expf.
__device__ __forceinline__ float Silu(float g) { return g / (1.0f + expf(-g)); }

// kBucket: token rows of the MMA tiles (8/16/32/64); kWarps: warps per block (16 weight rows each);
// kQueue: weight chunks in flight per warp (even).
template <int kBucket, int kWarps, int kQueue, bool kL2Promote>
__device__ __forceinline__ void SmallGemmBody(const SmallGemmKernelParams& p) {
  static_assert(kQueue % 2 == 0 && kWarps % 2 == 0, "");
  constexpr int kTokenTiles = kBucket / 8;
  constexpr int kTileRows = 16 * kWarps;
  // kSwiGluBf16: the up warps' final tiles, read by the gate warp of the same features.
  __shared__ float4 up_tile[kWarps / 2][kTokenTiles][32];
  __shared__ int last_item;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const bool swiglu = p.epilogue == SmallGemmEpilogue::kSwiGluBf16;
  const int items = p.tiles * p.splits;
  bool waited = false;
  for (int item = blockIdx.x; item < items; item += gridDim.x) {
    const int tile = item / p.splits, split = item - tile * p.splits;
    // This warp's first weight row and the end of the rows it may read.
    int row0, row_end;
    if (swiglu) {
      const int half_warp = warp % (kWarps / 2);
      row0 = (warp < kWarps / 2 ? 0 : p.half) + tile * (kTileRows / 2) + half_warp * 16;
      row_end = warp < kWarps / 2 ? p.half : p.n;
    } else {
      row0 = tile * kTileRows + warp * 16;
      row_end = p.n;
    }
    const int c_begin = int(int64_t(split) * p.chunks / p.splits);
    const int c_end = int(int64_t(split + 1) * p.chunks / p.splits);
    // Rows past the end are clamped (read, never stored).
    const uint16_t* wa = p.w + size_t(min(row0 + g, row_end - 1)) * p.k + 8 * t;
    const uint16_t* wb = p.w + size_t(min(row0 + g + 8, row_end - 1)) * p.k + 8 * t;
    uint4 ra[kQueue], rb[kQueue];
#pragma unroll
    for (int d = 0; d < kQueue; ++d) {
      if (c_begin + d < c_end) {
        ra[d] = LoadWeights<kL2Promote>(wa + size_t(c_begin + d) * kChunk);
        rb[d] = LoadWeights<kL2Promote>(wb + size_t(c_begin + d) * kChunk);
      }
    }
    if (!waited) {
      // x, the workspace and y belong to the previous kernels until here.
      detail::PdlWait();
      // The next kernel may become resident as this grid's blocks leave (its weight prologue
      // overlaps this grid's tail); it reads this grid's outputs only after its own PdlWait.
      detail::PdlLaunchDependents();
      waited = true;
    }
    const uint16_t* xr[kTokenTiles];
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j) {
      xr[j] = p.x + size_t(min(8 * j + g, p.rows - 1)) * p.k + 8 * t;
    }
    uint4 xs[2][kTokenTiles];
#pragma unroll
    for (int j = 0; j < kTokenTiles; ++j)
      xs[0][j] = LoadActivations(xr[j] + size_t(c_begin) * kChunk);
    float acc[kTokenTiles][4] = {};
    for (int c = c_begin; c < c_end; c += kQueue) {
#pragma unroll
      for (int d = 0; d < kQueue; ++d) {  // kQueue is even: chunk c + d uses xs[d % 2]
        const int cc = c + d;
        if (cc < c_end) {
          if (cc + 1 < c_end) {
#pragma unroll
            for (int j = 0; j < kTokenTiles; ++j) {
              xs[(d + 1) % 2][j] = LoadActivations(xr[j] + size_t(cc + 1) * kChunk);
            }
          }
          MmaChunk<kTokenTiles>(acc, ra[d], rb[d], xs[d % 2]);
          if (cc + kQueue < c_end) {
            ra[d] = LoadWeights<kL2Promote>(wa + size_t(cc + kQueue) * kChunk);
            rb[d] = LoadWeights<kL2Promote>(wb + size_t(cc + kQueue) * kChunk);
          }
        }
      }
    }

    if (p.splits > 1) {
      float4* mine = p.partials + (size_t(item) * kWarps + warp) * kTokenTiles * 32 + lane;
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) {
        __stcg(mine + j * 32, make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]));
      }
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) {
        last_item = atomicAdd(&p.counters[tile], 1u) == unsigned(p.splits - 1);
      }
      __syncthreads();
      if (!last_item) continue;  // block-uniform
      __threadfence();
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) acc[j][0] = acc[j][1] = acc[j][2] = acc[j][3] = 0.f;
#pragma unroll 4
      for (int s = 0; s < p.splits; ++s) {
        const float4* part =
            p.partials + ((size_t(tile) * p.splits + s) * kWarps + warp) * kTokenTiles * 32 + lane;
#pragma unroll
        for (int j = 0; j < kTokenTiles; ++j) {
          const float4 v = __ldcg(part + j * 32);
          acc[j][0] += v.x;
          acc[j][1] += v.y;
          acc[j][2] += v.z;
          acc[j][3] += v.w;
        }
      }
      if (threadIdx.x == 0) p.counters[tile] = 0;  // every item of the tile has counted
    }

    // Epilogue. acc[j][q]: weight row row0 + g + 8 * (q / 2), token 8j + 2t + q % 2.
    if (swiglu) {
      if (warp >= kWarps / 2) {
#pragma unroll
        for (int j = 0; j < kTokenTiles; ++j) {
          up_tile[warp - kWarps / 2][j][lane] =
              make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
        }
      }
      __syncthreads();
      if (warp < kWarps / 2) {
        uint16_t* out = static_cast<uint16_t*>(p.y);
#pragma unroll
        for (int j = 0; j < kTokenTiles; ++j) {
          const float4 u4 = up_tile[warp][j][lane];
          const float up[4] = {u4.x, u4.y, u4.z, u4.w};
#pragma unroll
          for (int q = 0; q < 4; ++q) {
            const int token = 8 * j + 2 * t + q % 2, feature = row0 + g + 8 * (q / 2);
            if (token < p.rows && feature < p.half) {
              const float gate = RoundBf16(acc[j][q]);
              out[size_t(token) * p.half + feature] = ToBf16Bits(Silu(gate) * RoundBf16(up[q]));
            }
          }
        }
      }
      __syncthreads();  // up_tile is rewritten by the next item
    } else {
#pragma unroll
      for (int j = 0; j < kTokenTiles; ++j) {
#pragma unroll
        for (int q = 0; q < 4; ++q) {
          const int token = 8 * j + 2 * t + q % 2, row = row0 + g + 8 * (q / 2);
          if (token < p.rows && row < p.n) {
            const size_t at = size_t(token) * p.n + row;
            if (p.epilogue == SmallGemmEpilogue::kFloat) {
              static_cast<float*>(p.y)[at] = acc[j][q];
            } else {
              static_cast<uint16_t*>(p.y)[at] = ToBf16Bits(acc[j][q]);
            }
          }
        }
      }
    }
  }
  if (!waited) detail::PdlWait();  // a block without items still orders after its predecessor
}

template <int kBucket, int kWarps, int kQueue, bool kL2Promote, int kMinBlocks>
__global__ void __launch_bounds__(kWarps * 32, kMinBlocks)
    SmallGemmKernel(const __grid_constant__ SmallGemmKernelParams p) {
  SmallGemmBody<kBucket, kWarps, kQueue, kL2Promote>(p);
}

// Splits of k per tile: the count of work items that best fills one wave of `slots` (ties to fewer
// splits; a second wave would pay a second pipeline ramp-up per block), with at least
// kMinChunksPerSplit chunks per split and the partials within the workspace.
inline int ChooseSplits(int tiles, int tile_rows, int chunks, int slots, int bucket,
                        int64_t partial_bytes) {
  if (tiles >= slots || tiles > kMaxCounters) return 1;
  const int64_t per_split = int64_t(tiles) * tile_rows * bucket * sizeof(float);
  const int max_splits = std::min<int64_t>(
      {kMaxSplits, std::max(1, chunks / kMinChunksPerSplit), partial_bytes / per_split});
  int best = 1;
  double best_fill = 0;
  for (int s = 1; s <= max_splits && int64_t(tiles) * s <= slots; ++s) {
    const double fill = double(tiles) * s / slots;
    if (fill > best_fill + 1e-9) {
      best = s;
      best_fill = fill;
    }
  }
  return best;
}

// The kernel parameters of a validated `p` (CheckSmallGemmShape, pointers) for `warps` warps per
// block, bucket `bucket` and `slots` resident blocks.
inline SmallGemmKernelParams PlanSmallGemm(const SmallGemmParams& p, int warps, int bucket,
                                           int slots) {
  const int tile_rows = 16 * warps;
  SmallGemmKernelParams kp;
  kp.x = p.x;
  kp.w = p.w;
  kp.y = p.y;
  kp.rows = p.rows;
  kp.n = p.n;
  kp.k = p.k;
  kp.epilogue = p.epilogue;
  const bool swiglu = p.epilogue == SmallGemmEpilogue::kSwiGluBf16;
  kp.half = swiglu ? p.n / 2 : 0;
  kp.tiles = swiglu ? kp.half / (tile_rows / 2) : (p.n + tile_rows - 1) / tile_rows;
  kp.chunks = p.k / kChunk;
  const int64_t partial_bytes =
      p.workspace == nullptr ? 0 : std::max<int64_t>(0, p.workspace_bytes - kSmallGemmCounterBytes);
  kp.splits = ChooseSplits(kp.tiles, tile_rows, kp.chunks, slots, bucket, partial_bytes);
  kp.counters = static_cast<unsigned*>(p.workspace);
  kp.partials =
      p.workspace == nullptr
          ? nullptr
          : reinterpret_cast<float4*>(static_cast<char*>(p.workspace) + kSmallGemmCounterBytes);
  return kp;
}

// Launches `kernel` over min(items, slots) blocks, as a programmatic dependent of the previous
// kernel on the stream or (programmatic false) after it has finished.
template <typename Kernel>
absl::Status LaunchSmallGemmKernel(Kernel kernel, const SmallGemmKernelParams& kp, int threads,
                                   int slots, bool programmatic, cudaStream_t stream) {
  const int grid = std::min(kp.tiles * kp.splits, slots);
  if (programmatic) {
    return detail::LaunchPdlKernel(kernel, dim3(grid), threads, 0, nullptr, stream, kp);
  }
  kernel<<<grid, threads, 0, stream>>>(kp);
  LAZYRAG_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace lazyrag::kernels::small_gemm_internal
