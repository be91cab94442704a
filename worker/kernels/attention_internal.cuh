// Internal to worker/kernels: device building blocks shared by the prefill, decode and
// materialize kernels (PTX wrappers, RoPE sine/cosine, the swizzled shared-memory tile
// layout, the segment walk and the paged K/V tile loader), and the host-side CUDA checks
// (cuda_check.h).
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "common/status.h"
#include "worker/attention/segment_view.h"
#include "worker/kernels/cuda_check.h"

namespace lazyrag::kernels::detail {

inline constexpr float kLog2e = 1.4426950408889634f;
inline constexpr float kNegInf = -__builtin_huge_valf();

// Kernel-side parameters of both attention kernels (plain data, passed by value).
struct AttentionKernelParams {
  const __nv_bfloat16* q;
  const __nv_bfloat16* k_cache;
  const __nv_bfloat16* v_cache;
  __nv_bfloat16* out;
  const float* inv_freq;
  SegmentView view;
  int num_heads;
  int num_kv_heads;
  int group;         // num_heads / num_kv_heads
  float scale_log2;  // scale * log2(e)
  int num_splits;
  float* o_partial;    // [num_splits, num_q, num_heads, head_dim] when num_splits > 1
  float* lse_partial;  // [num_splits, num_q, num_heads] (log2 domain)
  // Prefill only: query rows per block (kBlockM / group) and query blocks per request.
  int q_rows_per_block;
  int q_blocks;
  // Warp-specialized prefill only: 1 = the consumer warpgroups ping-pong (the launcher's
  // choice when the KV is split).
  int ws_pingpong;
  // LazyAttentionParams::stable_history: 1 = key rows at positions below a request's first
  // query position may be read before PdlWait.
  int stable_history;
};

// ---------------------------------------------------------------------------------------
// PTX wrappers.

__device__ __forceinline__ uint32_t SmemAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16-byte async copy global -> shared; zero-fills the destination when !valid.
__device__ __forceinline__ void CpAsync16(uint32_t dst, const void* src, bool valid) {
  const int n = valid ? 16 : 0;
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src), "r"(n));
}
// Asks L2 to fetch `bytes` (a multiple of 16) at a 16-byte-aligned global address; no data
// comes back to the SM (sm_90's bulk prefetch; a no-op before sm_90). L2 is the point of
// coherence, so this may run before PdlWait on bytes the previous kernel is still writing.
__device__ __forceinline__ void L2PrefetchBulk(const void* src, uint32_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;\n" ::"l"(src), "r"(bytes) : "memory");
#endif
}
__device__ __forceinline__ void CpAsyncCommit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void CpAsyncWait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void LdMatrixX4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}
__device__ __forceinline__ void LdMatrixX4Trans(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr));
}

// D += A * B, m16n8k16, bf16 inputs, fp32 accumulators.
__device__ __forceinline__ void MmaBf16(float (&d)[4], const uint32_t (&a)[4], uint32_t b0,
                                        uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
      "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

__device__ __forceinline__ float Exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ uint32_t PackBf16(float lo, float hi) {
  __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&v);
}
__device__ __forceinline__ float2 UnpackBf16(uint32_t v) {
  return __bfloat1622float2(*reinterpret_cast<__nv_bfloat162*>(&v));
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

// ---------------------------------------------------------------------------------------
// Shared-memory tiles: rows of D bf16 (D / 8 chunks of 16 bytes); chunk c of row r is stored
// at chunk c ^ (r & 7), so the 8 rows an ldmatrix reads at one column hit 8 different bank
// groups and the 16-byte cp.async stores of a warp do not collide either.
template <int D>
__device__ __forceinline__ uint32_t TileOffset(int row, int chunk) {
  return static_cast<uint32_t>(row * (D * 2) + ((chunk ^ (row & 7)) << 4));
}

// K/V tiles for wgmma (lazy_attention_prefill_wgmma.cu): the tile's kRows x 128 bf16 split
// into two column halves of 64 (128 bytes per row), each half [kRows][128 B] with row stride
// 128 B and chunk c of row r at chunk c ^ (r & 7): the 128-byte-swizzle canonical layout that
// a wgmma descriptor reads both K-major (K as the B operand of Q K^T) and MN-major (V as the B
// operand of P V). REQUIRES: the tile base 1024-byte aligned.
template <int kRows>
__device__ __forceinline__ uint32_t Sw128Offset(int row, int chunk) {
  return static_cast<uint32_t>((chunk >> 3) * (kRows * 128) + row * 128 +
                               (((chunk & 7) ^ (row & 7)) << 4));
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

// Which (request b, KV head, query block, KV split) a prefill block computes (grid: x =
// requests x KV heads x query blocks, y = splits) and its query rows: queries qi0 .. of the
// request (q_begin + qi), packed_rows = q_rows_per_block x group (query, head) rows. Reads the
// step's q_indptr. Shared by the mma.sync, wgmma and warp-specialized prefill kernels.
struct PrefillBlock {  // the kernels bind these fields in this order
  int kvh, b, split, q_begin, nq, qi0, packed_rows;
};
__device__ __forceinline__ PrefillBlock LocatePrefillBlock(const AttentionKernelParams& p) {
  PrefillBlock k;
  int bid = blockIdx.x;
  const int qblock = bid % p.q_blocks;
  bid /= p.q_blocks;
  k.kvh = bid % p.num_kv_heads;
  k.b = bid / p.num_kv_heads;
  k.split = blockIdx.y;
  k.q_begin = p.view.q_indptr[k.b];
  k.nq = p.view.q_indptr[k.b + 1] - k.q_begin;
  k.qi0 = qblock * p.q_rows_per_block;
  k.packed_rows = p.q_rows_per_block * p.group;
  return k;
}

// The positions of a prefill block's kBlockM packed rows (row r: query qi0 + r / group) into
// pos_smem[r] (-1 = padding row: attends nothing; threads tid < kBlockM) and each warp's
// largest into max_smem[warp]. Every lane of the calling warps takes part.
template <int kBlockM>
__device__ __forceinline__ void StoreRowPositions(const SegmentView& v, const PrefillBlock& blk,
                                                  int group, int tid, int* pos_smem,
                                                  int* max_smem) {
  int pos = -1;
  if (tid < kBlockM) {
    const int qi = blk.qi0 + tid / group;
    if (tid < blk.packed_rows && qi < blk.nq) pos = v.q_pos[blk.q_begin + qi];
    pos_smem[tid] = pos;
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) pos = max(pos, __shfl_xor_sync(0xffffffffu, pos, off));
  if (tid % 32 == 0) max_smem[tid / 32] = pos;
}

// cp.async of a prefill block's raw query tile, kBlockM packed rows in the TileOffset layout
// (row r: query qi0 + r / group, head kvh * group + r % group; padding rows zero-filled), by
// threads t = 0 .. threads - 1 of the caller's choosing. The caller commits the group.
template <int D, int kBlockM>
__device__ __forceinline__ void CopyQueryTile(const AttentionKernelParams& p,
                                              const PrefillBlock& blk, char* q_smem, int t,
                                              int threads) {
  const int group = p.group;
  for (int it = t; it < kBlockM * (D / 8); it += threads) {
    const int row = it / (D / 8), chunk = it % (D / 8);
    const int qi = blk.qi0 + row / group;
    const bool ok = row < blk.packed_rows && qi < blk.nq;
    const __nv_bfloat16* src =
        ok ? p.q + (int64_t(blk.q_begin + qi) * p.num_heads + blk.kvh * group + row % group) * D +
                 chunk * 8
           : p.q;
    CpAsync16(SmemAddr(q_smem) + TileOffset<D>(row, chunk), src, ok);
  }
}

// Rotates by RoPE to `pos` the eight rotate-half pairs held in one 16-byte chunk pair of a
// bf16 row: lo holds columns 8cp..8cp+7, hi their partners D/2 further (the same products and
// roundings as BuildRotatedQ).
__device__ __forceinline__ void RotateChunkPair(uint4* lo, uint4* hi, int pos,
                                                const float* inv_freq_smem, int cp) {
  uint32_t* lw = reinterpret_cast<uint32_t*>(lo);
  uint32_t* hw = reinterpret_cast<uint32_t*>(hi);
#pragma unroll
  for (int e = 0; e < 4; ++e) {
    const float2 x0 = UnpackBf16(lw[e]), x1 = UnpackBf16(hw[e]);
    float s0, c0, s1, c1;
    RopeSinCos(pos, inv_freq_smem[cp * 8 + 2 * e], &s0, &c0);
    RopeSinCos(pos, inv_freq_smem[cp * 8 + 2 * e + 1], &s1, &c1);
    lw[e] = PackBf16(x0.x * c0 - x1.x * s0, x0.y * c1 - x1.y * s1);
    hw[e] = PackBf16(x1.x * c0 + x0.x * s0, x1.y * c1 + x0.y * s1);
  }
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

// ---------------------------------------------------------------------------------------
// Programmatic dependent launch (PDL). Every attention kernel is launched as a programmatic
// dependent of the previous kernel on the stream: its blocks may become resident while that
// kernel drains, and PdlWait() holds them until it has finished and its writes are visible.
// Before PdlWait a kernel may read only what was written before the previous kernel started
// (the step's segment view, uploaded by a copy earlier on the stream; inv_freq): the decode
// and wgmma prefill kernels plan their split and fetch their first page ids there; the query,
// the K/V bytes and every write come after it (except, with stable_history, the decode kernel's
// first K/V tiles below the query position). PdlLaunchDependents() lets the next kernel
// (the split merge) be scheduled early; it still waits for this grid to complete.
__device__ __forceinline__ void PdlWait() { asm volatile("griddepcontrol.wait;\n" ::: "memory"); }
__device__ __forceinline__ void PdlLaunchDependents() {
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
}

__device__ __forceinline__ int WarpSum(int x) {
#pragma unroll
  for (int off = 16; off > 0; off /= 2) x += __shfl_xor_sync(0xffffffffu, x, off);
  return x;
}
__device__ __forceinline__ int WarpInclusiveScan(int x, int lane) {
#pragma unroll
  for (int off = 1; off < 32; off *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, x, off);
    if (lane >= off) x += y;
  }
  return x;
}

// ---------------------------------------------------------------------------------------
// Split planning and the key-tile walk.
//
// A block walks the key tiles of one request. Segment s (in request order) contributes
// ceil(vis_s / kBlockN) tiles, vis_s = clamp(min(len_s, max_pos - start_s + 1), 0, len_s) being
// its keys visible to the block's largest query position (causality). Tiles never cross
// segments (the query rotation is per segment). The request's tiles are numbered in order;
// KV split k of S owns tiles [k T / S, (k + 1) T / S): splits are balanced in tiles, so one
// that straddles a segment boundary does not pay a whole extra tile for two partial ones.
//
// Warp 0 plans (PlanSplit) into shared memory, reading the request's segment metadata 32
// segments per load round (the old serial walk cost one dependent global load per segment
// before the first K/V byte was requested); the first kSegCache segments stay cached there
// for the walk, later ones are read from global memory as the walk reaches them.
inline constexpr int kSegCache = 32;

struct SegEntry {
  int start, vis, page_base;
};

struct SplitPlan {          // shared memory
  SegEntry seg[kSegCache];  // segments s_first .. s_first + kSegCache - 1 of the request
  int s_first, s_end;       // the request's segments
  int max_pos;              // the block's largest query position
  int s, t_seg;             // first segment of the split, request tile index of its first tile
  int t_begin, t_end;       // the split's tiles
};

__device__ __forceinline__ int VisibleKeys(int start, int len, int max_pos) {
  return max(0, min(len, max_pos - start + 1));
}

// Warp 0 only (all 32 lanes); the caller syncs the block before reading `plan`.
template <int kBlockN>
__device__ __forceinline__ void PlanSplit(const SegmentView& v, int s_first, int s_end, int max_pos,
                                          int split, int num_splits, SplitPlan* plan, int lane) {
  int total = 0;
  for (int c = s_first; c < s_end; c += 32) {
    const int s = c + lane;
    int tiles = 0;
    if (s < s_end) {
      const int start = v.seg_start[s], len = v.seg_len[s], pb = v.page_indptr[s];
      const int vis = VisibleKeys(start, len, max_pos);
      tiles = (vis + kBlockN - 1) / kBlockN;
      if (s - s_first < kSegCache) plan->seg[s - s_first] = {start, vis, pb};
    }
    total += WarpSum(tiles);
  }
  const int t_begin = static_cast<int>(int64_t(split) * total / num_splits);
  const int t_end = static_cast<int>(int64_t(split + 1) * total / num_splits);
  // The split's first segment: the first whose tiles end past t_begin. Each lane re-reads
  // the cache entries it wrote itself (no barrier needed); segments past the cache come again
  // from global memory (requests with more than kSegCache segments only).
  int s_found = s_end, t_found = total, t_base = 0;
  for (int c = s_first; c < s_end && t_begin < total; c += 32) {
    const int s = c + lane;
    int tiles = 0;
    if (s < s_end) {
      const int vis = s - s_first < kSegCache ? plan->seg[s - s_first].vis
                                              : VisibleKeys(v.seg_start[s], v.seg_len[s], max_pos);
      tiles = (vis + kBlockN - 1) / kBlockN;
    }
    const int incl = WarpInclusiveScan(tiles, lane);
    const unsigned hit = __ballot_sync(0xffffffffu, s < s_end && t_base + incl > t_begin);
    if (hit != 0) {
      const int l = __ffs(hit) - 1;
      s_found = c + l;
      t_found = t_base + __shfl_sync(0xffffffffu, incl - tiles, l);
      break;
    }
    t_base += __shfl_sync(0xffffffffu, incl, 31);
  }
  if (lane == 0) {
    plan->s_first = s_first;
    plan->s_end = s_end;
    plan->max_pos = max_pos;
    plan->s = s_found;
    plan->t_seg = t_found;
    plan->t_begin = t_begin;
    plan->t_end = t_end;
  }
}

// Score fragments in the mma.sync m16n8 C layout (also wgmma's, per 8 columns): s[nb] holds
// rows g = lane / 4 ("lo") and g + 8 ("hi") of a warp's 16 at keys nb * 8 + 2 t + e (t = lane %
// 4). Sets the keys at or past lim_lo / lim_hi to -inf, scales the others by `scale` when
// kScale, and folds each row's values into mx_lo / mx_hi (this thread's share of the row).
template <int NB, bool kScale>
__device__ __forceinline__ void MaskRowMax(float (&s)[NB][4], int lim_lo, int lim_hi, float scale,
                                           int t, float& mx_lo, float& mx_hi) {
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = nb * 8 + 2 * t + e;
      s[nb][e] = key < lim_lo ? (kScale ? s[nb][e] * scale : s[nb][e]) : kNegInf;
      s[nb][2 + e] = key < lim_hi ? (kScale ? s[nb][2 + e] * scale : s[nb][2 + e]) : kNegInf;
      mx_lo = fmaxf(mx_lo, s[nb][e]);
      mx_hi = fmaxf(mx_hi, s[nb][2 + e]);
    }
  }
}
// The row maxima over the 4 threads (a quad) that hold one row.
__device__ __forceinline__ void QuadMax(float& mx_lo, float& mx_hi) {
#pragma unroll
  for (int off = 1; off <= 2; off *= 2) {
    mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, off));
    mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, off));
  }
}

// One tile of the online softmax on mma.sync score fragments (layout as MaskRowMax), for the
// mma.sync decode and prefill kernels: keys at or past lim_lo / lim_hi are masked, the rest
// scaled into the log2 domain; the running maxima m and sums l are updated, s becomes the
// unnormalised probabilities and the O fragments are rescaled.
template <int NB, int DB>
__device__ __forceinline__ void OnlineSoftmaxTile(float (&s)[NB][4], float (&o)[DB][4], int lim_lo,
                                                  int lim_hi, float scale_log2, int t, float& m_lo,
                                                  float& m_hi, float& l_lo, float& l_hi) {
  float mx_lo = kNegInf, mx_hi = kNegInf;
  MaskRowMax<NB, true>(s, lim_lo, lim_hi, scale_log2, t, mx_lo, mx_hi);
  QuadMax(mx_lo, mx_hi);
  const float new_lo = fmaxf(m_lo, mx_lo), new_hi = fmaxf(m_hi, mx_hi);
  const float use_lo = new_lo == kNegInf ? 0.f : new_lo;
  const float use_hi = new_hi == kNegInf ? 0.f : new_hi;
  const float alpha_lo = Exp2(m_lo - use_lo), alpha_hi = Exp2(m_hi - use_hi);
  m_lo = new_lo;
  m_hi = new_hi;
  float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
    s[nb][0] = Exp2(s[nb][0] - use_lo);
    s[nb][1] = Exp2(s[nb][1] - use_lo);
    s[nb][2] = Exp2(s[nb][2] - use_hi);
    s[nb][3] = Exp2(s[nb][3] - use_hi);
    sum_lo += s[nb][0] + s[nb][1];
    sum_hi += s[nb][2] + s[nb][3];
  }
  l_lo = l_lo * alpha_lo + sum_lo;
  l_hi = l_hi * alpha_hi + sum_hi;
#pragma unroll
  for (int db = 0; db < DB; ++db) {
    o[db][0] *= alpha_lo;
    o[db][1] *= alpha_lo;
    o[db][2] *= alpha_hi;
    o[db][3] *= alpha_hi;
  }
}

// Running softmax state of a thread's two rows (log2 domain; m already scaled).
struct RowStats {
  float m_lo = kNegInf, m_hi = kNegInf, l_lo = 0.f, l_hi = 0.f;
};

// Finalize a prefill block (the mma.sync and wgmma kernels; O in the m16n8 C layout, rows
// r_lo and r_lo + 8): row sums across the quad, then the thread's two rows of the output (bf16, one
// split) or of this split's partial result (fp32 O / l and the log2-sum-exp). Packed row r of
// the block is query row qi0 + r / group, head kvh * group + r % group.
template <int D>
__device__ __forceinline__ void StoreRows(const AttentionKernelParams& p,
                                          const float (&o)[D / 8][4], RowStats rs, int r_lo,
                                          int qi0, int q_begin, int nq, int packed_rows, int kvh,
                                          int split, int t) {
  const int group = p.group, H = p.num_heads;
#pragma unroll
  for (int off = 1; off <= 2; off *= 2) {
    rs.l_lo += __shfl_xor_sync(0xffffffffu, rs.l_lo, off);
    rs.l_hi += __shfl_xor_sync(0xffffffffu, rs.l_hi, off);
  }
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int r = r_lo + hi * 8;
    const int qi = qi0 + r / group;
    if (r >= packed_rows || qi >= nq) continue;
    const int64_t row_head = int64_t(q_begin + qi) * H + kvh * group + r % group;
    const float l = hi ? rs.l_hi : rs.l_lo;
    const float m = hi ? rs.m_hi : rs.m_lo;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (p.num_splits == 1) {
      __nv_bfloat16* dst = p.out + row_head * D + 2 * t;
#pragma unroll
      for (int db = 0; db < D / 8; ++db) {
        *reinterpret_cast<uint32_t*>(dst + db * 8) =
            PackBf16(o[db][2 * hi] * inv, o[db][2 * hi + 1] * inv);
      }
    } else {
      const int64_t rows = int64_t(p.view.num_q) * H;
      float* dst = p.o_partial + (split * rows + row_head) * D + 2 * t;
#pragma unroll
      for (int db = 0; db < D / 8; ++db) {
        *reinterpret_cast<float2*>(dst + db * 8) =
            make_float2(o[db][2 * hi] * inv, o[db][2 * hi + 1] * inv);
      }
      if (t == 0) p.lse_partial[split * rows + row_head] = l > 0.f ? m + __log2f(l) : kNegInf;
    }
  }
}

// The walk over a split's tiles. Every thread of a block walks the same cursor (uniform
// control flow); the producer (loads) runs kStages - 1 tiles ahead of the consumer (math).
template <int kBlockN>
struct TileCursor {
  int s;          // current segment (global index)
  int t_seg;      // request tile index of segment s's first tile
  int start;      // seg_start[s]: rope delta / logical position of key 0
  int page_base;  // page_indptr[s]
  int tiles;      // tiles of segment s
  int j;          // first local key of the current tile
  int j_end;      // one past the last loadable local key of the current run of tiles
  bool valid;

  // `plan` is the block's shared-memory plan, passed on every call rather than kept in the
  // cursor (the prefill kernel runs at the register cap).
  __device__ __forceinline__ void Init(const SplitPlan* plan, const SegmentView& v) {
    s = plan->s;
    t_seg = plan->t_seg;
    Seek(plan, v);
  }
  // Moves to the first segment at or after s with tiles inside the split.
  __device__ __forceinline__ void Seek(const SplitPlan* plan, const SegmentView& v) {
    valid = false;
    const int s_end = plan->s_end, t_begin = plan->t_begin, t_end = plan->t_end;
    for (; s < s_end && t_seg < t_end; ++s) {
      const int i = s - plan->s_first;
      int vis;
      if (i < kSegCache) {
        const SegEntry e = plan->seg[i];
        start = e.start;
        vis = e.vis;
        page_base = e.page_base;
      } else {
        start = v.seg_start[s];
        vis = VisibleKeys(start, v.seg_len[s], plan->max_pos);
        page_base = v.page_indptr[s];
      }
      tiles = (vis + kBlockN - 1) / kBlockN;
      const int lo = max(0, t_begin - t_seg), hi = min(tiles, t_end - t_seg);
      if (lo < hi) {
        j = lo * kBlockN;
        j_end = min(vis, hi * kBlockN);
        valid = true;
        return;
      }
      t_seg += tiles;
    }
  }
  __device__ __forceinline__ void Next(const SplitPlan* plan, const SegmentView& v) {
    j += kBlockN;
    if (j >= j_end) {
      t_seg += tiles;
      ++s;
      Seek(plan, v);
    }
  }
};

// Gathers one K tile and one V tile (kBlockN key rows of one KV head) from the page pool
// into shared memory with 16-byte cp.async. Thread `tid` moves chunk tid % (D/8) of rows
// tid / (D/8) + i * kRowsPerPass. The page ids of a tile are fetched (Prefetch) ahead of its
// copy (Issue), so their latency hides behind math (the decode kernel: two tiles ahead).
// kSw128: store in the wgmma layout (Sw128Offset, D = 128 only) instead of TileOffset.
template <int D, int kBlockN, int kThreads, bool kSw128 = false>
struct KvTileLoader {
  static constexpr int kChunks = D / 8;
  static constexpr int kRowsPerPass = kThreads / kChunks;
  static constexpr int kPasses = kBlockN / kRowsPerPass;
  static_assert(kThreads % kChunks == 0 && kBlockN % kRowsPerPass == 0, "tile shape");
  static_assert(!kSw128 || D == 128, "the 128-byte-swizzle layout is for head dim 128");

  // Pool token index (page * page_size + slot) of each row this thread moves, -1 = not
  // loadable (zero-fill). One register per row: the prefill kernel runs at the register cap.
  int tok[kPasses];
  bool any;  // the prefetched tile exists

  // `c` may walk wider tiles than this loader moves (the decode kernel's warp pipelines: each
  // warp moves 16 rows of a 64-key tile, c.j shifted to its first row).
  template <int kCursorN>
  __device__ __forceinline__ void Prefetch(const TileCursor<kCursorN>& c, const SegmentView& v,
                                           int tid) {
    any = c.valid;
    const int row0 = tid / kChunks;
    int jj = c.j + row0;
    // Page sizes are powers of two in practice (16, 64): a shift instead of an integer
    // division in every tile.
    const int ps = v.page_size;
    int pg = (ps & (ps - 1)) == 0 ? jj >> (__ffs(ps) - 1) : jj / ps;
    int sl = jj - pg * ps;
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const bool ok = c.valid && jj < c.j_end;
      tok[p] = ok ? v.page_indices[c.page_base + pg] * v.page_size + sl : -1;
      jj += kRowsPerPass;
      sl += kRowsPerPass;
      while (sl >= v.page_size) {
        sl -= v.page_size;
        ++pg;
      }
    }
  }

  __device__ __forceinline__ void Issue(char* k_smem, char* v_smem, const __nv_bfloat16* k_cache,
                                        const __nv_bfloat16* v_cache, int64_t token_stride,
                                        int head_offset, int tid) const {
    if (!any) return;
    const int row0 = tid / kChunks, chunk = tid % kChunks;
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int row = row0 + p * kRowsPerPass;
      const bool ok = tok[p] >= 0;
      const int64_t off = ok ? int64_t(tok[p]) * token_stride + head_offset + chunk * 8 : 0;
      const uint32_t dst = kSw128 ? Sw128Offset<kBlockN>(row, chunk) : TileOffset<D>(row, chunk);
      CpAsync16(SmemAddr(k_smem) + dst, k_cache + off, ok);
      CpAsync16(SmemAddr(v_smem) + dst, v_cache + off, ok);
    }
  }
};

}  // namespace lazyrag::kernels::detail

// ---------------------------------------------------------------------------------------
// Host side, shared by the launchers (lazy_attention.cu).
namespace lazyrag::kernels {
struct LazyAttentionParams;
}

namespace lazyrag::kernels::detail {

// Multiprocessors of the current device (cached per device).
absl::Status DeviceSmCount(int* sms);

// Raises `kernel`'s dynamic shared-memory limit to `bytes` once per device (`done` holds one
// bit per device id; thread-safe, a repeated call is harmless).
absl::Status SetSmemLimitOnce(const void* kernel, int bytes, std::atomic<uint64_t>* done);

// Fills the kernel parameters, choosing the number of KV splits: enough blocks for
// `blocks_per_sm` resident blocks on every multiprocessor given `base_blocks` blocks without
// splitting, at least `min_split_keys` keys per split, and what the workspace holds.
absl::Status MakeKernelParams(const LazyAttentionParams& params, int base_blocks, int blocks_per_sm,
                              int min_split_keys, AttentionKernelParams* kp);

// Launches `kernel(args...)` as a programmatic dependent of the previous kernel on the stream
// (the kernel calls PdlWait() before touching what earlier kernels write): every attention
// kernel, the merge kernel, the warp-specialized kernel with its tensor maps, and the CUDA
// model's RMSNorm, QKV-scatter and SwiGLU kernels (worker/kernels/model_kernels.cu). With
// `smem_configured` (the kernel's own once-per-device flags, see SetSmemLimitOnce), the
// kernel's dynamic shared-memory limit is raised to smem_bytes first.
template <typename... Params, typename... Args>
absl::Status LaunchPdlKernel(void (*kernel)(Params...), dim3 grid, int threads, int smem_bytes,
                             std::atomic<uint64_t>* smem_configured, cudaStream_t stream,
                             const Args&... args) {
  if (smem_configured != nullptr) {
    RETURN_IF_ERROR(
        SetSmemLimitOnce(reinterpret_cast<const void*>(kernel), smem_bytes, smem_configured));
  }
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = dim3(threads);
  config.dynamicSmemBytes = static_cast<size_t>(smem_bytes);
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaLaunchKernelEx(&config, kernel, args...));
  return absl::OkStatus();
}

// The wgmma prefill kernel (lazy_attention_prefill_wgmma.cu): head dim 128, LAZY layout,
// 128 packed rows per block exactly as the mma.sync kernel (same grid, same kp fields).
// WgmmaPrefillSupported: the current device is compute capability 9.0 and the kernel was
// built for it (sm_90a); otherwise the launcher must use the mma.sync kernel.
bool WgmmaPrefillSupported();
// key_tile: keys per K/V tile, 64 or 128.
absl::Status LaunchPrefillWgmma128(const AttentionKernelParams& kp, int blocks, int key_tile,
                                   cudaStream_t stream);

// The attributes of the merge kernel a batch-1 decode (head dim 128, one merge block per SM at
// most) launches, and its threads per block.
absl::Status SmallMergeKernelAttributes(cudaFuncAttributes* attr, int* threads);

// Combines the partial results of kp.num_splits splits into kp.out (only when > 1 split).
absl::Status LaunchMergeSplits(const AttentionKernelParams& kp, int num_q, int head_dim,
                               cudaStream_t stream);

}  // namespace lazyrag::kernels::detail
