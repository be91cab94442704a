// TMA gathers of paged K/V tiles for the warp-specialized wgmma prefill kernel
// (lazy_attention_prefill_ws.cu).
//
// A tile is (kBlockN / page_size) pages x 2 column halves x {K, V} box copies of page_size
// rows x 128 bytes, spread over kWarps issuers (the op index o = issuer + i * kWarps; the ws
// kernel's producer warp passes its lane as the issuer), completing on one mbarrier per stage
// (expect_tx). The boxes land in exactly the 128-byte-swizzled layout the wgmma descriptors
// read (Sw128Offset): a box of 64 bf16 x page_size rows with CU_TENSOR_MAP_SWIZZLE_128B,
// written at a multiple of page_size x 128 bytes inside a 1024-byte aligned tile.
//
// The K and V pools are 3-D tensors [tokens = num_pages x page_size][num_kv_heads][head_dim]
// (dim 0 innermost); a box is {64 features, 1 head, page_size tokens}. Pages past the valid
// rows of a tile (the segment's last tile) are not loaded; the kernel zeroes V rows past the
// valid ones (0 x NaN would poison P V) and masks K's. (Issuing these boxes from every warp of
// the all-warps wgmma kernel, all waiting at its block barrier, measured slower than that
// kernel's cp.async gathers, so only the warp-specialized kernel uses this loader.)
#pragma once

#include <cuda.h>          // CUtensorMap (types only: the encoder comes through the runtime)
#include <cudaTypedefs.h>  // PFN_cuTensorMapEncodeTiled

#include <cstdint>

#include "absl/status/status.h"
#include "worker/attention/segment_view.h"
#include "worker/kernels/attention_internal.cuh"
#include "worker/kernels/lazy_attention.h"

namespace lazyrag::kernels::detail {

// Encoded on the host per launch (EncodeKvTmaMaps); passed by value as a
// __grid_constant__ kernel parameter (the TMA unit reads the map from parameter memory).
struct TmaMaps {
  CUtensorMap k;
  CUtensorMap v;
};

// ---------------------------------------------------------------------------------------
// mbarrier and bulk-tensor PTX (sm_90).

__device__ __forceinline__ void MbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
// Makes the initialized barriers visible to the async proxy (the TMA unit); then a block
// barrier before first use.
__device__ __forceinline__ void MbarInitFence() {
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
}
__device__ __forceinline__ void MbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void MbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ bool MbarTryWait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile(
      "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
      "selp.u32 %0, 1, 0, p;\n}\n"
      : "=r"(done)
      : "r"(bar), "r"(parity)
      : "memory");
  return done != 0;
}
__device__ __forceinline__ void MbarWait(uint32_t bar, uint32_t parity) {
  while (!MbarTryWait(bar, parity)) {
  }
}
// An L2 cache policy under which the lines an access brings in are evicted first (data read
// once, such as the documents' K/V in a step).
__device__ __forceinline__ uint64_t L2EvictFirstPolicy() {
  uint64_t policy;
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
  return policy;
}

// One box {c0, c1, c2} of the tensor `map` into shared memory at `dst`, completing `bytes` on
// the mbarrier `bar` (the issuing thread declared them with MbarArriveExpectTx first); with an
// L2 cache policy (L2EvictFirstPolicy) where `policy` is not 0.
__device__ __forceinline__ void TmaLoad3d(uint32_t dst, const CUtensorMap* map, int c0, int c1,
                                          int c2, uint32_t bar, uint64_t policy = 0) {
  if (policy != 0) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%2, %3, %4}], [%5], %6;\n" ::"r"(dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar), "l"(policy)
        : "memory");
    return;
  }
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
      " [%0], [%1, {%2, %3, %4}], [%5];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}

// ---------------------------------------------------------------------------------------
// The loader: the same Prefetch (page ids, one tile ahead) / Issue split as KvTileLoader, but
// only lane 0 of each warp works, on its ops o = warp, warp + kWarps, ... of the tile:
// page o / 4, column half (o / 2) % 2, K (o even) or V (o odd).
template <int kBlockN, int kWarps>
struct TmaTileLoader {
  static constexpr int kMaxOps = (kBlockN / 8) * 4 / kWarps;  // pages of 8 tokens at the least
  static constexpr int kHalfBytes = kBlockN * 128;
  int page_token[kMaxOps];  // page id x page_size of each op's page; -1: not loaded
  bool any;                 // the prefetched tile exists

  // All threads call it (uniform cursor); only lane 0 loads. REQUIRES page_size in
  // {8, 16, 32, 64} (LazyAttentionPrefillUsesTma).
  __device__ __forceinline__ void Prefetch(const TileCursor<kBlockN>& c, const SegmentView& v,
                                           int warp, int lane) {
    any = c.valid;
    if (lane != 0) return;
    const int ps = v.page_size;
    const int valid_rows = c.valid ? min(kBlockN, c.j_end - c.j) : 0;
    const int ops = (kBlockN / ps) * 4;
#pragma unroll
    for (int i = 0; i < kMaxOps; ++i) {
      const int o = warp + i * kWarps;
      const int page = o / 4;
      const bool ok = o < ops && page * ps < valid_rows;
      page_token[i] = ok ? v.page_indices[c.page_base + c.j / ps + page] * ps : -1;
    }
  }

  // Lane 0 of every warp: declares its bytes on `bar` and issues its boxes into the stage's
  // K and V tiles (each two 64-column halves of kBlockN rows x 128 bytes), under the L2 cache
  // policy `policy` (0: none). Every warp arrives (kWarps arrivals per phase), also with
  // nothing to load.
  __device__ __forceinline__ void Issue(uint32_t k_tile, uint32_t v_tile, uint32_t bar,
                                        const TmaMaps& maps, int kv_head, int page_size, int warp,
                                        int lane, uint64_t policy = 0) const {
    if (!any || lane != 0) return;
    uint32_t bytes = 0;
#pragma unroll
    for (int i = 0; i < kMaxOps; ++i) bytes += page_token[i] >= 0 ? uint32_t(page_size) * 128 : 0;
    if (bytes == 0) {
      MbarArrive(bar);
      return;
    }
    MbarArriveExpectTx(bar, bytes);
#pragma unroll
    for (int i = 0; i < kMaxOps; ++i) {
      if (page_token[i] < 0) continue;
      const int o = warp + i * kWarps;
      const int page = o / 4, half = (o / 2) % 2;
      const uint32_t offset = uint32_t(half * kHalfBytes + page * page_size * 128);
      if (o % 2 == 0) {
        TmaLoad3d(k_tile + offset, &maps.k, half * 64, kv_head, page_token[i], bar, policy);
      } else {
        TmaLoad3d(v_tile + offset, &maps.v, half * 64, kv_head, page_token[i], bar, policy);
      }
    }
  }
};

// Zeroes rows [valid_rows, rows_end) of a V tile of kBlockN rows (both column halves) in shared
// memory, rows_end <= kBlockN the keys the products read; the kThreads calling threads. The
// caller fences (fence.proxy.async) and syncs before wgmma reads it.
template <int kBlockN, int kThreads>
__device__ __forceinline__ void ZeroTileTail(char* tile, int valid_rows, int tid,
                                             int rows_end = kBlockN) {
  const int chunks = (rows_end - valid_rows) * 8;  // 16-byte chunks per half
  for (int i = tid; i < 2 * chunks; i += kThreads) {
    const int half = i / chunks, c = i % chunks;
    const int row = valid_rows + c / 8;
    *reinterpret_cast<uint4*>(tile + half * kBlockN * 128 + row * 128 + (c % 8) * 16) =
        make_uint4(0, 0, 0, 0);
  }
}

// The driver's tensor-map encoder through the runtime (no libcuda link), looked up once; null
// when the driver lacks it.
PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder();

// Host side (lazy_attention_prefill_ws.cu). The K and V pools of params as TMA tensor maps
// with boxes of box_tokens rows (0: page_size), L2 promotion to 256-byte lines or none
// (REQUIRES params.num_pages > 0, box_tokens a divisor of page_size, page_size in {8, 16, 32,
// 64} for the prefill and a power of two >= 16 for the decode, 16-byte aligned pools:
// LazyAttentionPrefillUsesWs, the decode's TMA warp pipes).
absl::Status EncodeKvTmaMaps(const LazyAttentionParams& params, TmaMaps* maps, int box_tokens = 0,
                             bool l2_promotion = true);
// Launches the warp-specialized prefill kernel (one block per SM, 384 threads).
absl::Status LaunchPrefillWs(const AttentionKernelParams& kp, const TmaMaps& maps, int blocks,
                             cudaStream_t stream);

}  // namespace lazyrag::kernels::detail
