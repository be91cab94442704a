// Per-tile steps of the wgmma prefill kernels (lazy_attention_prefill_wgmma.cu: all warps load
// and compute; lazy_attention_prefill_ws.cu: a TMA producer warp and two consumer warpgroups):
// the rotated query written for the S product, the masked online softmax on S, O += P V, and
// the epilogue. Each consumer thread owns packed rows r_lo and r_lo + 8 of its warp's 16
// (the m16n8 C-fragment layout of the wgmma accumulators) and columns 8j + 2t, 8j + 2t + 1 of
// every 8-column block j (t = lane % 4).
#pragma once

#include "worker/kernels/attention_internal.cuh"
#include "worker/kernels/wgmma.cuh"

namespace lazyrag::kernels::detail {

// Rotates packed query rows row0 .. row0 + 63 of the raw tile at q_smem (TileOffset layout)
// by RoPE to position pos_smem[row] - seg_start and stores them as bf16 at rot_smem in the
// Sw128 layout of a kRows-row operand (the wgmma A operand of Q K^T). The 128 threads of one
// warpgroup (wt = thread index within it): thread wt takes 16-byte chunk pair (c, c + 8), c =
// wt % 8, of the four consecutive rows 4 (wt / 8) .. + 3, and rows at the position of the row
// before them (the GQA heads of one query row are consecutive packed rows) reuse its sines and
// cosines. The same products and roundings as BuildRotatedQ.
template <int kRows>
__device__ __forceinline__ void RotateQRowsSw128(char* rot_smem, const char* q_smem, int row0,
                                                 int seg_start, const int* pos_smem,
                                                 const float* inv_freq_smem, int wt) {
  constexpr int D = 128, kPairs = D / 16;
  const int cp = wt % kPairs, first = row0 + 4 * (wt / kPairs);
  float sn[8], cs[8];
  int have = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int row = first + i;
    const int pos = pos_smem[row] - seg_start;
    if (i == 0 || pos != have) ChunkPairSinCos(pos, inv_freq_smem, cp, sn, cs);
    have = pos;
    uint4 lo = *reinterpret_cast<const uint4*>(q_smem + TileOffset<D>(row, cp));
    uint4 hi = *reinterpret_cast<const uint4*>(q_smem + TileOffset<D>(row, cp + kPairs));
    RotateChunkPairBy(&lo, &hi, sn, cs);
    *reinterpret_cast<uint4*>(rot_smem + Sw128Offset<kRows>(row, cp)) = lo;
    *reinterpret_cast<uint4*>(rot_smem + Sw128Offset<kRows>(row, cp + kPairs)) = hi;
  }
}

#ifdef LAZYRAG_HAVE_WGMMA
// S[64 x kN] = Q K^T over the first kN keys (32, 64 or 128) of a 128-key tile, both operands
// K-major Sw128 in shared memory: the warpgroup's 64 rotated query rows at q_rows (row 0 of the
// warpgroup inside a kQRows-row operand) and the K tile at kt (two halves of 128 rows x 128
// bytes). k-step kk reads columns 16kk..16kk+15: 32 bytes at (kk % 4) * 32 of column half
// kk / 4. A narrower kN computes the same scores for its keys (each is its own dot product).
// Calls issued() once the products are issued, then waits for the result.
struct NoHook {
  __device__ __forceinline__ void operator()() const {}
};
template <int kQRows, int kN = 128, typename Hook = NoHook>
__device__ __forceinline__ void QkTile(float (&s)[kN / 8][4], uint32_t q_rows, uint32_t kt,
                                       Hook issued = {}) {
  static_assert(kN == 32 || kN == 64 || kN == 128, "a wgmma N of 32, 64 or 128 keys");
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < 8; ++kk) {
    const uint64_t a = Sw128Desc(q_rows + (kk / 4) * (kQRows * 128) + (kk % 4) * 32, 16);
    const uint64_t b = Sw128Desc(kt + (kk / 4) * (128 * 128) + (kk % 4) * 32, 16);
    if constexpr (kN == 128) {
      WgmmaM64N128K16SS(s, a, b, kk > 0 ? 1 : 0);
    } else if constexpr (kN == 64) {
      WgmmaM64N64K16SS(s, a, b, kk > 0 ? 1 : 0);
    } else {
      WgmmaM64N32K16SS(s, a, b, kk > 0 ? 1 : 0);
    }
  }
  WgmmaCommit();
  issued();
  WgmmaWait<0>();
  FenceAccumulators(s);
}
#endif  // LAZYRAG_HAVE_WGMMA

// Mask (skipped keys below lo; segment tail, split end, causality: keys >= lim_lo / lim_hi of
// the tile are invisible to the thread's rows) and online softmax in the log2 domain: s becomes
// P (unnormalized), the row stats advance and O is rescaled. The loop is bound by instruction
// latency, so the common cases are kept short: tiles whose keys are all visible to the warp's
// rows skip the mask, the segment's transform (SegScores) is folded into the exponent (max of
// the raw scores times sc.scale > 0, which ValidateLazyAttentionParams and the backends require,
// plus sc.bias, then exp2(fma(s, scale, bias - max))), and O is rescaled only when some row's
// running maximum moved.
template <int kBlockN>
__device__ __forceinline__ void SoftmaxTile(float (&s)[kBlockN / 8][4], float (&o)[16][4], int lo,
                                            int lim_lo, int lim_hi, const SegScores& sc, int t,
                                            RowStats* rs) {
  float mx_lo = kNegInf, mx_hi = kNegInf;
  if (__all_sync(0xffffffffu, lo <= 0 && lim_lo >= kBlockN && lim_hi >= kBlockN)) {
#pragma unroll
    for (int nb = 0; nb < kBlockN / 8; ++nb) {
      mx_lo = fmaxf(mx_lo, fmaxf(s[nb][0], s[nb][1]));
      mx_hi = fmaxf(mx_hi, fmaxf(s[nb][2], s[nb][3]));
    }
  } else {
    MaskRowMax<kBlockN / 8, false>(s, lo, lim_lo, lim_hi, sc.scale, sc.bias, t, mx_lo, mx_hi);
  }
  QuadMax(mx_lo, mx_hi);
  const float new_lo = fmaxf(rs->m_lo, fmaf(mx_lo, sc.scale, sc.bias));
  const float new_hi = fmaxf(rs->m_hi, fmaf(mx_hi, sc.scale, sc.bias));
  const float use_lo = new_lo == kNegInf ? 0.f : new_lo;
  const float use_hi = new_hi == kNegInf ? 0.f : new_hi;
  const float alpha_lo = Exp2(rs->m_lo - use_lo), alpha_hi = Exp2(rs->m_hi - use_hi);
  rs->m_lo = new_lo;
  rs->m_hi = new_hi;
  const float off_lo = sc.bias - use_lo, off_hi = sc.bias - use_hi;
  float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
  for (int nb = 0; nb < kBlockN / 8; ++nb) {
    s[nb][0] = Exp2(fmaf(s[nb][0], sc.scale, off_lo));
    s[nb][1] = Exp2(fmaf(s[nb][1], sc.scale, off_lo));
    s[nb][2] = Exp2(fmaf(s[nb][2], sc.scale, off_hi));
    s[nb][3] = Exp2(fmaf(s[nb][3], sc.scale, off_hi));
    sum_lo += s[nb][0] + s[nb][1];
    sum_hi += s[nb][2] + s[nb][3];
  }
  rs->l_lo = rs->l_lo * alpha_lo + sum_lo;
  rs->l_hi = rs->l_hi * alpha_hi + sum_hi;
  if (!__all_sync(0xffffffffu, alpha_lo == 1.f && alpha_hi == 1.f)) {
#pragma unroll
    for (int db = 0; db < 16; ++db) {
      o[db][0] *= alpha_lo;
      o[db][1] *= alpha_lo;
      o[db][2] *= alpha_hi;
      o[db][3] *= alpha_hi;
    }
  }
}

#ifdef LAZYRAG_HAVE_WGMMA
// O += P V over the first kBlockN keys of a kTileN-key tile: P (the softmax'd S accumulators,
// rounded to bf16) is the register A fragment of k-step kk (keys 16kk..16kk+15); V [kTileN keys
// x 128] at vt is read MN-major: its k-step is two 8-key row groups (2 KiB) further on, its 128
// columns two 64-column halves kTileN x 128 bytes apart (the leading-dimension offset). Calls
// issued() once the products are issued, then waits for them.
template <int kBlockN, int kTileN = kBlockN, typename Hook = NoHook>
__device__ __forceinline__ void PvTile(float (&o)[16][4], const float (&s)[kBlockN / 8][4],
                                       uint32_t vt, Hook issued = {}) {
  static_assert(kBlockN % 16 == 0 && kBlockN <= kTileN, "whole k-steps of the tile's keys");
  uint32_t pa[kBlockN / 16][4];
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    pa[kk][0] = PackBf16(s[2 * kk][0], s[2 * kk][1]);
    pa[kk][1] = PackBf16(s[2 * kk][2], s[2 * kk][3]);
    pa[kk][2] = PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
    pa[kk][3] = PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
  }
  FenceAccumulators(o);
  WgmmaFence();
#pragma unroll
  for (int kk = 0; kk < kBlockN / 16; ++kk) {
    WgmmaM64N128K16Trans(o, pa[kk], Sw128Desc(vt + kk * 16 * 128, kTileN * 128), 1);
  }
  WgmmaCommit();
  issued();
  WgmmaWait<0>();
  FenceAccumulators(o);
}
#endif  // LAZYRAG_HAVE_WGMMA

}  // namespace lazyrag::kernels::detail
