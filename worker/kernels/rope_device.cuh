// Internal to worker/kernels: RoPE inside the kernels (DESIGN section 2): the sine and cosine
// of pos * inv_freq, the rotated query fragments of the mma.sync and wgmma kernels, and the
// in-place rotation of bf16 rows and of K tiles in shared memory (the un-rotated key layout and
// MATERIALIZE).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "worker/kernels/device_ptx.cuh"
#include "worker/kernels/kv_tiles.cuh"

namespace lazyrag::kernels::detail {

// The rotate-half RoPE of one key pair (x0 at feature i, x1 at i + D/2) by (cos, sin) = (c, s):
// one expression for the QKV scatter and the QKV GEMV's fused split, so they agree bit for bit.
__device__ __forceinline__ float2 RotateKeyPair(float x0, float x1, float c, float s) {
  return make_float2(fmaf(x0, c, -(x1 * s)), fmaf(x1, c, x0 * s));
}

// ---------------------------------------------------------------------------------------
// RoPE angle pos * inv_freq as sine and cosine, accurate for |pos| < 2^24: the fp32 product's
// rounding error is kept (fma), the angle is reduced by 2*pi in two exact-ish steps
// (Cody-Waite), and the hardware sine/cosine runs on [-pi, pi] where its absolute error is
// ~4e-7. Total absolute error ~1e-6 rad, against ~2e-3 for sincosf(float(pos) * f) at 32k.
__device__ __forceinline__ void RopeSinCos(int pos, float inv_freq, float* s, float* c) {
  const float x = static_cast<float>(pos);
  const float a = x * inv_freq;
  const float a_err = fmaf(x, inv_freq, -a);
  const float k = rintf(a * 0.159154943091895336f);
  float r = fmaf(-k, 6.28318548202514648f, a);  // float(2 pi) = 2 pi + 1.7484555e-7
  r = fmaf(k, 1.74845553146951720e-7f, r);
  r += a_err;
  __sincosf(r, s, c);
}

// Builds the mma A fragments of a warp's 16 query rows, rotated by RoPE: rows r_lo and
// r_lo + 8 of the raw (un-rotated) bf16 tile at q_smem, rotated by pos_lo / pos_hi.
// The rotate-half partner of column c (c < D/2) is c + D/2, which lands in the same register
// of k-block kb + D/32: each thread rotates its own fragment pairs.
template <int D>
__device__ __forceinline__ void BuildRotatedQ(uint32_t (&qf)[D / 16][4], const char* q_smem,
                                              int r_lo, int pos_lo, int pos_hi,
                                              const float* inv_freq_smem, int lane) {
  const int t = lane & 3;
#pragma unroll
  for (int kb = 0; kb < D / 32; ++kb) {
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int c = kb * 16 + half * 8 + 2 * t;  // first of two columns, c < D/2
      const float f0 = inv_freq_smem[c], f1 = inv_freq_smem[c + 1];
#pragma unroll
      for (int hi_row = 0; hi_row < 2; ++hi_row) {
        const int row = r_lo + hi_row * 8;
        const int pos = hi_row ? pos_hi : pos_lo;
        const uint32_t x0_bits =
            *reinterpret_cast<const uint32_t*>(q_smem + TileOffset<D>(row, c / 8) + (c % 8) * 2);
        const uint32_t x1_bits = *reinterpret_cast<const uint32_t*>(
            q_smem + TileOffset<D>(row, (c + D / 2) / 8) + (c % 8) * 2);
        const float2 x0 = UnpackBf16(x0_bits), x1 = UnpackBf16(x1_bits);
        float s0, c0, s1, c1;
        RopeSinCos(pos, f0, &s0, &c0);
        RopeSinCos(pos, f1, &s1, &c1);
        const int reg = half * 2 + hi_row;
        qf[kb][reg] = PackBf16(x0.x * c0 - x1.x * s0, x0.y * c1 - x1.y * s1);
        qf[kb + D / 32][reg] = PackBf16(x1.x * c0 + x0.x * s0, x1.y * c1 + x0.y * s1);
      }
    }
  }
}

// The sines and cosines of chunk pair cp's eight frequencies at `pos` (RotateChunkPairBy's).
__device__ __forceinline__ void ChunkPairSinCos(int pos, const float* inv_freq_smem, int cp,
                                                float (&sn)[8], float (&cs)[8]) {
#pragma unroll
  for (int f = 0; f < 8; ++f) RopeSinCos(pos, inv_freq_smem[cp * 8 + f], &sn[f], &cs[f]);
}

// RotateChunkPair with the sines and cosines given (ChunkPairSinCos), so that rows at one
// position share them.
__device__ __forceinline__ void RotateChunkPairBy(uint4* lo, uint4* hi, const float (&sn)[8],
                                                  const float (&cs)[8]) {
  uint32_t* lw = reinterpret_cast<uint32_t*>(lo);
  uint32_t* hw = reinterpret_cast<uint32_t*>(hi);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 x0 = UnpackBf16(lw[e]), x1 = UnpackBf16(hw[e]);
    const float s0 = sn[2 * e], c0 = cs[2 * e], s1 = sn[2 * e + 1], c1 = cs[2 * e + 1];
    lw[e] = PackBf16(x0.x * c0 - x1.x * s0, x0.y * c1 - x1.y * s1);
    hw[e] = PackBf16(x1.x * c0 + x0.x * s0, x1.y * c1 + x0.y * s1);
  }
}

// Rotates by RoPE to `pos` the eight rotate-half pairs held in one 16-byte chunk pair of a
// bf16 row: lo holds columns 8cp..8cp+7, hi their partners D/2 further (the same products and
// roundings as BuildRotatedQ).
__device__ __forceinline__ void RotateChunkPair(uint4* lo, uint4* hi, int pos,
                                                const float* inv_freq_smem, int cp) {
  float sn[8], cs[8];
  ChunkPairSinCos(pos, inv_freq_smem, cp, sn, cs);
  RotateChunkPairBy(lo, hi, sn, cs);
}

// Rotates every key row of a K tile in shared memory in place: row r at position
// pos0 + r (MEPIC variant; zero-filled rows stay zero). All threads of the block.
template <int D, int kRows, int kThreads>
__device__ __forceinline__ void RotateKeyTile(char* k_smem, int pos0, const float* inv_freq_smem,
                                              int tid) {
  constexpr int kPairs = D / 16;  // 16-byte chunk pairs (c, c + D/16) per row
#pragma unroll
  for (int it = tid; it < kRows * kPairs; it += kThreads) {
    const int row = it / kPairs, cp = it % kPairs;
    uint4* lo_ptr = reinterpret_cast<uint4*>(k_smem + TileOffset<D>(row, cp));
    uint4* hi_ptr = reinterpret_cast<uint4*>(k_smem + TileOffset<D>(row, cp + kPairs));
    uint4 lo = *lo_ptr, hi = *hi_ptr;
    RotateChunkPair(&lo, &hi, pos0 + row, inv_freq_smem, cp);
    *lo_ptr = lo;
    *hi_ptr = hi;
  }
}

}  // namespace lazyrag::kernels::detail
