// TMA copies for the decode kernel's warp pipelines (the default where page_size is a power of
// two >= 16 and num_pages is known; lazy_attention_decode.cu).
//
// A warp's slice of a 64-key tile is its 16 keys: 16 consecutive rows of one page (page sizes
// that are multiples of 16, so a slice never crosses a page). Instead of 32 lanes x 16
// cp.async of 16 bytes, lane 0 issues four box copies {64 features, 1 head, 16 tokens} (K and
// V, two column halves each) that complete on the warp's mbarrier for the stage. The boxes
// land 128-byte swizzled: half h of row r, 16-byte chunk c at h * 2048 + r * 128 +
// ((c ^ (r & 7)) << 4) inside the slice (SliceOffset), which needs a 1024-byte aligned slice.
// Rows of the slice past the run's loadable keys still hold bytes of the same page (other
// tokens, or never written: NaN in the tests' pools); the kernel masks their scores and zeroes
// their V rows before P V.
#pragma once

#include <cstdint>

#include "worker/attention/segment_view.h"
#include "worker/kernels/attention_internal.cuh"
#include "worker/kernels/tma_tile_loader.cuh"
#include "worker/kernels/wgmma.cuh"

namespace lazyrag::kernels::detail {

inline constexpr int kSliceRows = 16;
inline constexpr int kSliceHalfBytes = kSliceRows * 128;

// Byte offset of (row, 16-byte chunk 0..15) in a slice as the swizzled boxes lay it out.
__device__ __forceinline__ uint32_t SliceOffset(int row, int chunk) {
  return static_cast<uint32_t>((chunk >> 3) * kSliceHalfBytes + row * 128 +
                               (((chunk & 7) ^ (row & 7)) << 4));
}

// Same Prefetch / Issue split as KvTileLoader (page ids ahead of the copies). Every lane of
// the warp prefetches (the same address: one request) so that all agree on `issued`.
struct DecodeTmaSlice {
  int token;    // pool token index of the slice's first row
  bool issued;  // the slice has loadable rows: its copies complete on the stage's mbarrier

  // `c` is the cursor with c.j already at the warp's first key.
  template <int kCursorN>
  __device__ __forceinline__ void Prefetch(const TileCursor<kCursorN>& c, const SegmentView& v,
                                           int /*lane*/) {
    issued = c.valid && c.j < c.j_end;
    const int ps = v.page_size;
    const int pg = c.j >> (__ffs(ps) - 1);  // REQUIRES: page_size a power of two, >= 16
    token = issued ? v.page_indices[c.page_base + pg] * ps + (c.j - pg * ps) : 0;
  }

  // Lane 0: declares the slice's bytes on `bar` and copies K and V into the slices at k_dst and
  // v_dst (shared-memory addresses). The caller synced the warp after its last reads of the
  // stage, and fenced (fence.proxy.async, every writing lane) any generic writes to it.
  // `policy`: an L2 cache policy for the copies (0: none).
  __device__ __forceinline__ void Issue(uint32_t k_dst, uint32_t v_dst, uint32_t bar,
                                        const TmaMaps& maps, int kv_head, int lane,
                                        uint64_t policy = 0) const {
    if (!issued || lane != 0) return;
    MbarArriveExpectTx(bar, 4 * kSliceHalfBytes);
    TmaLoad3d(k_dst, &maps.k, 0, kv_head, token, bar, policy);
    TmaLoad3d(k_dst + kSliceHalfBytes, &maps.k, 64, kv_head, token, bar, policy);
    TmaLoad3d(v_dst, &maps.v, 0, kv_head, token, bar, policy);
    TmaLoad3d(v_dst + kSliceHalfBytes, &maps.v, 64, kv_head, token, bar, policy);
  }
};

}  // namespace lazyrag::kernels::detail
