#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <climits>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "worker/kernels/attention_internal.cuh"  // PdlWait, LaunchPdlKernel
#include "worker/kernels/cuda_check.h"
#include "worker/kernels/model_kernels.h"
#include "worker/kernels/rope_device.cuh"  // RotateKeyPair
#include "worker/model/synthetic_init.h"

namespace lazyrag::cuda_model {
namespace {

constexpr int kNormThreads = 256;
constexpr int kScatterThreads = 128;
constexpr int kElementwiseThreads = 256;
constexpr int kMaxGridBlocks = 1 << 20;  // grid-stride beyond this
constexpr int kFallbackMaxHeadDim = 256;
constexpr int kFallbackPerLane = kFallbackMaxHeadDim / 32;

__device__ __forceinline__ float Bf16ToFloat(uint16_t v) {
  return __uint_as_float(uint32_t(v) << 16);
}
__device__ __forceinline__ uint16_t FloatToBf16(float f) {
  return __bfloat16_as_ushort(__float2bfloat16_rn(f));
}

int GridFor(int64_t work, int threads) {
  return int(std::min<int64_t>((work + threads - 1) / threads, kMaxGridBlocks));
}

// ---------------------------------------------------------------------------------------------
// RoPE table.

__device__ __forceinline__ void RopeTableBody(const RopeTableParams& p) {
  const int64_t total = int64_t(p.num_tokens) * p.half;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int t = int(idx / p.half), i = int(idx % p.half);
    double s, c;
    sincos(double(p.pos[t]) * double(p.inv_freq[i]), &s, &c);
    p.table[2 * idx] = float(c);
    p.table[2 * idx + 1] = float(s);
  }
}
__global__ void RopeTableKernel(const __grid_constant__ RopeTableParams p) { RopeTableBody(p); }

// ---------------------------------------------------------------------------------------------
// RMSNorm (optionally gathering embedding rows).

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

// Fast path: dim % 4 == 0 and dim <= kNormThreads * 4 * kNormChunks. Every load of the row
// is issued into registers before the first store, so the loads overlap (the scalar loop
// below serializes them: x_out may alias x).
constexpr int kNormChunks = 8;  // float4 chunks per thread: dim <= 8192

__device__ __forceinline__ float4 LoadBf16x4(const uint16_t* p) {
  const uint2 u = *reinterpret_cast<const uint2*>(p);
  return make_float4(__uint_as_float(u.x << 16), __uint_as_float(u.x & 0xffff0000u),
                     __uint_as_float(u.y << 16), __uint_as_float(u.y & 0xffff0000u));
}

// Chunk c (four features) of output row r's source: the embedding row of its token or x's row
// src_row, plus the bf16 residual when set.
__device__ __forceinline__ float4 NormSourceChunk(const RmsNormParams& p, int r, int64_t src_row,
                                                  int c) {
  float4 v = p.embedding != nullptr
                 ? LoadBf16x4(p.embedding + int64_t(p.tokens[r]) * p.dim + 4 * c)
                 : *reinterpret_cast<const float4*>(p.x + src_row * p.dim + 4 * c);
  if (p.residual != nullptr) {
    const float4 d = LoadBf16x4(p.residual + src_row * p.dim + 4 * c);
    v.x += d.x;
    v.y += d.y;
    v.z += d.z;
    v.w += d.w;
  }
  return v;
}

// Stores chunk c of output row r: the source to x_out (when set) and v * inv * w to out.
__device__ __forceinline__ void StoreNormedChunk(const RmsNormParams& p, int r, int c,
                                                 const float4& v, const float4& w, float inv) {
  if (p.x_out != nullptr) *reinterpret_cast<float4*>(p.x_out + int64_t(r) * p.dim + 4 * c) = v;
  uint2 o;
  o.x = uint32_t(FloatToBf16(v.x * inv * w.x)) | (uint32_t(FloatToBf16(v.y * inv * w.y)) << 16);
  o.y = uint32_t(FloatToBf16(v.z * inv * w.z)) | (uint32_t(FloatToBf16(v.w * inv * w.w)) << 16);
  *reinterpret_cast<uint2*>(p.out + int64_t(r) * p.dim + 4 * c) = o;
}

__device__ __forceinline__ void RmsNormVecBody(const RmsNormParams& p, float* scratch) {
  const int r = blockIdx.x;
  const int dim = p.dim, chunks = dim / 4;
  const int64_t src_row = p.rows != nullptr ? p.rows[r] : r;
  float4 v[kNormChunks];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormChunks; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    v[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (c < chunks) {
      v[k] = NormSourceChunk(p, r, src_row, c);
      ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    }
  }
  // The weights are loaded before the reduction (they do not depend on it), so their latency
  // overlaps the block-wide sum instead of following it.
  float4 w[kNormChunks];
#pragma unroll
  for (int k = 0; k < kNormChunks; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c < chunks) w[k] = *reinterpret_cast<const float4*>(p.weight + 4 * c);
  }
  ss = BlockSum(ss, scratch);  // its barriers also order every load above before the stores
  const float inv = 1.0f / sqrtf(ss / float(dim) + p.eps);
#pragma unroll
  for (int k = 0; k < kNormChunks; ++k) {
    const int c = threadIdx.x + k * blockDim.x;
    if (c < chunks) StoreNormedChunk(p, r, c, v[k], w[k], inv);
  }
}

__device__ __forceinline__ void RmsNormBody(const RmsNormParams& p, float* scratch) {
  if (p.dim % 4 == 0 && p.dim <= int(blockDim.x) * 4 * kNormChunks) {
    RmsNormVecBody(p, scratch);
    return;
  }

  const int r = blockIdx.x;
  const int dim = p.dim;
  const int64_t src_row = p.rows != nullptr ? p.rows[r] : r;
  const uint16_t* emb = p.embedding != nullptr ? p.embedding + int64_t(p.tokens[r]) * dim : nullptr;
  const float* src = p.x != nullptr ? p.x + src_row * dim : nullptr;
  const uint16_t* res = p.residual != nullptr ? p.residual + src_row * dim : nullptr;
  float* x_out = p.x_out != nullptr ? p.x_out + int64_t(r) * dim : nullptr;
  float ss = 0.0f;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float v = emb != nullptr ? Bf16ToFloat(emb[i]) : src[i];
    if (res != nullptr) v += Bf16ToFloat(res[i]);
    if (x_out != nullptr) x_out[i] = v;  // read back below by this same thread
    ss += v * v;
  }
  ss = BlockSum(ss, scratch);
  const float inv = 1.0f / sqrtf(ss / float(dim) + p.eps);
  uint16_t* out = p.out + int64_t(r) * dim;
  for (int i = threadIdx.x; i < dim; i += blockDim.x) {
    float v;
    if (x_out != nullptr) {
      v = x_out[i];
    } else {
      v = emb != nullptr ? Bf16ToFloat(emb[i]) : src[i];
      if (res != nullptr) v += Bf16ToFloat(res[i]);
    }
    out[i] = FloatToBf16(v * inv * p.weight[i]);
  }
}
__global__ void __launch_bounds__(kNormThreads)
    RmsNormKernel(const __grid_constant__ RmsNormParams p) {
  // Launched as a programmatic dependent of the previous kernel (LaunchPdl): wait for it, and
  // let the next one start its prologue.
  kernels::detail::PdlWait();
  kernels::detail::PdlLaunchDependents();
  __shared__ float scratch[kNormThreads / 32];
  RmsNormBody(p, scratch);
}

// RmsNormUsesClusters: a row over a cluster of kNormCluster blocks. Block q of the cluster
// takes the row's chunks [q C, (q + 1) C), C = dim / 4 / kNormCluster, at most
// kNormClusterChunks a thread; the sum of squares is reduced in the block, then over the cluster
// through distributed shared memory in rank order (deterministic).
constexpr int kNormCluster = 4;
constexpr int kNormClusterChunks = 2;

__global__ void __launch_bounds__(kNormThreads)
    RmsNormClusterKernel(const __grid_constant__ RmsNormParams p) {
  kernels::detail::PdlWait();
  kernels::detail::PdlLaunchDependents();
  __shared__ float scratch[kNormThreads / 32];
  const int r = blockIdx.x / kNormCluster;
  const unsigned q = blockIdx.x % kNormCluster;  // the block's rank in its cluster
  const int dim = p.dim, per_block = dim / 4 / kNormCluster;
  const int64_t src_row = p.rows != nullptr ? p.rows[r] : r;
  float4 v[kNormClusterChunks], w[kNormClusterChunks];
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < kNormClusterChunks; ++k) {
    const int c = q * per_block + threadIdx.x + k * blockDim.x;
    v[k] = make_float4(0.f, 0.f, 0.f, 0.f);
    if (threadIdx.x + k * blockDim.x < per_block) {
      v[k] = NormSourceChunk(p, r, src_row, c);
      w[k] = *reinterpret_cast<const float4*>(p.weight + 4 * c);
      ss += v[k].x * v[k].x + v[k].y * v[k].y + v[k].z * v[k].z + v[k].w * v[k].w;
    }
  }
  ss = BlockSum(ss, scratch);
  kernels::detail::ClusterArrive();  // every block's sum is in its scratch[0]
  kernels::detail::ClusterWait();
  float total = 0.0f;
#pragma unroll
  for (unsigned rank = 0; rank < kNormCluster; ++rank) {
    total += kernels::detail::LoadClusterShared(&scratch[0], rank);
  }
  // Peers read this block's scratch: it stays until every block of the cluster has (the wait
  // at the end).
  kernels::detail::ClusterArrive();
  const float inv = 1.0f / sqrtf(total / float(dim) + p.eps);
#pragma unroll
  for (int k = 0; k < kNormClusterChunks; ++k) {
    const int c = q * per_block + threadIdx.x + k * blockDim.x;
    if (threadIdx.x + k * blockDim.x < per_block) StoreNormedChunk(p, r, c, v[k], w[k], inv);
  }
  kernels::detail::ClusterWait();
}

// ---------------------------------------------------------------------------------------------
// Greedy sampling: each logit row cut into parts, a block each, then one warp per row.

constexpr int kArgmaxThreads = 256;
constexpr int kArgmaxPerThread = 16;  // independent loads in flight per thread and pass
constexpr int kArgmaxPass = kArgmaxThreads * kArgmaxPerThread;

// Warp w of block (part, group) takes row 8 group + w, lane l its columns 128 part + 4 l .. + 3:
// the residual add, bf16(v * g), then the part's sum of squares (the lane's four in order, then a
// fixed butterfly). Lets the next kernel launch at once: it waits for this one before reading.
constexpr int kResidualScaleCols = 128;
__global__ void __launch_bounds__(256)
    ResidualScaleKernel(const __grid_constant__ ResidualScaleParams p) {
  kernels::detail::PdlWait();
  kernels::detail::PdlLaunchDependents();
  const int lane = threadIdx.x % 32, t = blockIdx.y * 8 + threadIdx.x / 32;
  if (t >= p.rows) return;  // the whole warp
  const int c0 = blockIdx.x * kResidualScaleCols + 4 * lane;
  const int64_t at = int64_t(t) * p.dim + c0;
  float sq = 0.f;
  if (p.dim % 4 == 0 && c0 < p.dim) {  // 16-byte rows: vector accesses
    float4 v = *reinterpret_cast<const float4*>(p.x + at);
    const float4 d = LoadBf16x4(p.delta + at);
    const float4 w = *reinterpret_cast<const float4*>(p.weight + c0);
    v.x += d.x;
    v.y += d.y;
    v.z += d.z;
    v.w += d.w;
    *reinterpret_cast<float4*>(p.x + at) = v;
    uint2 o;
    o.x = uint32_t(FloatToBf16(v.x * w.x)) | (uint32_t(FloatToBf16(v.y * w.y)) << 16);
    o.y = uint32_t(FloatToBf16(v.z * w.z)) | (uint32_t(FloatToBf16(v.w * w.w)) << 16);
    *reinterpret_cast<uint2*>(p.scaled + at) = o;
    sq = v.x * v.x;
    sq += v.y * v.y;
    sq += v.z * v.z;
    sq += v.w * v.w;
  } else if (p.dim % 4 != 0) {
    for (int k = 0; k < 4 && c0 + k < p.dim; ++k) {
      const float v = p.x[at + k] + Bf16ToFloat(p.delta[at + k]);
      p.x[at + k] = v;
      p.scaled[at + k] = FloatToBf16(v * p.weight[c0 + k]);
      sq += v * v;
    }
  }
  for (int off = 16; off > 0; off >>= 1) sq += __shfl_xor_sync(~0u, sq, off);
  if (lane == 0) p.sum_squares[int64_t(t) * gridDim.x + blockIdx.x] = sq;
}

// (v, i) becomes the better of itself and (ov, oi): the larger value, then the lower index.
// Associative and commutative, so any split of a row and any merge order give the same id.
__device__ __forceinline__ void ArgmaxMerge(float& v, int& i, float ov, int oi) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

__device__ __forceinline__ void ArgmaxWarp(float& v, int& i) {
  for (int off = 16; off > 0; off >>= 1) {
    ArgmaxMerge(v, i, __shfl_xor_sync(~0u, v, off), __shfl_xor_sync(~0u, i, off));
  }
}

// Block (part, row) reduces its share of the row to one (value, index) pair in partial[row,
// part]. Several blocks a row, because one SM alone reads a 128k-entry row at a small fraction
// of the memory bandwidth.
__global__ void __launch_bounds__(kArgmaxThreads)
    ArgmaxPartsKernel(const __grid_constant__ ArgmaxRowsParams p, int parts, int per_part) {
  kernels::detail::PdlLaunchDependents();
  kernels::detail::PdlWait();  // the logits are the previous kernel's output
  const float* row = p.logits + int64_t(blockIdx.y) * p.vocab;
  const int begin = blockIdx.x * per_part, end = min(p.vocab, begin + per_part);
  float best = -INFINITY;
  int idx = INT_MAX;
  for (int base = begin + threadIdx.x; base < end; base += kArgmaxPass) {
    float v[kArgmaxPerThread];
#pragma unroll
    for (int j = 0; j < kArgmaxPerThread; ++j) {
      const int i = base + j * kArgmaxThreads;
      v[j] = i < end ? __ldg(row + i) : -INFINITY;
    }
#pragma unroll
    for (int j = 0; j < kArgmaxPerThread; ++j) {
      const int i = base + j * kArgmaxThreads;
      if (i < end) ArgmaxMerge(best, idx, v[j], i);
    }
  }
  ArgmaxWarp(best, idx);
  __shared__ float warp_best[kArgmaxThreads / 32];
  __shared__ int warp_idx[kArgmaxThreads / 32];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) {
    warp_best[warp] = best;
    warp_idx[warp] = idx;
  }
  __syncthreads();
  if (warp != 0) return;
  best = lane < kArgmaxThreads / 32 ? warp_best[lane] : -INFINITY;
  idx = lane < kArgmaxThreads / 32 ? warp_idx[lane] : INT_MAX;
  ArgmaxWarp(best, idx);
  if (lane == 0) {
    const int64_t at = int64_t(blockIdx.y) * parts + blockIdx.x;
    p.partial_value[at] = best;
    p.partial_index[at] = idx;
  }
}

// One warp per row merges the row's parts (at most kArgmaxMaxParts).
__global__ void __launch_bounds__(32)
    ArgmaxMergeKernel(const __grid_constant__ ArgmaxRowsParams p, int parts) {
  kernels::detail::PdlLaunchDependents();
  kernels::detail::PdlWait();
  const int64_t first = int64_t(blockIdx.x) * parts;
  float best = -INFINITY;
  int idx = INT_MAX;
  for (int j = threadIdx.x; j < parts; j += 32) {
    ArgmaxMerge(best, idx, p.partial_value[first + j], p.partial_index[first + j]);
  }
  ArgmaxWarp(best, idx);
  if (threadIdx.x == 0) p.ids[blockIdx.x] = idx < p.vocab ? idx : 0;  // an all-NaN row: 0
}

// ---------------------------------------------------------------------------------------------
// QKV split + RoPE on K + K/V scatter to the pool.

// One work item per thread: a pair of Q features, a rotated (i, i + half) pair of K features,
// or a pair of V features; items of one token are consecutive.
__device__ __forceinline__ void QkvScatterBody(const QkvScatterParams& p) {
  const int D = p.head_dim, half = D / 2;
  const int qd = p.num_heads * D, kvd = p.num_kv_heads * D;
  const int q_items = qd / 2, k_items = p.num_kv_heads * half, v_items = kvd / 2;
  const int per_token = q_items + k_items + v_items;
  const int64_t total = int64_t(p.num_tokens) * per_token;
  for (int64_t idx = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; idx < total;
       idx += int64_t(gridDim.x) * blockDim.x) {
    const int64_t t = idx / per_token;
    int e = int(idx - t * per_token);
    const float* row = p.qkv + t * (qd + 2 * kvd);
    if (e < q_items) {
      const float2 x = *reinterpret_cast<const float2*>(row + 2 * e);
      p.q[t * qd + 2 * e] = FloatToBf16(x.x);
      p.q[t * qd + 2 * e + 1] = FloatToBf16(x.y);
      continue;
    }
    e -= q_items;
    const int64_t slot = p.kv_slot[t];
    if (e < k_items) {
      const int h = e / half, i = e - h * half;
      const float* kr = row + qd + h * D;
      const float2 cs = *reinterpret_cast<const float2*>(p.rope + (t * half + i) * 2);
      const float2 k = kernels::detail::RotateKeyPair(kr[i], kr[i + half], cs.x, cs.y);
      uint16_t* kc = p.k_cache + slot * kvd + h * D;
      kc[i] = FloatToBf16(k.x);
      kc[i + half] = FloatToBf16(k.y);
      continue;
    }
    e -= k_items;
    const float2 x = *reinterpret_cast<const float2*>(row + qd + kvd + 2 * e);
    p.v_cache[slot * kvd + 2 * e] = FloatToBf16(x.x);
    p.v_cache[slot * kvd + 2 * e + 1] = FloatToBf16(x.y);
  }
}
__global__ void __launch_bounds__(kElementwiseThreads)
    QkvScatterKernel(const __grid_constant__ QkvScatterParams p) {
  // The attention kernel that follows is a programmatic dependent launch: letting it start
  // before this kernel's own wait overlaps its split planning and page-id loads (which read
  // nothing this kernel or the projection before it writes) with both; it waits for this
  // grid, which ends after the projection's, before reading q or K/V.
  kernels::detail::PdlLaunchDependents();
  kernels::detail::PdlWait();
  QkvScatterBody(p);
}

// ---------------------------------------------------------------------------------------------
// SwiGLU.

__device__ __forceinline__ float Silu(float g) { return g / (1.0f + expf(-g)); }

__device__ __forceinline__ void SwiGluBody(const SwiGluParams& p) {
  const int64_t stride = int64_t(gridDim.x) * blockDim.x;
  const int64_t first = blockIdx.x * int64_t(blockDim.x) + threadIdx.x;
  if (p.ff % 8 == 0) {  // 16-byte accesses: 8 features per thread
    const int chunks = p.ff / 8;
    const int64_t total = int64_t(p.num_tokens) * chunks;
    for (int64_t idx = first; idx < total; idx += stride) {
      const int64_t t = idx / chunks, c = idx - t * chunks;
      const uint16_t* g_row = p.gate_up + t * 2 * p.ff;
      const uint4 g4 = *reinterpret_cast<const uint4*>(g_row + c * 8);
      const uint4 u4 = *reinterpret_cast<const uint4*>(g_row + p.ff + c * 8);
      const uint16_t* g = reinterpret_cast<const uint16_t*>(&g4);
      const uint16_t* u = reinterpret_cast<const uint16_t*>(&u4);
      uint4 o4;
      uint16_t* o = reinterpret_cast<uint16_t*>(&o4);
#pragma unroll
      for (int e = 0; e < 8; ++e) o[e] = FloatToBf16(Silu(Bf16ToFloat(g[e])) * Bf16ToFloat(u[e]));
      *reinterpret_cast<uint4*>(p.out + t * p.ff + c * 8) = o4;
    }
  } else {
    const int64_t total = int64_t(p.num_tokens) * p.ff;
    for (int64_t idx = first; idx < total; idx += stride) {
      const int64_t t = idx / p.ff, i = idx - t * p.ff;
      const float g = Bf16ToFloat(p.gate_up[t * 2 * p.ff + i]);
      const float u = Bf16ToFloat(p.gate_up[t * 2 * p.ff + p.ff + i]);
      p.out[idx] = FloatToBf16(Silu(g) * u);
    }
  }
}
__global__ void __launch_bounds__(kElementwiseThreads)
    SwiGluKernel(const __grid_constant__ SwiGluParams p) {
  kernels::detail::PdlWait();  // as RmsNormKernel
  kernels::detail::PdlLaunchDependents();
  SwiGluBody(p);
}

// ---------------------------------------------------------------------------------------------
// Weights: synthetic fill and conversions.

__device__ __forceinline__ void SyntheticFillBody(const SyntheticFillParams& p) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < p.n;
       i += int64_t(gridDim.x) * blockDim.x) {
    // The loader's expressions (worker/model/synthetic_init.h): products of two factors only,
    // so no fused multiply-add can make device and host values differ.
    const uint64_t g =
        uint64_t(p.first + (p.cols > 0 ? (i / p.cols) * p.global_cols + i % p.cols : i));
    const float v = p.bound > 0.0f ? SyntheticLinearWeight(p.seed, p.tag, g, p.bound)
                                   : SyntheticUniform(p.seed, p.tag, g);
    p.dst[i] = FloatToBf16(v);
  }
}
__global__ void __launch_bounds__(kElementwiseThreads)
    SyntheticFillKernel(const __grid_constant__ SyntheticFillParams p) {
  SyntheticFillBody(p);
}

__global__ void __launch_bounds__(kElementwiseThreads)
    FloatToBf16Kernel(const float* __restrict__ src, uint16_t* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = FloatToBf16(src[i]);
  }
}
__global__ void __launch_bounds__(kElementwiseThreads)
    Bf16ToFloatKernel(const uint16_t* __restrict__ src, float* __restrict__ dst, int64_t n) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    dst[i] = Bf16ToFloat(src[i]);
  }
}

// ---------------------------------------------------------------------------------------------
// Fallback attention (head dims other than 64 / 128).

__device__ __forceinline__ float WarpSum(float v) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
  return v;
}

__device__ __forceinline__ void FallbackAttentionBody(const FallbackAttentionParams& p) {
  const int row = blockIdx.x, head = blockIdx.y, lane = threadIdx.x;
  const int D = p.head_dim, half = D / 2;
  const int kvh = head / (p.num_heads / p.num_kv_heads);
  const SegmentView& v = p.view;
  const int b = p.row_request[row];
  const int pos = v.q_pos[row];
  const uint16_t* qr = p.q + (int64_t(row) * p.num_heads + head) * D;
  float qv[kFallbackPerLane], qpartner[kFallbackPerLane], qrot[kFallbackPerLane],
      acc[kFallbackPerLane];
#pragma unroll
  for (int k = 0; k < kFallbackPerLane; ++k) {
    const int f = lane + 32 * k;
    qv[k] = f < D ? Bf16ToFloat(qr[f]) : 0.0f;
    qpartner[k] = f < D ? Bf16ToFloat(qr[f < half ? f + half : f - half]) : 0.0f;
    acc[k] = 0.0f;
  }
  float m = -INFINITY, l = 0.0f;
  for (int s = v.seg_indptr[b]; s < v.seg_indptr[b + 1]; ++s) {
    const int start = v.seg_start[s];
    const int visible = min(v.seg_len[s], pos - start + 1);
    if (visible <= 0) continue;
#pragma unroll
    for (int k = 0; k < kFallbackPerLane; ++k) {
      const int f = lane + 32 * k;
      qrot[k] = 0.0f;
      if (f < D) {
        const int i = f < half ? f : f - half;
        double sd, cd;
        sincos(double(pos - start) * double(p.inv_freq[i]), &sd, &cd);
        const float c = float(cd), sn = float(sd);
        qrot[k] = f < half ? qv[k] * c - qpartner[k] * sn : qv[k] * c + qpartner[k] * sn;
      }
    }
    const int32_t* pages = v.page_indices + v.page_indptr[s];
    const float seg_scale = p.scale * (v.seg_scale != nullptr ? v.seg_scale[s] : 1.0f);
    const float seg_bias = v.seg_bias != nullptr ? v.seg_bias[s] : 0.0f;
    for (int j = v.seg_skip != nullptr ? v.seg_skip[s] : 0; j < visible; ++j) {
      const int64_t slot = int64_t(pages[j / v.page_size]) * v.page_size + j % v.page_size;
      const uint16_t* kp = p.k_cache + (slot * p.num_kv_heads + kvh) * D;
      const uint16_t* vp = p.v_cache + (slot * p.num_kv_heads + kvh) * D;
      float dot = 0.0f;
#pragma unroll
      for (int k = 0; k < kFallbackPerLane; ++k) {
        const int f = lane + 32 * k;
        if (f < D) dot += qrot[k] * Bf16ToFloat(kp[f]);
      }
      const float score = WarpSum(dot) * seg_scale + seg_bias;
      const float m_new = fmaxf(m, score);
      const float corr = expf(m - m_new);  // 0 while m is -inf
      const float w = expf(score - m_new);
      l = l * corr + w;
#pragma unroll
      for (int k = 0; k < kFallbackPerLane; ++k) {
        const int f = lane + 32 * k;
        if (f < D) acc[k] = acc[k] * corr + w * Bf16ToFloat(vp[f]);
      }
      m = m_new;
    }
  }
  const float inv = l > 0.0f ? 1.0f / l : 0.0f;
  uint16_t* out = p.out + (int64_t(row) * p.num_heads + head) * D;
#pragma unroll
  for (int k = 0; k < kFallbackPerLane; ++k) {
    const int f = lane + 32 * k;
    if (f < D) out[f] = FloatToBf16(acc[k] * inv);
  }
}
__global__ void __launch_bounds__(32)
    FallbackAttentionKernel(const __grid_constant__ FallbackAttentionParams p) {
  FallbackAttentionBody(p);
}

__device__ __forceinline__ void FallbackMaterializeBody(const FallbackMaterializeParams& p) {
  const int j = blockIdx.x, c = blockIdx.y, layer = blockIdx.z;
  if (j >= p.len[c]) return;
  const int ps = p.page_size, D = p.head_dim, half = D / 2;
  const int kvd = p.num_kv_heads * D;
  const int sj = (p.src_offset != nullptr ? p.src_offset[c] : 0) + j;
  const int64_t src = int64_t(p.src_pages[p.src_page_indptr[c] + sj / ps]) * ps + sj % ps;
  const int t = p.dst_offset[c] + j;
  const int64_t dst = int64_t(p.dst_pages[p.dst_page_indptr[c] + t / ps]) * ps + t % ps;
  const uint16_t* ks = p.k_cache + layer * p.layer_stride + src * kvd;
  uint16_t* kd = p.k_cache + layer * p.layer_stride + dst * kvd;
  const uint16_t* vs = p.v_cache + layer * p.layer_stride + src * kvd;
  uint16_t* vd = p.v_cache + layer * p.layer_stride + dst * kvd;
  const double delta = p.delta[c];
  for (int idx = threadIdx.x; idx < p.num_kv_heads * half; idx += blockDim.x) {
    const int h = idx / half, i = idx - h * half;
    double sd, cd;
    sincos(delta * double(p.inv_freq[i]), &sd, &cd);
    const float co = float(cd), si = float(sd);
    const float x0 = Bf16ToFloat(ks[h * D + i]), x1 = Bf16ToFloat(ks[h * D + i + half]);
    kd[h * D + i] = FloatToBf16(x0 * co - x1 * si);
    kd[h * D + i + half] = FloatToBf16(x1 * co + x0 * si);
  }
  for (int i = threadIdx.x; i < kvd; i += blockDim.x) vd[i] = vs[i];
}
__global__ void __launch_bounds__(kScatterThreads)
    FallbackMaterializeKernel(const __grid_constant__ FallbackMaterializeParams p) {
  FallbackMaterializeBody(p);
}

}  // namespace

absl::Status LaunchRopeTable(const RopeTableParams& p, cudaStream_t stream) {
  const int64_t work = int64_t(p.num_tokens) * p.half;
  if (work == 0) return absl::OkStatus();
  RopeTableKernel<<<GridFor(work, kElementwiseThreads), kElementwiseThreads, 0, stream>>>(p);
  LAZYRAG_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

bool RmsNormUsesClusters(const RmsNormParams& p) {
  if (p.embedding != nullptr || p.x == nullptr || p.num_rows <= 0 ||
      p.dim % (4 * kNormCluster) != 0 ||
      p.dim / 4 / kNormCluster > kNormThreads * kNormClusterChunks) {
    return false;
  }
  int sms = 0;
  return kernels::detail::DeviceSmCount(&sms).ok() &&
         int64_t(p.num_rows) * kNormCluster <= int64_t(sms);
}

absl::Status LaunchRmsNorm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.num_rows == 0) return absl::OkStatus();
  if (RmsNormUsesClusters(p)) {
    return kernels::detail::LaunchPdlClusterKernel(RmsNormClusterKernel,
                                                   dim3(p.num_rows * kNormCluster), kNormCluster,
                                                   kNormThreads, 0, nullptr, stream, p);
  }
  return kernels::detail::LaunchPdlKernel(RmsNormKernel, dim3(p.num_rows), kNormThreads, 0, nullptr,
                                          stream, p);
}

int ResidualScaleParts(int dim) { return (dim + kResidualScaleCols - 1) / kResidualScaleCols; }

absl::Status LaunchResidualScale(const ResidualScaleParams& p, cudaStream_t stream) {
  const auto misaligned = [](const void* ptr) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 != 0;
  };
  if (p.x == nullptr || p.delta == nullptr || p.weight == nullptr || p.scaled == nullptr ||
      p.sum_squares == nullptr || misaligned(p.x) || misaligned(p.delta) || misaligned(p.weight) ||
      misaligned(p.scaled) || p.rows < 0 || p.dim < 1) {
    return absl::InvalidArgumentError(absl::StrCat(
        "residual scale: x, delta, weight, scaled (16-byte aligned) and sum_squares must be set, "
        "rows >= 0 and dim >= 1; got rows ",
        p.rows, ", dim ", p.dim));
  }
  if (p.rows == 0) return absl::OkStatus();
  return kernels::detail::LaunchPdlKernel(ResidualScaleKernel,
                                          dim3(ResidualScaleParts(p.dim), (p.rows + 7) / 8), 256, 0,
                                          nullptr, stream, p);
}

absl::Status LaunchQkvScatter(const QkvScatterParams& p, cudaStream_t stream) {
  const int64_t work = int64_t(p.num_tokens) * (p.num_heads + 2 * p.num_kv_heads) * p.head_dim / 2;
  if (work == 0) return absl::OkStatus();
  return kernels::detail::LaunchPdlKernel(QkvScatterKernel,
                                          dim3(GridFor(work, kElementwiseThreads)),
                                          kElementwiseThreads, 0, nullptr, stream, p);
}

absl::Status LaunchSwiGlu(const SwiGluParams& p, cudaStream_t stream) {
  const int64_t work = int64_t(p.num_tokens) * (p.ff % 8 == 0 ? p.ff / 8 : p.ff);
  if (work == 0) return absl::OkStatus();
  return kernels::detail::LaunchPdlKernel(SwiGluKernel, dim3(GridFor(work, kElementwiseThreads)),
                                          kElementwiseThreads, 0, nullptr, stream, p);
}

int ArgmaxRowsParts(int vocab) {
  return std::clamp((vocab + kArgmaxPass - 1) / kArgmaxPass, 1, kArgmaxMaxParts);
}

absl::Status LaunchArgmaxRows(const ArgmaxRowsParams& p, cudaStream_t stream) {
  if (p.num_rows == 0) return absl::OkStatus();
  if (p.num_rows < 0 || p.num_rows > 65535 || p.vocab <= 0 || p.logits == nullptr ||
      p.ids == nullptr || p.partial_value == nullptr || p.partial_index == nullptr) {
    return absl::InvalidArgumentError(
        "argmax: needs 0 <= num_rows <= 65535, vocab > 0, logits, ids and the partials");
  }
  const int parts = ArgmaxRowsParts(p.vocab);
  const int per_part = (p.vocab + parts - 1) / parts;
  RETURN_IF_ERROR(kernels::detail::LaunchPdlKernel(ArgmaxPartsKernel, dim3(parts, p.num_rows),
                                                   kArgmaxThreads, 0, nullptr, stream, p, parts,
                                                   per_part));
  return kernels::detail::LaunchPdlKernel(ArgmaxMergeKernel, dim3(p.num_rows), 32, 0, nullptr,
                                          stream, p, parts);
}

absl::Status LaunchSyntheticFill(const SyntheticFillParams& p, cudaStream_t stream) {
  if (p.n == 0) return absl::OkStatus();
  SyntheticFillKernel<<<GridFor(p.n, kElementwiseThreads), kElementwiseThreads, 0, stream>>>(p);
  LAZYRAG_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status LaunchFloatToBf16(const float* src, uint16_t* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  FloatToBf16Kernel<<<GridFor(n, kElementwiseThreads), kElementwiseThreads, 0, stream>>>(src, dst,
                                                                                         n);
  LAZYRAG_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status LaunchBf16ToFloat(const uint16_t* src, float* dst, int64_t n, cudaStream_t stream) {
  if (n == 0) return absl::OkStatus();
  Bf16ToFloatKernel<<<GridFor(n, kElementwiseThreads), kElementwiseThreads, 0, stream>>>(src, dst,
                                                                                         n);
  LAZYRAG_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status LaunchFallbackAttention(const FallbackAttentionParams& p, cudaStream_t stream) {
  if (p.head_dim <= 0 || p.head_dim % 2 != 0 || p.head_dim > kFallbackMaxHeadDim) {
    return absl::InvalidArgumentError(absl::StrCat("fallback attention: head_dim ", p.head_dim,
                                                   " not even or above ", kFallbackMaxHeadDim));
  }
  if (p.view.num_q == 0) return absl::OkStatus();
  if (p.num_heads > 65535) return absl::InvalidArgumentError("fallback attention: too many heads");
  FallbackAttentionKernel<<<dim3(p.view.num_q, p.num_heads), 32, 0, stream>>>(p);
  LAZYRAG_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

absl::Status LaunchFallbackMaterialize(const FallbackMaterializeParams& p, cudaStream_t stream) {
  if (p.num_copies == 0 || p.max_len == 0) return absl::OkStatus();
  if (p.num_copies > 65535 || p.num_layers > 65535) {
    return absl::InvalidArgumentError("fallback materialize: too many copies or layers");
  }
  FallbackMaterializeKernel<<<dim3(p.max_len, p.num_copies, p.num_layers), kScatterThreads, 0,
                              stream>>>(p);
  LAZYRAG_RETURN_IF_LAUNCH_ERROR();
  return absl::OkStatus();
}

}  // namespace lazyrag::cuda_model
