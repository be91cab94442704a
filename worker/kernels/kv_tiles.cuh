// Internal to worker/kernels: how the attention kernels lay out and walk their K/V tiles: the
// swizzled shared-memory tile layouts (mma.sync and wgmma), the split planner and the key-tile
// walk over a request's segments, and the paged K/V tile loader (cp.async).
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "worker/attention/segment_view.h"
#include "worker/kernels/device_ptx.cuh"

namespace lazyrag::kernels::detail {

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
// segments per load round (not one dependent global load per segment before the first K/V
// byte is requested); the first kSegCache segments stay cached there for the walk, later ones
// are read from global memory as the walk reaches them.
inline constexpr int kSegCache = 32;

struct SegEntry {
  int start, vis, page_base;
  int skip;           // SegmentView::seg_skip (0 when absent)
  float scale, bias;  // SegmentView::seg_scale / seg_bias (1 and 0 when absent)
};

// How the scores of one segment's keys are formed (SegmentView: seg_skip, seg_scale, seg_bias)
// in the kernels' log2 domain: score = (q . k) * scale + bias for keys j >= skip; keys below
// skip are masked like keys past the segment's end.
struct SegScores {
  int skip;
  float scale;  // shape.scale * log2(e) * seg_scale[s]
  float bias;   // seg_bias[s] * log2(e)
};

__device__ __forceinline__ int SegSkip(const SegmentView& v, int s) {
  return v.seg_skip != nullptr ? v.seg_skip[s] : 0;
}
__device__ __forceinline__ float SegScale(const SegmentView& v, int s) {
  return v.seg_scale != nullptr ? v.seg_scale[s] : 1.f;
}
__device__ __forceinline__ float SegBias(const SegmentView& v, int s) {
  return v.seg_bias != nullptr ? v.seg_bias[s] : 0.f;
}

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
      if (s - s_first < kSegCache) {
        plan->seg[s - s_first] = {start, vis, pb, SegSkip(v, s), SegScale(v, s), SegBias(v, s)};
      }
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

// Segment s's score transform (s in the plan's request), from the plan's cache where it holds s.
// scale_log2 = shape.scale * log2(e).
__device__ __forceinline__ SegScores SegScoresOf(const SplitPlan* plan, const SegmentView& v, int s,
                                                 float scale_log2) {
  const int i = s - plan->s_first;
  if (i < kSegCache) {
    const SegEntry& e = plan->seg[i];
    return {e.skip, scale_log2 * e.scale, e.bias * kLog2e};
  }
  return {SegSkip(v, s), scale_log2 * SegScale(v, s), SegBias(v, s) * kLog2e};
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
