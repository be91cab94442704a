// LaunchWgmmaGemm (wgmma_gemm.h): TMA copies of 64-row weight boxes and of the token rows into a
// shared-memory ring (128-byte swizzle), one producer warp and one consumer warpgroup whose wgmma
// (m64, n = 32 or 64 tokens, k16; both operands K-major from shared memory) takes the weight rows
// as M. A block owns 128 weight rows and a 4-stage ring (with the fused SwiGLU: 64 gate rows and
// the 64 up rows of the same outputs, so silu(g) * u is formed in registers), or 64 rows and 8
// stages, over all of k. Launched as a
// programmatic dependent: the producer issues the first stages' weight copies before the PDL
// wait (weights are never written by a step), the token rows after. A folded RMSNorm
// (WgmmaResidualOut, WgmmaNormIn) lives in the consumers: 1/rms of every row before the main
// loop, the residual add and the per-row sums of squares in the epilogue.
#include <cuda.h>          // CUtensorMap
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "worker/kernels/attention_internal.cuh"  // LaunchPdlKernel, SetSmemLimitOnce
#include "worker/kernels/cuda_check.h"
#include "worker/kernels/device_ptx.cuh"
#include "worker/kernels/tma_tile_loader.cuh"  // mbarrier helpers
#include "worker/kernels/wgmma.cuh"
#include "worker/kernels/wgmma_gemm.h"

namespace lazyrag::kernels {
namespace {

using detail::MbarArrive;
using detail::MbarArriveExpectTx;
using detail::MbarInit;
using detail::MbarInitFence;
using detail::MbarWait;
using detail::PdlLaunchDependents;
using detail::PdlWait;
using detail::SmemAddr;

constexpr int kHalfRows = 64;  // one TMA box of weights, one wgmma M
constexpr int kStepK = 64;     // k per stage: one 128-byte swizzle row
constexpr int kConsumerThreads = 128;
constexpr int kThreads = kConsumerThreads + 32;  // one consumer warpgroup + the producer warp

struct Maps {
  CUtensorMap w;  // [n rows][k], box 64 k x 64 rows
  CUtensorMap x;  // [rows][k], box 64 k x kTokens rows
};

struct Params {
  void* y = nullptr;
  int rows = 0, n = 0, k = 0;
  int out_n = 0;  // outputs per row: n, or n / 2 with SwiGLU
  int ksteps = 0;
  int fp32 = 0;
  WgmmaResidualOut residual_out;  // on when residual is set
  WgmmaNormIn norm_in;            // on when sum_squares is set
};

// A block's shape: kBoxes boxes of 64 weight rows (the SwiGLU: 2, gate and up) and a ring of
// kStages stages.
template <int kTokens, int kBoxes, int kStages>
struct Layout {
  static constexpr int kWBytes = kBoxes * kHalfRows * 128;
  static constexpr int kXBytes = kTokens * 128;
  static constexpr int kStageBytes = kWBytes + kXBytes;
  static constexpr int kBarrierBytes = 2 * kStages * 8;
  static constexpr int kSmemBytes = 1024 + kStages * kStageBytes + kBarrierBytes;
};

#ifdef LAZYRAG_HAVE_WGMMA
__device__ __forceinline__ void TmaLoad2d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3}], [%4];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}

template <int kTokens>
__device__ __forceinline__ void Mma(float (&d)[kTokens / 8][4], uint64_t a, uint64_t b, int s) {
  if constexpr (kTokens == 32) {
    detail::WgmmaM64N32K16SS(d, a, b, s);
  } else {
    detail::WgmmaM64N64K16SS(d, a, b, s);
  }
}

__device__ __forceinline__ float Bf16Round(float v) {
  return __uint_as_float(uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(v))) << 16);
}
__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}
__device__ __forceinline__ void Store(const Params& p, int t, int j, float v) {
  if (p.fp32) {
    static_cast<float*>(p.y)[int64_t(t) * p.out_n + j] = v;
  } else {
    static_cast<__nv_bfloat16*>(p.y)[int64_t(t) * p.out_n + j] = __float2bfloat16_rn(v);
  }
}
#endif  // LAZYRAG_HAVE_WGMMA

template <int kTokens, int kBoxes, int kStages, bool kSwiGlu>
__global__ void __launch_bounds__(kThreads)
    WgmmaGemmKernel(const __grid_constant__ Params p, const __grid_constant__ Maps maps) {
  static_assert(kBoxes == 1 || kBoxes == 2, "64 or 128 weight rows a block");
  static_assert(!kSwiGlu || kBoxes == 2, "gate and up rows of the same outputs");
#ifdef LAZYRAG_HAVE_WGMMA
  using L = Layout<kTokens, kBoxes, kStages>;
  extern __shared__ __align__(1024) char smem_raw[];
  const uint32_t raw = SmemAddr(smem_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;
  const uint32_t bars = base + kStages * L::kStageBytes;
  const auto full = [&](int s) { return bars + 8u * s; };
  const auto empty = [&](int s) { return bars + 8u * (kStages + s); };
  const int tile = blockIdx.x, steps = p.ksteps;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) {
      MbarInit(full(s), 1);
      MbarInit(empty(s), kConsumerThreads / 32);
    }
    MbarInitFence();
  }
  __syncthreads();
  // Weight rows of the block's boxes: rows [r0, r0 + 64) and (two boxes) [r1, r1 + 64).
  const int r0 = kSwiGlu ? tile * kHalfRows : tile * kBoxes * kHalfRows;
  const int r1 = kSwiGlu ? p.out_n + tile * kHalfRows : r0 + kHalfRows;
  if (warp == kConsumerThreads / 32) {  // the producer warp: lane 0 issues every copy
    if (lane == 0) {
      const int pre = min(steps, kStages);
      for (int i = 0; i < pre; ++i) {  // weights before the wait: no kernel of a step writes them
        const uint32_t st = base + i * L::kStageBytes;
        const int k0 = i * kStepK;
        MbarArriveExpectTx(full(i), L::kStageBytes);
        TmaLoad2d(st, &maps.w, k0, r0, full(i));
        if (kBoxes == 2) TmaLoad2d(st + kHalfRows * 128, &maps.w, k0, r1, full(i));
      }
      PdlWait();
      for (int i = 0; i < pre; ++i) {
        TmaLoad2d(base + i * L::kStageBytes + L::kWBytes, &maps.x, i * kStepK, 0, full(i));
      }
      for (int i = pre; i < steps; ++i) {
        const int s = i % kStages;
        MbarWait(empty(s), ((i / kStages) - 1) & 1);
        const uint32_t st = base + s * L::kStageBytes;
        const int k0 = i * kStepK;
        MbarArriveExpectTx(full(s), L::kStageBytes);
        TmaLoad2d(st, &maps.w, k0, r0, full(s));
        if (kBoxes == 2) TmaLoad2d(st + kHalfRows * 128, &maps.w, k0, r1, full(s));
        TmaLoad2d(st + L::kWBytes, &maps.x, k0, 0, full(s));
      }
    }
    __syncwarp();
    PdlLaunchDependents();
    return;
  }
  float acc[kBoxes][kTokens / 8][4];
#pragma unroll
  for (int h = 0; h < kBoxes; ++h) {
#pragma unroll
    for (int j = 0; j < kTokens / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) acc[h][j][e] = 0.f;
    }
  }
  // Folded norm: each row's 1/rms from the previous projection's parts, kPer consumer threads a
  // row each summing every kPer-th part, then their sums in thread order (deterministic).
  __shared__ float row_sums[kConsumerThreads / 32][kTokens];
  __shared__ float inv_rms[kTokens];
  const bool norm_in = p.norm_in.sum_squares != nullptr;
  if (norm_in) {
    constexpr int kPer = kConsumerThreads / kTokens;
    PdlWait();  // the parts are the previous kernel's
    const int t = threadIdx.x % kTokens, q = threadIdx.x / kTokens;
    float s = 0.f;
    if (t < p.rows) {
      const float* parts = p.norm_in.sum_squares + int64_t(t) * p.norm_in.parts;
#pragma unroll 8
      for (int i = q; i < p.norm_in.parts; i += kPer) s += parts[i];
    }
    row_sums[q][t] = s;
    NamedBarrierSync(1, kConsumerThreads);
    if (threadIdx.x < kTokens) {
      float ss = 0.f;
#pragma unroll
      for (int i = 0; i < kPer; ++i) ss += row_sums[i][threadIdx.x];
      inv_rms[threadIdx.x] = 1.0f / sqrtf(ss / float(p.k) + p.norm_in.eps);
    }
    NamedBarrierSync(1, kConsumerThreads);
  }
  for (int i = 0; i < steps; ++i) {
    const int s = i % kStages;
    MbarWait(full(s), (i / kStages) & 1);
    const uint32_t st = base + s * L::kStageBytes;
    detail::WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kStepK / 16; ++kk) {
      const uint64_t b = detail::Sw128Desc(st + L::kWBytes + kk * 32, 16);
#pragma unroll
      for (int h = 0; h < kBoxes; ++h) {
        Mma<kTokens>(acc[h], detail::Sw128Desc(st + h * kHalfRows * 128 + kk * 32, 16), b, 1);
      }
    }
    detail::WgmmaCommit();
    detail::WgmmaWait<0>();
#pragma unroll
    for (int h = 0; h < kBoxes; ++h) detail::FenceAccumulators(acc[h]);
    if (lane == 0) MbarArrive(empty(s));
  }
  PdlLaunchDependents();

  // This thread's outputs: weight row 16 warp + lane / 4 (+ 8) of each half, tokens 8 j + 2 (lane
  // % 4) (+ 1): acc[h][j][e] is (row + 8 (e / 2), token + e % 2).
  const int row_in_half = 16 * warp + lane / 4, tok0 = 2 * (lane % 4);
  // Row t's 1/rms with a folded norm (the sums times it), else 1 (the sums as they are).
  const auto scale = [&](int t) { return norm_in ? inv_rms[t] : 1.f; };
  if constexpr (kSwiGlu) {  // as cuda_model::LaunchSwiGlu on the bf16-rounded gate|up row
#pragma unroll
    for (int j = 0; j < kTokens / 8; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int t = 8 * j + tok0 + (e & 1), out = tile * kHalfRows + row_in_half + 8 * (e >> 1);
        if (t < p.rows && out < p.out_n) {
          const float g = Bf16Round(acc[0][j][e] * scale(t));
          Store(p, t, out, g / (1.0f + expf(-g)) * Bf16Round(acc[1][j][e] * scale(t)));
        }
      }
    }
  } else {
    // With a residual output as LaunchRmsNorm's residual add of the bf16 projection output, then
    // bf16(v * g) and this block's sum of v^2 per row: in the thread, over the 8 lanes of a row
    // (a fixed butterfly), then over the 4 warps in order.
    const WgmmaResidualOut& r = p.residual_out;
    const bool residual = r.residual != nullptr;
    if (residual) PdlWait();  // the residual is an earlier kernel's
    float squares[kTokens / 8][2];
#pragma unroll
    for (int j = 0; j < kTokens / 8; ++j) squares[j][0] = squares[j][1] = 0.f;
#pragma unroll
    for (int h = 0; h < kBoxes; ++h) {
#pragma unroll
      for (int j = 0; j < kTokens / 8; ++j) {
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int t = 8 * j + tok0 + (e & 1);
          const int out = (tile * kBoxes + h) * kHalfRows + row_in_half + 8 * (e >> 1);
          if (t >= p.rows || out >= p.n) continue;
          const float y = acc[h][j][e] * scale(t);
          if (!residual) {
            Store(p, t, out, y);
            continue;
          }
          const int64_t at = int64_t(t) * p.n + out;
          const float v = r.residual[at] + Bf16Round(y);
          r.residual[at] = v;
          r.scaled[at] = __bfloat16_as_ushort(__float2bfloat16_rn(v * r.norm_weight[out]));
          squares[j][e & 1] += v * v;
        }
      }
    }
    if (residual) {
#pragma unroll
      for (int j = 0; j < kTokens / 8; ++j) {
#pragma unroll
        for (int b = 0; b < 2; ++b) {
#pragma unroll
          for (int off = 4; off < 32; off *= 2) {
            squares[j][b] += __shfl_xor_sync(0xffffffffu, squares[j][b], off);
          }
          if (lane < 4) row_sums[warp][8 * j + 2 * lane + b] = squares[j][b];
        }
      }
      NamedBarrierSync(1, kConsumerThreads);
      if (threadIdx.x < p.rows) {
        float total = 0.f;
#pragma unroll
        for (int w = 0; w < kConsumerThreads / 32; ++w) total += row_sums[w][threadIdx.x];
        r.sum_squares[int64_t(threadIdx.x) * gridDim.x + tile] = total;
      }
    }
  }
#endif  // LAZYRAG_HAVE_WGMMA
}

// A row-major bf16 [rows][k] matrix as a 2-D tensor map with boxes of 64 k x box_rows rows,
// 128-byte swizzle (the wgmma operand layout), zeros past the edges.
absl::Status Encode2d(CUtensorMap* map, const uint16_t* base, int64_t rows, int k, int box_rows) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = detail::TensorMapEncoder();
  if (encode == nullptr) return absl::UnavailableError("cuTensorMapEncodeTiled not available");
  const cuuint64_t dims[2] = {cuuint64_t(k), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(k) * 2};
  const cuuint32_t box[2] = {cuuint32_t(kStepK), cuuint32_t(box_rows)};
  const cuuint32_t element_strides[2] = {1, 1};
  const CUresult r =
      encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<uint16_t*>(base), dims, strides,
             box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
             CU_TENSOR_MAP_L2_PROMOTION_L2_256B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  if (r != CUDA_SUCCESS) {
    return absl::InternalError(absl::StrCat("wgmma gemm: cuTensorMapEncodeTiled failed: ", int(r)));
  }
  return absl::OkStatus();
}

template <int kTokens, int kBoxes, int kStages, bool kSwiGlu>
absl::Status Launch(const Params& p, const Maps& maps, int tiles, bool programmatic,
                    cudaStream_t stream) {
  static std::atomic<uint64_t> configured{0};
  const auto kernel = WgmmaGemmKernel<kTokens, kBoxes, kStages, kSwiGlu>;
  constexpr int kSmem = Layout<kTokens, kBoxes, kStages>::kSmemBytes;
  if (programmatic) {
    return detail::LaunchPdlKernel(kernel, dim3(tiles), kThreads, kSmem, &configured, stream, p,
                                   maps);
  }
  RETURN_IF_ERROR(
      detail::SetSmemLimitOnce(reinterpret_cast<const void*>(kernel), kSmem, &configured));
  kernel<<<tiles, kThreads, kSmem, stream>>>(p, maps);
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaGetLastError());
  return absl::OkStatus();
}

}  // namespace

int WgmmaGemmBlocks(int n, bool swiglu, int rows_per_block) {
  if (swiglu) return (n / 2 + kHalfRows - 1) / kHalfRows;
  return (n + rows_per_block - 1) / rows_per_block;
}

bool WgmmaGemmShapeOk(int rows, int n, int k, bool swiglu) {
  return rows >= 0 && rows <= kWgmmaGemmMaxRows && n > 0 && k > 0 && k % 8 == 0 &&
         !(swiglu && n % 2 != 0);
}

int WgmmaGemmRowsPerBlock(const WgmmaGemmParams& p) {
  if (p.swiglu) return 128;
  if (p.rows_per_block == 64 || p.rows_per_block == 128) return p.rows_per_block;
  int sms = 132;
  if (!detail::DeviceSmCount(&sms).ok()) (void)cudaGetLastError();
  return WgmmaGemmBlocks(p.n, false, 128) >= sms ? 128 : 64;
}

int WgmmaGemmNormParts(const WgmmaGemmParams& p) {
  return WgmmaGemmBlocks(p.n, p.swiglu, WgmmaGemmRowsPerBlock(p));
}

bool WgmmaGemmSupported() {
  static const bool supported = [] {
    int device = 0, major = 0, minor = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    cudaFuncAttributes attr;
    if (cudaFuncGetAttributes(&attr, WgmmaGemmKernel<32, 2, 4, false>) != cudaSuccess) {
      (void)cudaGetLastError();
      return false;
    }
    return major == 9 && minor == 0 && attr.binaryVersion == 90 &&
           detail::TensorMapEncoder() != nullptr;
  }();
  return supported;
}

absl::Status LaunchWgmmaGemm(const WgmmaGemmParams& wp, cudaStream_t stream) {
  if (!WgmmaGemmShapeOk(wp.rows, wp.n, wp.k, wp.swiglu)) {
    return absl::InvalidArgumentError(
        absl::StrCat("wgmma gemm: rows ", wp.rows, ", n ", wp.n, ", k ", wp.k,
                     wp.swiglu ? " with swiglu" : "", ": needs rows in 0..", kWgmmaGemmMaxRows,
                     ", n > 0 (even with swiglu) and k a positive multiple of 8"));
  }
  const auto misaligned = [](const void* ptr) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 != 0;
  };
  const WgmmaResidualOut& res = wp.residual_out;
  const bool residual = res.residual != nullptr;
  if (wp.x == nullptr || wp.w == nullptr || (wp.y == nullptr && !residual) || misaligned(wp.x) ||
      misaligned(wp.w) || (wp.swiglu && wp.y_fp32)) {
    return absl::InvalidArgumentError(
        "wgmma gemm: x, w and y (or a residual output) must be set, x and w 16-byte aligned, no "
        "fp32 y with swiglu");
  }
  if (residual && (res.norm_weight == nullptr || res.scaled == nullptr ||
                   res.sum_squares == nullptr || wp.swiglu || wp.y_fp32)) {
    return absl::InvalidArgumentError(
        "wgmma gemm: a residual output needs its norm weight, scaled rows and sum-of-squares "
        "parts, and no swiglu or fp32 y");
  }
  if (wp.norm_in.sum_squares != nullptr && (wp.norm_in.parts < 1 || !(wp.norm_in.eps >= 0.f))) {
    return absl::InvalidArgumentError(
        absl::StrCat("wgmma gemm: a norm input needs parts >= 1 and eps >= 0, got parts ",
                     wp.norm_in.parts, ", eps ", wp.norm_in.eps));
  }
  if (wp.rows == 0) return absl::OkStatus();
  if (!WgmmaGemmSupported()) {
    return absl::FailedPreconditionError("wgmma gemm: needs a compute capability 9.0 device");
  }
  const int tokens = wp.rows <= 32 ? 32 : 64;
  Params p;
  p.y = wp.y;
  p.rows = wp.rows;
  p.n = wp.n;
  p.k = wp.k;
  p.out_n = wp.swiglu ? wp.n / 2 : wp.n;
  p.fp32 = wp.y_fp32 ? 1 : 0;
  p.ksteps = (wp.k + kStepK - 1) / kStepK;
  p.residual_out = wp.residual_out;
  p.norm_in = wp.norm_in;
  Maps maps;
  RETURN_IF_ERROR(Encode2d(&maps.w, wp.w, wp.n, wp.k, kHalfRows));
  RETURN_IF_ERROR(Encode2d(&maps.x, wp.x, wp.rows, wp.k, tokens));
  const int per_block = WgmmaGemmRowsPerBlock(wp);
  const int blocks = WgmmaGemmBlocks(wp.n, wp.swiglu, per_block);
  const bool pdl = wp.programmatic;
  if (wp.swiglu) {
    return tokens == 32 ? Launch<32, 2, 4, true>(p, maps, blocks, pdl, stream)
                        : Launch<64, 2, 4, true>(p, maps, blocks, pdl, stream);
  }
  if (per_block == 128) {
    return tokens == 32 ? Launch<32, 2, 4, false>(p, maps, blocks, pdl, stream)
                        : Launch<64, 2, 4, false>(p, maps, blocks, pdl, stream);
  }
  return tokens == 32 ? Launch<32, 1, 8, false>(p, maps, blocks, pdl, stream)
                      : Launch<64, 1, 8, false>(p, maps, blocks, pdl, stream);
}

}  // namespace lazyrag::kernels
