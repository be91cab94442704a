// The RMSNorm row body shared by cuda_model::LaunchRmsNorm (model_kernels.cu, one block per
// row) and the one-row GEMV's fused residual add + RMSNorm (gemv_internal.cuh, run by the
// grid's last block), so both compute the same bits. Device code only; include from .cu files.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "worker/kernels/model_kernels.h"

namespace lazyrag::cuda_model::norm_internal {

// kVecThreads threads, kVecChunks float4 chunks each: the vector body covers dim <= 8192.
constexpr int kVecThreads = 256;
constexpr int kVecChunks = 8;

__device__ __forceinline__ uint16_t FloatToBf16(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

// Sum over the block; every thread gets the result. `scratch` holds one float per warp.
__device__ __forceinline__ float BlockSum(float v, float* scratch) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  if (warp == 0) {
    v = lane < int(blockDim.x / 32) ? scratch[lane] : 0.0f;
#pragma unroll
    for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (lane == 0) scratch[0] = v;
  }
  __syncthreads();
  return scratch[0];
}

// Four bf16 values, read through L2 only (ld.global.cg): the fused caller reads values other
// blocks of its own grid wrote, which this SM's L1 may hold stale.
__device__ __forceinline__ float4 LoadBf16x4(const uint16_t* p) {
  const uint2 u = __ldcg(reinterpret_cast<const uint2*>(p));
  return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                     __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
}

// Whether VecRow applies: dim % 4 == 0 and dim <= kVecThreads * 4 * kVecChunks.
__host__ __device__ inline bool VecRowApplies(int dim) {
  return dim % 4 == 0 && dim <= kVecThreads * 4 * kVecChunks;
}

// Row r of RmsNormParams by a block of kVecThreads threads. REQUIRES: VecRowApplies(p.dim).
// Every load of the row is issued into registers before the first store, so the loads overlap
// (x_out may alias x).
__device__ __forceinline__ void VecRow(const RmsNormParams& p, int r, float* scratch) {
  const int dim = p.dim, chunks = dim / 4;
  const int64_t src_row = p.rows != nullptr ? p.rows[r] : r;
  float4 v[kVecChunks];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kVecChunks; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    v[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (c < chunks) {
      if (p.embedding != nullptr) {
        v[k] = LoadBf16x4(p.embedding + int64_t(p.tokens[r]) * dim + 4 * c);
      } else {
        v[k] = __ldcg(reinterpret_cast<const float4*>(p.x + src_row * dim + 4 * c));
      }
      if (p.residual != nullptr) {
        const float4 d = LoadBf16x4(p.residual + src_row * dim + 4 * c);
        v[k].x += d.x;
        v[k].y += d.y;
        v[k].z += d.z;
        v[k].w += d.w;
      }
      ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    }
  }
  // The weights are loaded before the reduction (they do not depend on it), so their latency
  // overlaps the block-wide sum instead of following it.
  float4 w[kVecChunks];
#pragma unroll
  for (int k = 0; k < kVecChunks; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c < chunks) w[k] = *reinterpret_cast<const float4*>(p.weight + 4 * c);
  }
  ss = BlockSum(ss, scratch);  // its barriers also order every load above before the stores
  const float inv = 1.0f / sqrtf(ss / float(dim) + p.eps);
#pragma unroll
  for (int k = 0; k < kVecChunks; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c < chunks) {
      if (p.x_out != nullptr) *reinterpret_cast<float4*>(p.x_out + int64_t(r) * dim + 4 * c) = v[k];
      uint2 o;
      o.x = uint32_t(FloatToBf16(v[k].x * inv * w[k].x)) |
            (uint32_t(FloatToBf16(v[k].y * inv * w[k].y)) << 16);
      o.y = uint32_t(FloatToBf16(v[k].z * inv * w[k].z)) |
            (uint32_t(FloatToBf16(v[k].w * inv * w[k].w)) << 16);
      *reinterpret_cast<uint2*>(p.out + int64_t(r) * dim + 4 * c) = o;
    }
  }
}

}  // namespace lazyrag::cuda_model::norm_internal
