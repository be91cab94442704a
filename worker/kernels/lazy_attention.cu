// Host side shared by the prefill and decode launchers: validation, split planning, and the
// kernel that merges split-KV partial results.
#include <algorithm>
#include <cmath>

#include "common/status.h"
#include "worker/kernels/attention_internal.cuh"
#include "worker/kernels/lazy_attention.h"

namespace lazyrag::kernels {
namespace detail {
namespace {

constexpr int kMergeThreads = 128;

// One block per (query row, head): out = sum_s w_s O_s / sum_s w_s, w_s = 2^(lse_s - max lse).
// Every warp reads all the splits' lse (4 per lane covers kMaxKvSplits) and computes the
// weights itself (no barrier); thread t then owns 4 consecutive features (t % (D/4)) of the
// splits s = t / (D/4) (mod kMergeThreads / (D/4)), with its 16-byte loads independent of
// each other, and the per-thread sums are reduced through shared memory. A batch-1 merge of
// 32 splits is thus ~2 L2 round trips (1 with kPre), not one per 8 splits as with one warp
// per row. kPre > 0: this thread's first kPre partial outputs are requested together with the
// lse, so both arrive in one L2 round trip: 12 (48 splits) for merges of at most one block per
// SM (a batch-1 decode, where it measured faster on the H200), 4 (16 splits) for more rows
// (registers: a 32-row query block merges 1,024 rows).
template <int D, int kPre>
__device__ __forceinline__ void MergeSplitsBody(const AttentionKernelParams& p, int rows) {
  static_assert(kMaxKvSplits <= 4 * 32, "lse per lane");
  constexpr int kChunks = D / 4;                        // float4 per row
  constexpr int kSplitLanes = kMergeThreads / kChunks;  // 4 (D = 128) or 8 (D = 64)
  __shared__ float w_smem[kMergeThreads / 32][kMaxKvSplits];
  __shared__ float4 part[kSplitLanes][kChunks];
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int row = blockIdx.x;
  const int splits = p.num_splits;
  const int chunk = tid % kChunks, sl = tid / kChunks;
  const int64_t split_stride = int64_t(rows) * D;
  const float* src = p.o_partial + int64_t(row) * D + chunk * 4;
  float4 pre[kPre > 0 ? kPre : 1];
#pragma unroll
  for (int k = 0; k < kPre; ++k) {
    const int s = sl + k * kSplitLanes;
    pre[k] = s < splits ? *reinterpret_cast<const float4*>(src + s * split_stride)
                        : make_float4(0.f, 0.f, 0.f, 0.f);
  }
  float lse[4];
  float m = kNegInf;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int s = lane + 32 * i;
    lse[i] = s < splits ? p.lse_partial[int64_t(s) * rows + row] : kNegInf;
    m = fmaxf(m, lse[i]);
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
  float l = 0.f;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const int s = lane + 32 * i;
    const float w = m == kNegInf ? 0.f : Exp2(lse[i] - m);  // empty split: lse -inf, w 0
    if (s < splits) w_smem[warp][s] = w;
    l += w;
  }
#pragma unroll
  for (int off = 16; off > 0; off /= 2) l += __shfl_xor_sync(0xffffffffu, l, off);
  __syncwarp();

  float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
  const auto add = [&](int s, const float4& o) {
    const float w = w_smem[warp][s];
    acc.x += w * o.x;
    acc.y += w * o.y;
    acc.z += w * o.z;
    acc.w += w * o.w;
  };
#pragma unroll
  for (int k = 0; k < kPre; ++k) {
    if (sl + k * kSplitLanes < splits) add(sl + k * kSplitLanes, pre[k]);
  }
#pragma unroll 8
  for (int s = sl + kPre * kSplitLanes; s < splits; s += kSplitLanes) {
    add(s, *reinterpret_cast<const float4*>(src + s * split_stride));
  }
  part[sl][chunk] = acc;
  __syncthreads();
  if (sl == 0) {
#pragma unroll
    for (int k = 1; k < kSplitLanes; ++k) {
      const float4 x = part[k][chunk];
      acc.x += x.x;
      acc.y += x.y;
      acc.z += x.z;
      acc.w += x.w;
    }
    const float inv = l > 0.f ? 1.f / l : 0.f;
    uint2 packed;
    packed.x = PackBf16(acc.x * inv, acc.y * inv);
    packed.y = PackBf16(acc.z * inv, acc.w * inv);
    *reinterpret_cast<uint2*>(p.out + int64_t(row) * D + chunk * 4) = packed;
  }
}

// Launched as a programmatic dependent of the attention kernel, which lets it be scheduled
// from its start: the merge blocks become resident as attention blocks retire, and
// griddepcontrol.wait holds them until that grid has finished and its writes are visible.
template <int D, int kPre>
__global__ void __launch_bounds__(kMergeThreads)
    MergeSplitsKernel(const __grid_constant__ AttentionKernelParams p, int rows) {
  PdlLaunchDependents();
  PdlWait();
  MergeSplitsBody<D, kPre>(p, rows);
}

}  // namespace

absl::Status DeviceSmCount(int* sms) {
  constexpr int kMaxDevices = 64;
  static int cached[kMaxDevices] = {};  // benign race: every writer stores the same value
  int dev = 0;
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaGetDevice(&dev));
  if (dev >= 0 && dev < kMaxDevices && cached[dev] > 0) {
    *sms = cached[dev];
    return absl::OkStatus();
  }
  int n = 0;
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev));
  if (dev >= 0 && dev < kMaxDevices) cached[dev] = n;
  *sms = n;
  return absl::OkStatus();
}

absl::Status SetSmemLimitOnce(const void* kernel, int bytes, std::atomic<uint64_t>* done) {
  int dev = 0;
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaGetDevice(&dev));
  const uint64_t bit = dev < 64 ? (uint64_t(1) << dev) : 0;
  if (bit != 0 && (done->load(std::memory_order_acquire) & bit)) return absl::OkStatus();
  LAZYRAG_RETURN_IF_CUDA_ERROR(
      cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
  // All of the unified L1/shared storage as shared memory, so two blocks fit per SM.
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaFuncSetAttribute(
      kernel, cudaFuncAttributePreferredSharedMemoryCarveout, cudaSharedmemCarveoutMaxShared));
  done->fetch_or(bit, std::memory_order_acq_rel);
  return absl::OkStatus();
}

absl::Status MakeKernelParams(const LazyAttentionParams& params, int base_blocks, int blocks_per_sm,
                              int min_split_keys, AttentionKernelParams* kp) {
  const AttentionShape& sh = params.shape;
  int splits = params.num_splits;
  if (splits <= 0) {
    int sms = 0;
    RETURN_IF_ERROR(DeviceSmCount(&sms));
    // As many splits as fit in ONE wave of resident blocks (rounding up would start a second,
    // nearly empty wave that doubles the time: 16 blocks x 17 splits = 272 > 264 slots).
    const int target = sms * blocks_per_sm;
    splits = std::max(1, target / std::max(1, base_blocks));
    splits =
        std::min(splits, std::max(1, (params.max_kv_len + min_split_keys - 1) / min_split_keys));
  }
  splits = std::min(splits, kMaxKvSplits);
  const size_t per_split =
      LazyAttentionWorkspaceBytes(params.view.num_q, sh.num_heads, sh.head_dim, 1);
  if (splits > 1) {
    const size_t fit =
        params.workspace == nullptr || per_split == 0 ? 1 : params.workspace_bytes / per_split;
    splits = static_cast<int>(std::min<size_t>(splits, std::max<size_t>(fit, 1)));
  }

  kp->q = reinterpret_cast<const __nv_bfloat16*>(params.q);
  kp->k_cache = reinterpret_cast<const __nv_bfloat16*>(params.k_cache);
  kp->v_cache = reinterpret_cast<const __nv_bfloat16*>(params.v_cache);
  kp->out = reinterpret_cast<__nv_bfloat16*>(params.out);
  kp->inv_freq = params.inv_freq;
  kp->view = params.view;
  kp->num_heads = sh.num_heads;
  kp->num_kv_heads = sh.num_kv_heads;
  kp->group = sh.num_heads / sh.num_kv_heads;
  kp->scale_log2 = sh.scale * kLog2e;
  kp->num_splits = splits;
  kp->ws_pingpong = 0;
  kp->stable_history = params.stable_history ? 1 : 0;
  kp->l2_prefetch = static_cast<const char*>(params.l2_prefetch);
  kp->l2_prefetch_bytes = params.l2_prefetch_bytes;
  kp->l2_prefetch_at_start = params.l2_prefetch_at_start ? 1 : 0;
  kp->kv_evict_first = params.kv_evict_first ? 1 : 0;
  kp->narrow_tail = params.narrow_tail_tiles ? 1 : 0;
  kp->o_partial = nullptr;
  kp->lse_partial = nullptr;
  if (splits > 1) {
    kp->o_partial = static_cast<float*>(params.workspace);
    kp->lse_partial =
        kp->o_partial + int64_t(splits) * params.view.num_q * sh.num_heads * sh.head_dim;
  }
  return absl::OkStatus();
}

absl::Status SmallMergeKernelAttributes(cudaFuncAttributes* attr, int* threads) {
  *threads = kMergeThreads;
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaFuncGetAttributes(attr, MergeSplitsKernel<128, 12>));
  return absl::OkStatus();
}

absl::Status LaunchMergeSplits(const AttentionKernelParams& kp, int num_q, int head_dim,
                               cudaStream_t stream) {
  if (kp.num_splits <= 1 || num_q == 0) return absl::OkStatus();
  const int rows = num_q * kp.num_heads;
  int sms = 0;
  RETURN_IF_ERROR(DeviceSmCount(&sms));
  switch (head_dim) {
    case 64:
      return LaunchPdlKernel(MergeSplitsKernel<64, 0>, dim3(rows), kMergeThreads, 0, nullptr,
                             stream, kp, rows);
    case 128:
      if (rows <= sms) {
        return LaunchPdlKernel(MergeSplitsKernel<128, 12>, dim3(rows), kMergeThreads, 0, nullptr,
                               stream, kp, rows);
      }
      return kp.num_splits <= 16 ? LaunchPdlKernel(MergeSplitsKernel<128, 4>, dim3(rows),
                                                   kMergeThreads, 0, nullptr, stream, kp, rows)
                                 : LaunchPdlKernel(MergeSplitsKernel<128, 0>, dim3(rows),
                                                   kMergeThreads, 0, nullptr, stream, kp, rows);
    default:
      return absl::InvalidArgumentError(absl::StrCat("head_dim must be 64 or 128, got ", head_dim));
  }
}

}  // namespace detail

size_t LazyAttentionWorkspaceBytes(int num_q, int num_heads, int head_dim, int max_splits) {
  if (num_q <= 0 || num_heads <= 0 || head_dim <= 0 || max_splits <= 0) return 0;
  return size_t(max_splits) * size_t(num_q) * size_t(num_heads) * size_t(head_dim + 1) *
         sizeof(float);
}

absl::Status ValidateLazyAttentionParams(const LazyAttentionParams& p, bool decode) {
  const AttentionShape& sh = p.shape;
  if (sh.head_dim != 64 && sh.head_dim != 128) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim must be 64 or 128, got ", sh.head_dim));
  }
  if (sh.num_heads <= 0 || sh.num_kv_heads <= 0 || sh.num_heads % sh.num_kv_heads != 0) {
    return absl::InvalidArgumentError(absl::StrCat("num_heads (", sh.num_heads,
                                                   ") must be a positive multiple of "
                                                   "num_kv_heads (",
                                                   sh.num_kv_heads, ")"));
  }
  if (sh.num_heads / sh.num_kv_heads > 16) {
    return absl::InvalidArgumentError(
        absl::StrCat("GQA group ", sh.num_heads / sh.num_kv_heads, " exceeds 16"));
  }
  if (!std::isfinite(sh.scale) || !(sh.scale > 0.f)) {
    return absl::InvalidArgumentError(
        absl::StrCat("scale must be finite and positive, got ", sh.scale));
  }
  if (p.key_layout != KeyLayout::kRotatedLocal && p.key_layout != KeyLayout::kUnrotated) {
    return absl::InvalidArgumentError("unknown key layout");
  }
  const SegmentView& v = p.view;
  if (v.num_requests < 0 || v.num_q < 0) {
    return absl::InvalidArgumentError("negative num_requests or num_q");
  }
  if (v.page_size < 1) {
    return absl::InvalidArgumentError(absl::StrCat("page_size must be >= 1, got ", v.page_size));
  }
  if (p.num_splits < 0) return absl::InvalidArgumentError("num_splits must be >= 0");
  if (p.num_pages < 0) return absl::InvalidArgumentError("num_pages must be >= 0");
  if (p.l2_prefetch_bytes < 0 || p.l2_prefetch_bytes % 16 != 0 ||
      (p.l2_prefetch_bytes > 0 &&
       (p.l2_prefetch == nullptr || reinterpret_cast<uintptr_t>(p.l2_prefetch) % 16 != 0))) {
    return absl::InvalidArgumentError(absl::StrCat(
        "l2_prefetch needs a 16-byte aligned pointer and a byte count that is a "
        "non-negative multiple of 16, got ",
        p.l2_prefetch_bytes, " bytes at address ", reinterpret_cast<uintptr_t>(p.l2_prefetch)));
  }
  if (p.max_q_len < 1 || p.max_kv_len < 0) {
    return absl::InvalidArgumentError("max_q_len must be >= 1 and max_kv_len >= 0");
  }
  if (decode && v.num_q != v.num_requests) {
    return absl::InvalidArgumentError(absl::StrCat("decode takes one query row per request: num_q ",
                                                   v.num_q, " != num_requests ", v.num_requests));
  }
  if (int64_t(v.num_requests) * sh.num_kv_heads * p.max_q_len > (int64_t(1) << 31) - 1) {
    return absl::InvalidArgumentError("batch too large for one launch");
  }
  if (v.num_requests > 0 &&
      (p.q == nullptr || p.k_cache == nullptr || p.v_cache == nullptr || p.out == nullptr ||
       p.inv_freq == nullptr || v.q_indptr == nullptr || v.q_pos == nullptr ||
       v.seg_indptr == nullptr || v.seg_start == nullptr || v.seg_len == nullptr ||
       v.page_indptr == nullptr || v.page_indices == nullptr)) {
    return absl::InvalidArgumentError("null tensor or view pointer");
  }
  return absl::OkStatus();
}

}  // namespace lazyrag::kernels
