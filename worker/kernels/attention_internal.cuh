// Internal to worker/kernels: what the prefill, decode and materialize kernels share: the
// kernel-side attention parameters, a prefill block's rows, the online softmax on mma
// fragments and the epilogue (device side), and the launch helpers (host side). The device
// building blocks live in device_ptx.cuh (PTX wrappers), kv_tiles.cuh (tile layouts, split
// planning, the tile walk and loader) and rope_device.cuh (RoPE); the CUDA status checks in
// cuda_check.h.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "common/status.h"
#include "worker/attention/segment_view.h"
#include "worker/kernels/cuda_check.h"
#include "worker/kernels/device_ptx.cuh"
#include "worker/kernels/kv_tiles.cuh"
#include "worker/kernels/rope_device.cuh"

namespace lazyrag::kernels::detail {

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
  // LazyAttentionParams::l2_prefetch (bytes 0: none), l2_prefetch_at_start.
  const char* l2_prefetch;
  int64_t l2_prefetch_bytes;
  int l2_prefetch_at_start;
  int kv_evict_first;  // LazyAttentionParams::kv_evict_first
  int narrow_tail;     // LazyAttentionParams::narrow_tail_tiles
};

// This block's equal share of the kernel's l2_prefetch range (blocks in grid order, 16-byte
// granules), asked of L2 by the calling warp's lanes in pieces of at most 64 KiB. Every lane of
// one warp calls it.
// `at_start`: the call site at the block's start (true) or after its last K/V copy (false);
// only the one that l2_prefetch_at_start names asks.
__device__ __forceinline__ void PrefetchL2Share(const AttentionKernelParams& p, int lane,
                                                bool at_start) {
  if (p.l2_prefetch_bytes <= 0 || at_start != (p.l2_prefetch_at_start != 0)) return;
  const int64_t blocks = int64_t(gridDim.x) * gridDim.y * gridDim.z;
  const int64_t block =
      blockIdx.x + int64_t(gridDim.x) * (blockIdx.y + int64_t(gridDim.y) * blockIdx.z);
  const int64_t granules = p.l2_prefetch_bytes / 16;
  const int64_t g0 = block * granules / blocks, g1 = (block + 1) * granules / blocks;
  constexpr int64_t kPiece = 4096;  // granules: 64 KiB
  for (int64_t g = g0 + int64_t(lane) * kPiece; g < g1; g += 32 * kPiece) {
    L2PrefetchBulk(p.l2_prefetch + g * 16, static_cast<uint32_t>(min(kPiece, g1 - g) * 16));
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

// Score fragments in the mma.sync m16n8 C layout (also wgmma's, per 8 columns): s[nb] holds
// rows g = lane / 4 ("lo") and g + 8 ("hi") of a warp's 16 at keys nb * 8 + 2 t + e (t = lane %
// 4). Sets the keys below lo (a segment's skipped keys) and at or past lim_lo / lim_hi to -inf,
// maps the others to s * scale + bias when kScale, and folds each row's values into mx_lo /
// mx_hi (this thread's share of the row).
template <int NB, bool kScale>
__device__ __forceinline__ void MaskRowMax(float (&s)[NB][4], int lo, int lim_lo, int lim_hi,
                                           float scale, float bias, int t, float& mx_lo,
                                           float& mx_hi) {
#pragma unroll
  for (int nb = 0; nb < NB; ++nb) {
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      const int key = nb * 8 + 2 * t + e;
      const bool in = key >= lo;
      s[nb][e] = in && key < lim_lo ? (kScale ? fmaf(s[nb][e], scale, bias) : s[nb][e]) : kNegInf;
      s[nb][2 + e] =
          in && key < lim_hi ? (kScale ? fmaf(s[nb][2 + e], scale, bias) : s[nb][2 + e]) : kNegInf;
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
// mma.sync decode and prefill kernels: keys below lo or at or past lim_lo / lim_hi are masked,
// the rest mapped into the log2 domain by the segment's transform (SegScores); the running
// maxima m and sums l are updated, s becomes the unnormalised probabilities and the O fragments
// are rescaled.
template <int NB, int DB>
__device__ __forceinline__ void OnlineSoftmaxTile(float (&s)[NB][4], float (&o)[DB][4], int lo,
                                                  int lim_lo, int lim_hi, const SegScores& sc,
                                                  int t, float& m_lo, float& m_hi, float& l_lo,
                                                  float& l_hi) {
  float mx_lo = kNegInf, mx_hi = kNegInf;
  MaskRowMax<NB, true>(s, lo, lim_lo, lim_hi, sc.scale, sc.bias, t, mx_lo, mx_hi);
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
// kernel's dynamic shared-memory limit is raised to smem_bytes first. `cluster_x` > 1: in
// thread-block clusters of that many blocks along x (grid.x a multiple of it; the CUDA model's
// few-row RMSNorm).
template <typename... Params, typename... Args>
absl::Status LaunchPdlClusterKernel(void (*kernel)(Params...), dim3 grid, int cluster_x,
                                    int threads, int smem_bytes,
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
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  attr[1].id = cudaLaunchAttributeClusterDimension;
  attr[1].val.clusterDim.x = static_cast<unsigned>(cluster_x);
  attr[1].val.clusterDim.y = 1;
  attr[1].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = cluster_x > 1 ? 2 : 1;
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaLaunchKernelEx(&config, kernel, args...));
  return absl::OkStatus();
}
// LaunchPdlClusterKernel without clusters.
template <typename... Params, typename... Args>
absl::Status LaunchPdlKernel(void (*kernel)(Params...), dim3 grid, int threads, int smem_bytes,
                             std::atomic<uint64_t>* smem_configured, cudaStream_t stream,
                             const Args&... args) {
  return LaunchPdlClusterKernel(kernel, grid, 1, threads, smem_bytes, smem_configured, stream,
                                args...);
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
