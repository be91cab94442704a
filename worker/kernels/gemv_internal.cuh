// The GEMV kernel of gemv.h as a template, for its launcher (gemv.cu) and the benchmark that
// chose the launcher's configuration (bench/gemv_bench.cu). Include from one .cu file each.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "worker/kernels/attention_internal.cuh"  // PdlWait, LaunchPdlKernel
#include "worker/kernels/gemv.h"
#include "worker/kernels/rms_norm.cuh"

namespace lazyrag::cuda_model::gemv_internal {

constexpr int kThreads = 256;
static_assert(kThreads == norm_internal::kVecThreads, "the fused norm runs on one GEMV block");

// What a block does with its sums (GemvParams): store y, SwiGLU, the QKV split, or store y and
// then (last block) the residual add + RMSNorm.
enum class Epilogue { kStore, kSwiGlu, kQkvScatter, kStoreThenNorm };

// 16 bytes of weights, not kept in L1 (read once per step), with the 256-byte L2 prefetch hint.
__device__ __forceinline__ uint4 LoadWeights(const uint4* p) {
  uint4 v;
  asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
               : "l"(p));
  return v;
}

__device__ __forceinline__ float Dot8(const uint4& w, const uint4& x, float acc) {
  const __nv_bfloat162* wh = reinterpret_cast<const __nv_bfloat162*>(&w);
  const __nv_bfloat162* xh = reinterpret_cast<const __nv_bfloat162*>(&x);
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 a = __bfloat1622float2(wh[i]);
    const float2 b = __bfloat1622float2(xh[i]);
    acc = fmaf(a.x, b.x, acc);
    acc = fmaf(a.y, b.y, acc);
  }
  return acc;
}

__device__ __forceinline__ float RoundBf16(float f) {
  return __bfloat162float(__float2bfloat16_rn(f));
}

// Block b computes outputs [b * kRows, b * kRows + kRows) of y (kWeightRows = kRows weight rows,
// or 2 * kRows with SwiGLU: gate row j and up row n + j); with the QKV split (kRows == 2), the
// rotate-half pair of head b / (D / 2): rows h * D + j and h * D + j + D / 2, j = b % (D / 2). Its
// threads walk k in 16-byte chunks: step s covers chunks [s * kThreads, (s + 1) * kThreads), thread
// t chunk t of each. The first kPre steps' weights are loaded before the wait on the previous
// kernel (no kernel of a step writes weights), so they stream while that kernel finishes; then
// kUnroll steps at a time. Sums go warp then block wide in fixed order (deterministic).
template <int kRows, int kUnroll, int kPre, Epilogue kEpi, bool kFp32Out>
__global__ void __launch_bounds__(kThreads) GemvKernel(const __grid_constant__ GemvParams p) {
  constexpr bool kSwiGlu = kEpi == Epilogue::kSwiGlu;
  static_assert(kEpi != Epilogue::kQkvScatter || kRows == 2, "the QKV split pairs two rows");
  constexpr int kWeightRows = kSwiGlu ? 2 * kRows : kRows;
  constexpr int kWarps = kThreads / 32;
  __shared__ float partial[kWarps][kWeightRows];
  const int chunks = p.k / 8;
  const int first_row = blockIdx.x * kRows;
  const int half = p.scatter.head_dim / 2;  // kQkvScatter only
  const uint4* w = reinterpret_cast<const uint4*>(p.w);
  const uint4* x = reinterpret_cast<const uint4*>(p.x);
  // Output row of the block's row r < kRows.
  const auto out_of = [&](int r) -> int {
    if constexpr (kEpi == Epilogue::kQkvScatter) {
      return (blockIdx.x / half) * 2 * half + blockIdx.x % half + r * half;
    } else {
      return first_row + r;
    }
  };
  // Weight row r of this block (rows past n clamp to the last: loaded, never stored).
  const auto row_of = [&](int r) -> int64_t {
    const int out = min(out_of(kSwiGlu ? r % kRows : r), p.n - 1);
    return kSwiGlu && r >= kRows ? int64_t(p.n) + out : int64_t(out);
  };
  float acc[kWeightRows];
#pragma unroll
  for (int r = 0; r < kWeightRows; ++r) acc[r] = 0.f;
  {
    uint4 wp[kWeightRows][kPre];
#pragma unroll
    for (int r = 0; r < kWeightRows; ++r) {
#pragma unroll
      for (int s = 0; s < kPre; ++s) {
        const int c = threadIdx.x + s * kThreads;
        if (c < chunks) wp[r][s] = LoadWeights(w + row_of(r) * chunks + c);
      }
    }
    kernels::detail::PdlWait();
#pragma unroll
    for (int s = 0; s < kPre; ++s) {
      const int c = threadIdx.x + s * kThreads;
      if (c < chunks) {
        const uint4 xv = __ldg(x + c);
#pragma unroll
        for (int r = 0; r < kWeightRows; ++r) acc[r] = Dot8(wp[r][s], xv, acc[r]);
      }
    }
  }
  for (int c0 = threadIdx.x + kPre * kThreads; c0 < chunks; c0 += kUnroll * kThreads) {
    uint4 wv[kWeightRows][kUnroll];
#pragma unroll
    for (int r = 0; r < kWeightRows; ++r) {
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        const int c = c0 + u * kThreads;
        if (c < chunks) wv[r][u] = LoadWeights(w + row_of(r) * chunks + c);
      }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int c = c0 + u * kThreads;
      if (c < chunks) {
        const uint4 xv = __ldg(x + c);
#pragma unroll
        for (int r = 0; r < kWeightRows; ++r) acc[r] = Dot8(wv[r][u], xv, acc[r]);
      }
    }
  }
  // Every load is issued: the next kernel may be scheduled (it waits for this grid to finish).
  kernels::detail::PdlLaunchDependents();
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
#pragma unroll
  for (int r = 0; r < kWeightRows; ++r) {
    float v = acc[r];
#pragma unroll
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) partial[warp][r] = v;
  }
  __syncthreads();
  if constexpr (kEpi == Epilogue::kQkvScatter) {
    if (threadIdx.x == 0) {  // as QkvScatterBody on the fp32 row (t = 0)
      float a = 0.f, b = 0.f;
#pragma unroll
      for (int i = 0; i < kWarps; ++i) a += partial[i][0];
#pragma unroll
      for (int i = 0; i < kWarps; ++i) b += partial[i][1];
      const QkvScatterParams& q = p.scatter;
      const int D = q.head_dim, head = blockIdx.x / half, j = blockIdx.x % half;
      if (head < q.num_heads) {
        q.q[head * D + j] = norm_internal::FloatToBf16(a);
        q.q[head * D + j + half] = norm_internal::FloatToBf16(b);
      } else {
        const int64_t kvd = int64_t(q.num_kv_heads) * D, slot = q.kv_slot[0];
        const int kv_head = head - q.num_heads;
        if (kv_head < q.num_kv_heads) {
          const float2 cs = *reinterpret_cast<const float2*>(q.rope + j * 2);
          uint16_t* kc = q.k_cache + slot * kvd + kv_head * D;
          kc[j] = norm_internal::FloatToBf16(a * cs.x - b * cs.y);
          kc[j + half] = norm_internal::FloatToBf16(b * cs.x + a * cs.y);
        } else {
          uint16_t* vc = q.v_cache + slot * kvd + (kv_head - q.num_kv_heads) * D;
          vc[j] = norm_internal::FloatToBf16(a);
          vc[j + half] = norm_internal::FloatToBf16(b);
        }
      }
    }
    return;
  } else {
    if (threadIdx.x < kRows) {
      const int r = threadIdx.x, out = first_row + r;
      if (out < p.n) {
        float s = 0.f, u = 0.f;
#pragma unroll
        for (int i = 0; i < kWarps; ++i) s += partial[i][r];
        if constexpr (kSwiGlu) {
#pragma unroll
          for (int i = 0; i < kWarps; ++i) u += partial[i][kRows + r];
          // As LaunchSwiGlu on the bf16-rounded gate_up row (model_kernels.cu's Silu).
          const float g = RoundBf16(s);
          s = g / (1.0f + expf(-g)) * RoundBf16(u);
        }
        if constexpr (kFp32Out) {
          static_cast<float*>(p.y)[out] = s;
        } else {
          static_cast<__nv_bfloat16*>(p.y)[out] = __float2bfloat16_rn(s);
        }
      }
    }
    if constexpr (kEpi == Epilogue::kStoreThenNorm) {
      // The last block to finish (threadFenceReduction's pattern: each block's stores are
      // fenced before its count) runs the norm over the whole y.
      __shared__ bool last;
      __shared__ float scratch[kWarps];
      __threadfence();
      __syncthreads();
      if (threadIdx.x == 0) last = atomicAdd(p.counter, 1u) == gridDim.x - 1;
      __syncthreads();
      if (!last) return;
      __threadfence();
      norm_internal::VecRow(p.norm, 0, scratch);
      if (threadIdx.x == 0) *p.counter = 0;
    }
  }
}

template <int kRows, int kUnroll, int kPre>
absl::Status LaunchGemvKernel(const GemvParams& p, cudaStream_t stream) {
  const auto launch = [&](auto kernel, int blocks) {
    return kernels::detail::LaunchPdlKernel(kernel, dim3(blocks), kThreads, 0, nullptr, stream, p);
  };
  const int blocks = (p.n + kRows - 1) / kRows;
  if (p.swiglu) return launch(GemvKernel<kRows, kUnroll, kPre, Epilogue::kSwiGlu, false>, blocks);
  if (p.qkv_scatter) {
    return launch(GemvKernel<2, kUnroll, kPre, Epilogue::kQkvScatter, true>, p.n / 2);
  }
  if (p.then_norm) {
    return launch(GemvKernel<kRows, kUnroll, kPre, Epilogue::kStoreThenNorm, false>, blocks);
  }
  if (p.y_fp32) return launch(GemvKernel<kRows, kUnroll, kPre, Epilogue::kStore, true>, blocks);
  return launch(GemvKernel<kRows, kUnroll, kPre, Epilogue::kStore, false>, blocks);
}

}  // namespace lazyrag::cuda_model::gemv_internal
