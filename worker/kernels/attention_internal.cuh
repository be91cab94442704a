// Internal to worker/kernels: device building blocks shared by the prefill, decode and
// materialize kernels (PTX wrappers, RoPE sine/cosine, the swizzled shared-memory tile
// layout, the segment walk and the paged K/V tile loader), and the host-side CUDA_CHECK.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "worker/backend/segment_view.h"

// Returns an INTERNAL status from the enclosing host function when a CUDA call fails.
#define LAZYRAG_CUDA_RETURN_IF_ERROR(expr)                                                     \
  do {                                                                                         \
    const cudaError_t _lazyrag_err = (expr);                                                   \
    if (_lazyrag_err != cudaSuccess) {                                                         \
      return ::absl::InternalError(::absl::StrCat(#expr, ": ", cudaGetErrorName(_lazyrag_err), \
                                                  " ", cudaGetErrorString(_lazyrag_err)));     \
    }                                                                                          \
  } while (0)

// Checks the launch just made (configuration errors surface here; faults surface later on
// the stream).
#define LAZYRAG_CUDA_CHECK_LAUNCH() LAZYRAG_CUDA_RETURN_IF_ERROR(cudaGetLastError())

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
  // Prefill only: query rows per block (64 / group) and query blocks per request.
  int q_rows_per_block;
  int q_blocks;
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
    uint32_t* lw = reinterpret_cast<uint32_t*>(&lo);
    uint32_t* hw = reinterpret_cast<uint32_t*>(&hi);
    const int pos = pos0 + row;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 x0 = UnpackBf16(lw[e]), x1 = UnpackBf16(hw[e]);
      float s0, c0, s1, c1;
      RopeSinCos(pos, inv_freq_smem[cp * 8 + 2 * e], &s0, &c0);
      RopeSinCos(pos, inv_freq_smem[cp * 8 + 2 * e + 1], &s1, &c1);
      lw[e] = PackBf16(x0.x * c0 - x1.x * s0, x0.y * c1 - x1.y * s1);
      hw[e] = PackBf16(x1.x * c0 + x0.x * s0, x1.y * c1 + x0.y * s1);
    }
    *lo_ptr = lo;
    *hi_ptr = hi;
  }
}

// ---------------------------------------------------------------------------------------
// Walks the key tiles of one request: the request's segments concatenated in order form a
// virtual key range; a block owns [v_begin, v_end) of it (its KV split). Within segment s the
// loadable local keys are clipped to that range and by causality (seg_start + j <= max_pos,
// the largest query position of the block). Tiles never cross segments (the query rotation
// is per segment). Every thread of a block walks the same cursor (uniform control flow).
template <int kBlockN>
struct TileCursor {
  int s;      // current segment (global index)
  int s_end;  // one past the request's last segment
  int v_seg;  // virtual index of segment s's first key
  int v_begin, v_end, max_pos;
  int start;      // seg_start[s]: rope delta / logical position of key 0
  int len;        // seg_len[s]
  int page_base;  // page_indptr[s]
  int j;          // first local key of the current tile
  int j_end;      // one past the last loadable local key of segment s
  bool valid;

  __device__ __forceinline__ void Init(const SegmentView& v, int b, int vb, int ve, int mp) {
    s = v.seg_indptr[b];
    s_end = v.seg_indptr[b + 1];
    v_seg = 0;
    v_begin = vb;
    v_end = ve;
    max_pos = mp;
    Seek(v);
  }
  // Moves to the first segment at or after s with a non-empty tile range.
  __device__ __forceinline__ void Seek(const SegmentView& v) {
    valid = false;
    for (; s < s_end && v_seg < v_end; ++s) {
      len = v.seg_len[s];
      start = v.seg_start[s];
      const int lo = max(0, v_begin - v_seg);
      const int hi = min(min(len, v_end - v_seg), max_pos - start + 1);
      if (lo < hi) {
        j = lo;
        j_end = hi;
        page_base = v.page_indptr[s];
        valid = true;
        return;
      }
      v_seg += len;
    }
  }
  __device__ __forceinline__ void Next(const SegmentView& v) {
    j += kBlockN;
    if (j >= j_end) {
      v_seg += len;
      ++s;
      Seek(v);
    }
  }
};

// Sum of seg_len over request b's segments.
__device__ __forceinline__ int RequestKvLen(const SegmentView& v, int b) {
  int total = 0;
  for (int s = v.seg_indptr[b]; s < v.seg_indptr[b + 1]; ++s) total += v.seg_len[s];
  return total;
}

// Gathers one K tile and one V tile (kBlockN key rows of one KV head) from the page pool
// into shared memory with 16-byte cp.async. Thread `tid` moves chunk tid % (D/8) of rows
// tid / (D/8) + i * kRowsPerPass. The page ids of the next tile are fetched (Prefetch) one
// tile ahead of the copy (Issue), so their latency hides behind a tile of math.
template <int D, int kBlockN, int kThreads>
struct KvTileLoader {
  static constexpr int kChunks = D / 8;
  static constexpr int kRowsPerPass = kThreads / kChunks;
  static constexpr int kPasses = kBlockN / kRowsPerPass;
  static_assert(kThreads % kChunks == 0 && kBlockN % kRowsPerPass == 0, "tile shape");

  int page[kPasses];  // page id of each row this thread moves, -1 = not loadable (zero-fill)
  int slot[kPasses];
  bool any;  // the prefetched tile exists

  __device__ __forceinline__ void Prefetch(const TileCursor<kBlockN>& c, const SegmentView& v,
                                           int tid) {
    any = c.valid;
    const int row0 = tid / kChunks;
    int jj = c.j + row0;
    int pg = jj / v.page_size;
    int sl = jj - pg * v.page_size;
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const bool ok = c.valid && jj < c.j_end;
      page[p] = ok ? v.page_indices[c.page_base + pg] : -1;
      slot[p] = sl;
      jj += kRowsPerPass;
      sl += kRowsPerPass;
      while (sl >= v.page_size) {
        sl -= v.page_size;
        ++pg;
      }
    }
  }

  __device__ __forceinline__ void Issue(char* k_smem, char* v_smem, const __nv_bfloat16* k_cache,
                                        const __nv_bfloat16* v_cache, int page_size,
                                        int64_t token_stride, int head_offset, int tid) const {
    if (!any) return;
    const int row0 = tid / kChunks, chunk = tid % kChunks;
#pragma unroll
    for (int p = 0; p < kPasses; ++p) {
      const int row = row0 + p * kRowsPerPass;
      const bool ok = page[p] >= 0;
      const int64_t off =
          ok ? (int64_t(page[p]) * page_size + slot[p]) * token_stride + head_offset + chunk * 8
             : 0;
      const uint32_t dst = TileOffset<D>(row, chunk);
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

// Combines the partial results of kp.num_splits splits into kp.out (only when > 1 split).
absl::Status LaunchMergeSplits(const AttentionKernelParams& kp, int num_q, int head_dim,
                               cudaStream_t stream);

}  // namespace lazyrag::kernels::detail
