// The GEMV kernel of gemv.h as a template, for its launcher (gemv.cu) and the benchmark that
// chose the launcher's configuration (bench/gemv_bench.cu). Include from one .cu file each.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "worker/kernels/attention_internal.cuh"  // PdlWait, LaunchPdlKernel
#include "worker/kernels/gemv.h"
#include "worker/kernels/rope_device.cuh"  // RotateKeyPair

namespace lazyrag::cuda_model::gemv_internal {

constexpr int kThreads = 256;

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
// or 2 * kRows with SwiGLU: gate row j and up row n + j). Its
// threads walk k in 16-byte chunks: step s covers chunks [s * kThreads, (s + 1) * kThreads), thread
// t chunk t of each. The first kPre steps' weights are loaded before the wait on the previous
// kernel (no kernel of a step writes weights), so they stream while that kernel finishes; then
// kUnroll steps at a time. Sums go warp then block wide in fixed order (deterministic).
// kNormIn: the block also sums the norm's parts (one more row of the same reduction) and scales
// its sums by 1/rms; kResidualOut: the outputs update the residual (GemvResidualOut), their
// inputs loaded before the weight loop so that the epilogue waits on no load; kQkvOut: the
// outputs are split to q and the pool (GemvQkvOut), K blocks holding two rotate-half pairs.
template <int kRows, int kUnroll, int kPre, bool kSwiGlu, bool kFp32Out, bool kNormIn = false,
          bool kResidualOut = false, bool kQkvOut = false>
__global__ void __launch_bounds__(kThreads) GemvKernel(const __grid_constant__ GemvParams p) {
  static_assert(!(kResidualOut && (kSwiGlu || kFp32Out || kNormIn)), "see GemvSupports");
  static_assert(!(kQkvOut && (kSwiGlu || kFp32Out || kResidualOut || kRows != 4)),
                "see GemvSupports; a K block is two pairs");
  static_assert(kRows <= 32, "one warp writes a block's outputs");
  constexpr int kWeightRows = kSwiGlu ? 2 * kRows : kRows;
  constexpr int kSums = kWeightRows + (kNormIn ? 1 : 0);
  constexpr int kWarps = kThreads / 32;
  __shared__ float partial[kWarps][kSums];
  const int chunks = p.k / 8;
  const int first_row = blockIdx.x * kRows;
  const uint4* w = reinterpret_cast<const uint4*>(p.w);
  const uint4* x = reinterpret_cast<const uint4*>(p.x);
  // The output of local row r < kRows: first_row + r, but for a QKV output's K block (all four
  // rows in one head: q_dim and head_dim are multiples of 4), rows i, i + 1, i + D/2, i + 1 +
  // D/2 of its head with i half first_row's offset m in the head, so both features of each
  // rotated pair meet in the block (m = 0, 4, ..., D - 4 covers every pair once).
  const auto out_of = [&](int r) -> int {
    if constexpr (kQkvOut) {
      const GemvQkvOut& o = p.qkv_out;
      const int j = first_row - o.q_dim;
      if (j >= 0 && j < o.kv_dim) {
        const int D = o.head_dim, m = j % D;
        return o.q_dim + (j - m) + m / 2 + (r & 1) + (r >> 1) * (D / 2);
      }
    }
    return first_row + r;
  };
  // Weight row r of this block (rows past n clamp to the last: loaded, never stored).
  const auto row_of = [&](int r) -> int64_t {
    const int out = min(kSwiGlu ? first_row + r % kRows : out_of(r), p.n - 1);
    return kSwiGlu && r >= kRows ? int64_t(p.n) + out : int64_t(out);
  };
  float acc[kSums];
#pragma unroll
  for (int r = 0; r < kSums; ++r) acc[r] = 0.f;
  // Epilogue inputs of lane r < kRows of warp 0: the residual (written by an earlier kernel, so
  // read after the wait) and the norm weight.
  const int lane_out = first_row + int(threadIdx.x);
  const bool epilogue_lane = threadIdx.x < kRows && lane_out < p.n;
  float residual_in = 0.f, norm_weight = 0.f;
  int64_t qkv_slot = 0;                 // kQkvOut, K and V lanes: the token's pool slot
  float2 rotation = make_float2(0, 0);  // kQkvOut, K lanes: (cos, sin) of the pair
  if constexpr (kResidualOut) {
    if (epilogue_lane) norm_weight = __ldg(p.residual_out.norm_weight + lane_out);
  }
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
    if constexpr (kNormIn) {  // the previous kernel's; summed with the dot products
      for (int i = threadIdx.x; i < p.norm_in.parts; i += kThreads) {
        acc[kWeightRows] += __ldg(p.norm_in.sum_squares + i);
      }
    }
    if constexpr (kResidualOut) {
      if (epilogue_lane) residual_in = p.residual_out.residual[lane_out];
    }
    if constexpr (kQkvOut) {  // the slot and the rotation (the step's RoPE table kernel wrote it)
      const GemvQkvOut& o = p.qkv_out;
      const int j = threadIdx.x < kRows ? out_of(threadIdx.x) - o.q_dim : -1;
      if (j >= 0) qkv_slot = *o.kv_slot;
      if (j >= 0 && j < o.kv_dim) {
        const int half = o.head_dim / 2, i = j % o.head_dim;
        rotation = *reinterpret_cast<const float2*>(o.rope + 2 * (i < half ? i : i - half));
      }
    }
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
  for (int r = 0; r < kSums; ++r) {
    float v = acc[r];
#pragma unroll
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) partial[warp][r] = v;
  }
  __syncthreads();
  if (warp != 0) return;
  const int r = lane, out = out_of(r);
  float square = 0.f;  // kResidualOut: v_j^2 of this lane's output
  float qkv = 0.f;     // kQkvOut: this lane's output
  if (r < kRows && out < p.n) {
    float s = 0.f, u = 0.f;
#pragma unroll
    for (int i = 0; i < kWarps; ++i) s += partial[i][r];
    if constexpr (kSwiGlu) {
#pragma unroll
      for (int i = 0; i < kWarps; ++i) u += partial[i][kRows + r];
    }
    if constexpr (kNormIn) {
      float ss = 0.f;
#pragma unroll
      for (int i = 0; i < kWarps; ++i) ss += partial[i][kWeightRows];
      const float inv = 1.0f / sqrtf(ss / float(p.k) + p.norm_in.eps);
      s *= inv;
      u *= inv;
    }
    if constexpr (kSwiGlu) {
      // As LaunchSwiGlu on the bf16-rounded gate_up row (model_kernels.cu's Silu).
      const float g = RoundBf16(s);
      s = g / (1.0f + expf(-g)) * RoundBf16(u);
    }
    if constexpr (kResidualOut) {
      // As LaunchRmsNorm's residual add of the bf16 projection output.
      const float v = residual_in + RoundBf16(s);
      p.residual_out.residual[out] = v;
      p.residual_out.scaled[out] = __bfloat16_as_ushort(__float2bfloat16_rn(v * norm_weight));
      square = v * v;
    } else if constexpr (kQkvOut) {
      qkv = s;
    } else if constexpr (kFp32Out) {
      static_cast<float*>(p.y)[out] = s;
    } else {
      static_cast<__nv_bfloat16*>(p.y)[out] = __float2bfloat16_rn(s);
    }
  }
  if constexpr (kResidualOut) {
    float total = 0.f;  // lanes in order: the same part on every run
#pragma unroll
    for (int i = 0; i < kRows; ++i) total += __shfl_sync(0xffffffffu, square, i);
    if (lane == 0) p.residual_out.sum_squares[blockIdx.x] = total;
  }
  if constexpr (kQkvOut) {
    // As LaunchQkvScatter on the fp32 outputs: lanes 0, 1 of a K block hold feature i (+1),
    // lanes 2, 3 its rotate-half partner.
    const float partner = __shfl_xor_sync(0xffffffffu, qkv, 2);
    const GemvQkvOut& o = p.qkv_out;
    if (r < kRows && out < p.n) {
      const __nv_bfloat16 b = __float2bfloat16_rn(qkv);
      const int j = out - o.q_dim;
      if (j < 0) {
        reinterpret_cast<__nv_bfloat16*>(o.q)[out] = b;
      } else if (j < o.kv_dim) {
        const float c = rotation.x, sn = rotation.y;
        const bool low = j % o.head_dim < o.head_dim / 2;
        const float2 k = low ? kernels::detail::RotateKeyPair(qkv, partner, c, sn)
                             : kernels::detail::RotateKeyPair(partner, qkv, c, sn);
        reinterpret_cast<__nv_bfloat16*>(o.k_cache)[qkv_slot * o.kv_dim + j] =
            __float2bfloat16_rn(low ? k.x : k.y);
      } else {
        reinterpret_cast<__nv_bfloat16*>(o.v_cache)[qkv_slot * o.kv_dim + j - o.kv_dim] = b;
      }
    }
  }
}

template <int kRows, int kUnroll, int kPre>
absl::Status LaunchGemvKernel(const GemvParams& p, cudaStream_t stream) {
  const auto launch = [&](auto kernel) {
    return kernels::detail::LaunchPdlKernel(kernel, dim3((p.n + kRows - 1) / kRows), kThreads, 0,
                                            nullptr, stream, p);
  };
  if (p.residual_out.residual != nullptr) {
    return launch(GemvKernel<kRows, kUnroll, kPre, false, false, false, true>);
  }
  if (p.qkv_out.q != nullptr) {
    if constexpr (kRows == 4) {
      if (p.norm_in.sum_squares != nullptr) {
        return launch(GemvKernel<kRows, kUnroll, kPre, false, false, true, false, true>);
      }
      return launch(GemvKernel<kRows, kUnroll, kPre, false, false, false, false, true>);
    } else {
      return absl::InvalidArgumentError("gemv: a QKV output needs blocks of 4 outputs");
    }
  }
  if (p.norm_in.sum_squares != nullptr) {
    if (p.swiglu) return launch(GemvKernel<kRows, kUnroll, kPre, true, false, true>);
    if (p.y_fp32) return launch(GemvKernel<kRows, kUnroll, kPre, false, true, true>);
    return launch(GemvKernel<kRows, kUnroll, kPre, false, false, true>);
  }
  if (p.swiglu) return launch(GemvKernel<kRows, kUnroll, kPre, true, false>);
  if (p.y_fp32) return launch(GemvKernel<kRows, kUnroll, kPre, false, true>);
  return launch(GemvKernel<kRows, kUnroll, kPre, false, false>);
}

}  // namespace lazyrag::cuda_model::gemv_internal
