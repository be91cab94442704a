// LAZY decode attention (one query row per request), flash-decoding style.
//
// Block = (request, KV head, KV split), 4 warps. The group's query heads (<= 16) form the 16
// rows of one mma A fragment, so all heads of the group share every K/V byte loaded. K/V
// tiles of 64 keys are gathered from the pages, 3-4 stages deep (64-96 KiB in flight per
// block, two blocks per multiprocessor); each warp takes 16 keys of every tile (mma.sync m16n8k16;
// the tensor cores make the math free next to the bytes) with its own online softmax, and the 4
// warps' partial results are merged through shared memory at the end. Splits (chosen so that the
// grid fills the GPU) are merged by the merge kernel. Three ways to load the tiles, one per shape:
//  * block tiles (head dim 64, and the un-rotated layout, whose key rotation works on whole
//    tiles): the whole block gathers each tile with 16-byte cp.async, one block barrier per
//    tile;
//  * warp pipes (head dim 128, LAZY layout): each warp gathers only its own 16 keys of every
//    tile into its own ring, so the loop needs a __syncwarp instead of a block barrier and a
//    warp never waits for the others; same arithmetic in the same order. Copies by TMA
//    (decode_tma_slice.cuh) where page_size is a power of two >= 16 and num_pages is known,
//    by cp.async otherwise: bit-identical, TMA measured faster (bench/README.md).
// With LazyAttentionParams::stable_history the warp pipes also issue the copies of their first
// tiles below the query's position before the PDL wait. Page ids are requested two tiles ahead
// of their copies, the first ones before the wait, so no page-table round trip sits on the
// path after it.
#include "common/status.h"
#include "worker/kernels/attention_internal.cuh"
#include "worker/kernels/decode_tma_slice.cuh"
#include "worker/kernels/lazy_attention.h"

namespace lazyrag::kernels {
namespace detail {
namespace {

template <int D>
struct DecodeConfig {
  static constexpr int kWarps = 4;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockN = kWarps * 16;  // keys per tile, 16 per warp
  static constexpr int kStages = D == 128 ? 3 : 4;
  static constexpr int kTileBytes = kBlockN * D * 2;
  static constexpr int kQBytes = 16 * D * 2;
  static constexpr int kMergeStride = D + 8;  // floats per row of the cross-warp merge buffer
  static constexpr int kMergeBytes = kWarps * 16 * (kMergeStride + 2) * 4;
  static_assert(kMergeBytes <= 2 * kStages * kTileBytes, "merge buffer reuses the tiles");
  // [Q][K stages][V stages][inv_freq D/2][split plan]
  static constexpr int kSmemBytes =
      kQBytes + 2 * kStages * kTileBytes + (D / 2) * 4 + int(sizeof(SplitPlan));
};

// kTma (warp pipelines, head dim 128 only): the slices are copied by TMA (decode_tma_slice.cuh,
// `maps`) instead of cp.async; same arithmetic in the same order.
template <int D, bool kRotateKeys, bool kWarpPipes, bool kTma = false>
__device__ __forceinline__ void DecodeBody(const AttentionKernelParams& p, char* smem_raw,
                                           const TmaMaps* maps = nullptr) {
  static_assert(!(kRotateKeys && kWarpPipes), "key rotation works on whole tiles");
  static_assert(!kTma || (kWarpPipes && D == 128), "TMA slices are warp-pipe rows of 256 bytes");
  using Cfg = DecodeConfig<D>;
  constexpr int kBlockN = Cfg::kBlockN, kStages = Cfg::kStages, kThreads = Cfg::kThreads;
  constexpr int kWarps = Cfg::kWarps;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int t = lane & 3;
  const SegmentView& v = p.view;
  const int b = blockIdx.x / p.num_kv_heads;
  const int kvh = blockIdx.x % p.num_kv_heads;
  const int split = blockIdx.y;
  const int group = p.group, H = p.num_heads;

  // kTma: the K/V stages 1024-byte aligned (Q is 4 KiB in front of them).
  char* smem = kTma ? smem_raw + ((1024u - (SmemAddr(smem_raw) & 1023u)) & 1023u) : smem_raw;
  char* q_smem = smem;
  char* k_smem = smem + Cfg::kQBytes;
  char* v_smem = k_smem + kStages * Cfg::kTileBytes;
  float* freq_smem = reinterpret_cast<float*>(v_smem + kStages * Cfg::kTileBytes);
  SplitPlan* plan = reinterpret_cast<SplitPlan*>(freq_smem + D / 2);
  // kTma: this warp's mbarrier of stage st at bars + 8 * st (8-byte aligned after the plan).
  const uint32_t bars = ((SmemAddr(plan + 1) + 7u) & ~7u) + uint32_t((tid / 32) * kStages * 8);

  PdlLaunchDependents();
  // Three rounds of dependent loads before the first K/V request: (q_indptr, seg_indptr),
  // (q_pos, the request's segment metadata, 32 segments per lane round), the first tiles'
  // page ids. They read only the step's segment view and inv_freq (uploaded or written before
  // the previous kernel started), so they run before PdlWait, overlapping the previous
  // kernel's tail; the query and the K/V bytes (the previous kernels write the step's own
  // rows) are read after it.
  const int q_row = v.q_indptr[b];
  // The query rows (written by the previous kernels) into L2 now, read after PdlWait.
  if (tid == 0) L2PrefetchBulk(p.q + (int64_t(q_row) * H + kvh * group) * D, group * D * 2);
  const int s_first = v.seg_indptr[b], s_end = v.seg_indptr[b + 1];
  const int pos = v.q_pos[q_row];
  for (int i = tid; i < D / 2; i += kThreads) freq_smem[i] = p.inv_freq[i];
  if (warp == 0) PlanSplit<kBlockN>(v, s_first, s_end, pos, split, p.num_splits, plan, lane);
  if (kTma && lane == 0) {
#pragma unroll
    for (int st = 0; st < kStages; ++st) MbarInit(bars + 8 * st, 1);
    MbarInitFence();
  }
  __syncthreads();

  TileCursor<kBlockN> cons;
  cons.Init(plan, v);
  TileCursor<kBlockN> prod = cons;
  const int key0 = warp * 16;  // this warp's keys within every tile
  // Block tiles: all threads move each 64-key tile. Warp pipelines: each warp moves only its
  // own 16 rows of every tile (the rows it consumes), so it needs no other warp's copies.
  using Loader =
      std::conditional_t<kTma, DecodeTmaSlice,
                         KvTileLoader<D, kWarpPipes ? 16 : kBlockN, kWarpPipes ? 32 : kThreads>>;
  const int load_tid = kWarpPipes ? lane : tid;
  const int slice = kWarpPipes ? key0 * D * 2 : 0;  // bytes: TileOffset<D>(key0 + r, c)
  const auto prefetch = [&](Loader& l, const TileCursor<kBlockN>& c) {
    TileCursor<kBlockN> w = c;
    if (kWarpPipes) w.j += key0;
    l.Prefetch(w, v, load_tid);
  };
  Loader loader;    // page ids of the next tile to copy
  Loader ids_next;  // and of the one after it (tile `ids_prod`)
  TileCursor<kBlockN> ids_prod;
  const int64_t token_stride = int64_t(p.num_kv_heads) * D;
  const int head_off = kvh * D;
  // Copies of the tile whose page ids `l` holds into stage st: one commit group (cp.async) or
  // the stage's mbarrier (TMA, under the kv_evict_first policy).
  uint64_t policy = 0;
  if constexpr (kTma) policy = p.kv_evict_first != 0 ? L2EvictFirstPolicy() : 0;
  const auto issue = [&](const Loader& l, int st) {
    if constexpr (kTma) {
      l.Issue(SmemAddr(k_smem + st * Cfg::kTileBytes + slice),
              SmemAddr(v_smem + st * Cfg::kTileBytes + slice), bars + 8 * st, *maps, kvh, lane,
              policy);
    } else {
      l.Issue(k_smem + st * Cfg::kTileBytes + slice, v_smem + st * Cfg::kTileBytes + slice,
              p.k_cache, p.v_cache, token_stride, head_off, load_tid);
      CpAsyncCommit();
    }
  };
  {
    // Prologue: the page ids of the first kStages - 1 tiles are fetched together (one round
    // trip, not one per tile), then their copies issued.
    Loader first[kStages - 1];
    // Warp pipelines with stable_history: the leading prologue stages whose rows (this warp's
    // 16 of the tile) all sit at positions below the query's are copied before PdlWait, in
    // order (one commit group per stage either way), at most kMaxEarly of them: with TMA one
    // (the copies before the wait compete with the previous kernels' tail; one measured faster
    // on the H200 than two or none, bench/README.md).
    constexpr int kMaxEarly = kTma ? 1 : kStages - 1;
    int early = 0;
    bool stable = kWarpPipes && p.stable_history != 0;
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      prefetch(first[st], prod);
      stable = stable && st < kMaxEarly &&
               (!prod.valid || prod.start + min(prod.j + key0 + 16, prod.j_end) <= pos);
      if (stable) ++early;
      if (prod.valid) prod.Next(plan, v);
    }
    if constexpr (kWarpPipes) {
#pragma unroll
      for (int st = 0; st < kStages - 1; ++st) {
        if (st < early) issue(first[st], st);
      }
    }
    // The page ids of the two tiles after the prologue, also before the wait: the loop issues
    // a tile's copies two iterations after its ids were requested (ids_next below), so no
    // page-table round trip sits between the wait and a copy, nor between two iterations.
    prefetch(loader, prod);
    ids_prod = prod;
    if (ids_prod.valid) ids_prod.Next(plan, v);
    prefetch(ids_next, ids_prod);
    if (warp == 0) PrefetchL2Share(p, lane, /*at_start=*/true);
    PdlWait();
    // Raw query rows (row r = head kvh * group + r; rows >= group zero). Block tiles: by
    // cp.async, completing with the first K/V tile. Warp pipelines: a warp waits only for its
    // own copies, so the rows are loaded plainly after the K/V copies are issued, before the
    // block barrier below.
    if constexpr (!kWarpPipes) {
      for (int it = tid; it < 16 * (D / 8); it += kThreads) {
        const int row = it / (D / 8), chunk = it % (D / 8);
        const bool ok = row < group;
        const __nv_bfloat16* src =
            ok ? p.q + (int64_t(q_row) * H + kvh * group + row) * D + chunk * 8 : p.q;
        CpAsync16(SmemAddr(q_smem) + TileOffset<D>(row, chunk), src, ok);
      }
    }
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      if (st >= early) issue(first[st], st);
    }
    if constexpr (kWarpPipes) {
      for (int it = tid; it < 16 * (D / 8); it += kThreads) {
        const int row = it / (D / 8), chunk = it % (D / 8);
        uint4 x = make_uint4(0u, 0u, 0u, 0u);
        if (row < group) {
          x = *reinterpret_cast<const uint4*>(p.q + (int64_t(q_row) * H + kvh * group + row) * D +
                                              chunk * 8);
        }
        *reinterpret_cast<uint4*>(q_smem + TileOffset<D>(row, chunk)) = x;
      }
      __syncthreads();
    }
  }

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_lo = kNegInf, m_hi = kNegInf, l_lo = 0.f, l_hi = 0.f;
  uint32_t qf[D / 16][4];
  int q_seg = -1;
  SegScores sc{0, p.scale_log2, 0.f};  // of segment sc_seg
  int sc_seg = -1;
  int stage = 0;
  uint32_t phases = 0;  // kTma: the parity each stage's mbarrier completes next

  while (cons.valid) {
    // kTma: rows of this warp's slice that were copied (<= 0: none, nothing to wait for).
    int slice_rows = kSliceRows;
    if constexpr (kTma) {
      slice_rows = min(kSliceRows, cons.j_end - cons.j - key0);
      if (slice_rows > 0) {
        MbarWait(bars + 8 * stage, (phases >> stage) & 1u);
        phases ^= 1u << stage;
      }
    } else {
      CpAsyncWait<kStages - 2>();
    }
    // Warp pipelines: this warp's copies landed and its lanes are done with the stage refilled
    // next; no other warp is involved.
    if constexpr (kWarpPipes) {
      __syncwarp();
    } else {
      __syncthreads();
    }
    issue(loader, (stage + kStages - 1) % kStages);
    loader = ids_next;
    if (ids_prod.valid) ids_prod.Next(plan, v);
    prefetch(ids_next, ids_prod);

    char* kt = k_smem + stage * Cfg::kTileBytes;
    char* vt = v_smem + stage * Cfg::kTileBytes;
    if constexpr (kTma) {
      // V rows past the copied ones hold other tokens' or never-written bytes (0 x NaN would
      // poison P V; their scores are masked). Fenced for the stage's next copies (async proxy).
      if (slice_rows < kSliceRows) {
        const int r0 = max(slice_rows, 0);
        for (int i = lane; i < (kSliceRows - r0) * (D / 8); i += 32) {
          *reinterpret_cast<uint4*>(vt + slice + SliceOffset(r0 + i / (D / 8), i % (D / 8))) =
              make_uint4(0u, 0u, 0u, 0u);
        }
        FenceProxyAsyncShared();
        __syncwarp();
      }
    }
    if constexpr (kRotateKeys) {
      RotateKeyTile<D, kBlockN, kThreads>(kt, cons.start + cons.j, freq_smem, tid);
      __syncthreads();
      if (q_seg < 0) {
        BuildRotatedQ<D>(qf, q_smem, lane >> 2, pos, pos, freq_smem, lane);
        q_seg = 0;
      }
    } else if (cons.s != q_seg) {
      BuildRotatedQ<D>(qf, q_smem, lane >> 2, pos - cons.start, pos - cons.start, freq_smem, lane);
      q_seg = cons.s;
    }

    float s[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
    const uint32_t kt_addr = SmemAddr(kt), vt_addr = SmemAddr(vt);
#pragma unroll
    for (int kb = 0; kb < D / 16; ++kb) {
      uint32_t r[4];
      const int row = (lane & 7) + ((lane >> 4) << 3);  // of the warp's 16
      const int chunk = kb * 2 + ((lane >> 3) & 1);
      LdMatrixX4(
          r, kt_addr + (kTma ? slice + SliceOffset(row, chunk) : TileOffset<D>(key0 + row, chunk)));
      MmaBf16(s[0], qf[kb], r[0], r[1]);
      MmaBf16(s[1], qf[kb], r[2], r[3]);
    }

    if (cons.s != sc_seg) {
      sc = SegScoresOf(plan, v, cons.s, p.scale_log2);
      sc_seg = cons.s;
    }
    const int lim = min(cons.j_end, pos - cons.start + 1) - cons.j - key0;
    OnlineSoftmaxTile(s, o, sc.skip - cons.j - key0, lim, lim, sc, t, m_lo, m_hi, l_lo, l_hi);
    const uint32_t a[4] = {PackBf16(s[0][0], s[0][1]), PackBf16(s[0][2], s[0][3]),
                           PackBf16(s[1][0], s[1][1]), PackBf16(s[1][2], s[1][3])};
    const int vrow = (lane & 7) + (((lane >> 3) & 1) << 3);  // of the warp's 16
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t r[4];
      const int chunk = dp * 2 + (lane >> 4);
      LdMatrixX4Trans(r, vt_addr + (kTma ? slice + SliceOffset(vrow, chunk)
                                         : TileOffset<D>(key0 + vrow, chunk)));
      MmaBf16(o[2 * dp], a, r[0], r[1]);
      MmaBf16(o[2 * dp + 1], a, r[2], r[3]);
    }
    cons.Next(plan, v);
    stage = (stage + 1) % kStages;
  }
  // Every copy of this block is issued: its share of the next kernel's bytes into L2.
  if (warp == 0) PrefetchL2Share(p, lane, /*at_start=*/false);
  CpAsyncWait<0>();
  __syncthreads();  // the tile buffers become the merge buffer

  // Cross-warp merge: [warp][16 rows][kMergeStride] partial O, then m and l per row.
#pragma unroll
  for (int off = 1; off <= 2; off *= 2) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
  }
  float* mo = reinterpret_cast<float*>(k_smem);
  float* mm = mo + kWarps * 16 * Cfg::kMergeStride;  // [warp][16]
  float* ml = mm + kWarps * 16;                      // [warp][16]
  const int g = lane >> 2;
#pragma unroll
  for (int db = 0; db < D / 8; ++db) {
    *reinterpret_cast<float2*>(mo + (warp * 16 + g) * Cfg::kMergeStride + db * 8 + 2 * t) =
        make_float2(o[db][0], o[db][1]);
    *reinterpret_cast<float2*>(mo + (warp * 16 + g + 8) * Cfg::kMergeStride + db * 8 + 2 * t) =
        make_float2(o[db][2], o[db][3]);
  }
  if (t == 0) {
    mm[warp * 16 + g] = m_lo;
    mm[warp * 16 + g + 8] = m_hi;
    ml[warp * 16 + g] = l_lo;
    ml[warp * 16 + g + 8] = l_hi;
  }
  __syncthreads();

  const int64_t rows = int64_t(v.num_q) * H;
  for (int idx = tid; idx < group * (D / 4); idx += kThreads) {
    const int r = idx / (D / 4), d = (idx % (D / 4)) * 4;
    float m = kNegInf;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) m = fmaxf(m, mm[w * 16 + r]);
    float l = 0.f;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
    if (m != kNegInf) {
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float wt = Exp2(mm[w * 16 + r] - m);
        const float4 x =
            *reinterpret_cast<const float4*>(mo + (w * 16 + r) * Cfg::kMergeStride + d);
        l += wt * ml[w * 16 + r];
        acc.x += wt * x.x;
        acc.y += wt * x.y;
        acc.z += wt * x.z;
        acc.w += wt * x.w;
      }
    }
    const float inv = l > 0.f ? 1.f / l : 0.f;
    const int64_t row_head = int64_t(q_row) * H + kvh * group + r;
    if (p.num_splits == 1) {
      uint2 packed;
      packed.x = PackBf16(acc.x * inv, acc.y * inv);
      packed.y = PackBf16(acc.z * inv, acc.w * inv);
      *reinterpret_cast<uint2*>(p.out + row_head * D + d) = packed;
    } else {
      *reinterpret_cast<float4*>(p.o_partial + (split * rows + row_head) * D + d) =
          make_float4(acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv);
      if (d == 0) p.lse_partial[split * rows + row_head] = l > 0.f ? m + __log2f(l) : kNegInf;
    }
  }
}

template <int D, bool kRotateKeys, bool kWarpPipes>
__global__ void __launch_bounds__(DecodeConfig<D>::kThreads, 2)
    LazyDecodeKernel(const __grid_constant__ AttentionKernelParams p) {
  extern __shared__ __align__(128) char smem[];
  DecodeBody<D, kRotateKeys, kWarpPipes>(p, smem);
}

template <int D, bool kRotateKeys, bool kWarpPipes = false>
absl::Status LaunchDecode(const AttentionKernelParams& kp, int blocks, cudaStream_t stream) {
  using Cfg = DecodeConfig<D>;
  auto* kernel = LazyDecodeKernel<D, kRotateKeys, kWarpPipes>;
  static std::atomic<uint64_t> smem_configured{0};
  return LaunchPdlKernel(kernel, dim3(blocks, kp.num_splits), Cfg::kThreads, Cfg::kSmemBytes,
                         &smem_configured, stream, kp);
}

__global__ void __launch_bounds__(DecodeConfig<128>::kThreads, 2)
    LazyDecodeTmaKernel(const __grid_constant__ AttentionKernelParams p,
                        const __grid_constant__ TmaMaps maps) {
  extern __shared__ __align__(1024) char smem[];
  DecodeBody<128, false, true, true>(p, smem, &maps);
}

// The TMA kernel's shared memory: 1024-byte alignment slack in front (the swizzled boxes), one
// mbarrier per (warp, stage) behind the plan.
constexpr int kDecodeTmaSmemBytes = 1024 + DecodeConfig<128>::kSmemBytes +
                                    DecodeConfig<128>::kWarps * DecodeConfig<128>::kStages * 8 + 8;

absl::Status LaunchDecodeTma(const AttentionKernelParams& kp, const TmaMaps& maps, int blocks,
                             cudaStream_t stream) {
  static std::atomic<uint64_t> smem_configured{0};
  return LaunchPdlKernel(LazyDecodeTmaKernel, dim3(blocks, kp.num_splits),
                         DecodeConfig<128>::kThreads, kDecodeTmaSmemBytes, &smem_configured, stream,
                         kp, maps);
}

}  // namespace

}  // namespace detail

absl::Status DecodeSplitMergeResidency(bool* fits, std::string* report) {
  using Cfg = detail::DecodeConfig<128>;
  cudaFuncAttributes mrg = {};
  int mrg_threads = 0;
  RETURN_IF_ERROR(detail::SmallMergeKernelAttributes(&mrg, &mrg_threads));
  int dev = 0;
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaGetDevice(&dev));
  cudaDeviceProp prop = {};
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&prop, dev));
  // Registers are allocated per warp in units of 256; shared memory per block includes the
  // driver's reserved bytes.
  const auto warp_regs = [](int per_thread) { return (per_thread * 32 + 255) / 256 * 256; };
  const int dec_warps = Cfg::kThreads / 32, mrg_warps = (mrg_threads + 31) / 32;
  const int64_t reserved = int64_t(prop.reservedSharedMemPerBlock);
  // Both warp-pipe kernels (batch 1 runs the TMA one; cp.async where TMA does not apply).
  const std::pair<const void*, int> kernels[] = {
      {reinterpret_cast<const void*>(detail::LazyDecodeTmaKernel), detail::kDecodeTmaSmemBytes},
      {reinterpret_cast<const void*>(detail::LazyDecodeKernel<128, false, true>), Cfg::kSmemBytes}};
  *fits = true;
  report->clear();
  for (const auto& [kernel, dyn_smem] : kernels) {
    cudaFuncAttributes dec = {};
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaFuncGetAttributes(&dec, kernel));
    const int64_t regs =
        2 * dec_warps * warp_regs(dec.numRegs) + mrg_warps * warp_regs(mrg.numRegs);
    const int64_t smem = 2 * (dyn_smem + int64_t(dec.sharedSizeBytes) + reserved) +
                         int64_t(mrg.sharedSizeBytes) + reserved;
    const int warps = 2 * dec_warps + mrg_warps;
    *fits = *fits && regs <= prop.regsPerMultiprocessor &&
            smem <= int64_t(prop.sharedMemPerMultiprocessor) &&
            warps * 32 <= prop.maxThreadsPerMultiProcessor;
    absl::StrAppend(report, report->empty() ? "" : "; ",
                    kernel == kernels[0].first ? "TMA" : "cp.async", ": 2 decode blocks (",
                    dec.numRegs, " registers per thread, ", dyn_smem + dec.sharedSizeBytes,
                    " B shared) + 1 merge block (", mrg.numRegs, " registers, ",
                    mrg.sharedSizeBytes, " B): ", regs, " of ", prop.regsPerMultiprocessor,
                    " registers, ", smem, " of ", prop.sharedMemPerMultiprocessor, " B shared, ",
                    warps * 32, " of ", prop.maxThreadsPerMultiProcessor, " threads");
  }
  return absl::OkStatus();
}

namespace {
// Head dim 128, LAZY layout: the TMA warp pipes wherever they apply (measured faster than the
// cp.async pipes on the H200; see bench/README.md), else the cp.async pipes.
bool DecodeUsesTma(const LazyAttentionParams& params) {
  const int ps = params.view.page_size;
  return ps % detail::kSliceRows == 0 && (ps & (ps - 1)) == 0 && params.num_pages > 0 &&
         params.key_layout != KeyLayout::kUnrotated;
}
}  // namespace

absl::Status LazyAttentionDecode(const LazyAttentionParams& params, cudaStream_t stream) {
  RETURN_IF_ERROR(ValidateLazyAttentionParams(params, /*decode=*/true));
  const SegmentView& v = params.view;
  if (v.num_requests == 0) return absl::OkStatus();
  const int64_t blocks = int64_t(v.num_requests) * params.shape.num_kv_heads;
  detail::AttentionKernelParams kp;
  RETURN_IF_ERROR(detail::MakeKernelParams(params, static_cast<int>(blocks), /*blocks_per_sm=*/2,
                                           /*min_split_keys=*/128, &kp));
  kp.q_rows_per_block = 1;
  kp.q_blocks = 1;
  const bool rotate_keys = params.key_layout == KeyLayout::kUnrotated;
  const int b = static_cast<int>(blocks);
  switch (params.shape.head_dim) {
    case 64:
      RETURN_IF_ERROR((rotate_keys ? detail::LaunchDecode<64, true>(kp, b, stream)
                                   : detail::LaunchDecode<64, false>(kp, b, stream)));
      break;
    case 128:
      if (rotate_keys) {
        RETURN_IF_ERROR((detail::LaunchDecode<128, true>(kp, b, stream)));
      } else if (DecodeUsesTma(params)) {
        detail::TmaMaps maps;
        // No L2 promotion: measured faster than 256-byte promotion on the H200 (batch 1).
        RETURN_IF_ERROR(detail::EncodeKvTmaMaps(params, &maps, detail::kSliceRows,
                                                /*l2_promotion=*/false));
        RETURN_IF_ERROR(detail::LaunchDecodeTma(kp, maps, b, stream));
      } else {
        RETURN_IF_ERROR((detail::LaunchDecode<128, false, true>(kp, b, stream)));
      }
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("head_dim must be 64 or 128, got ", params.shape.head_dim));
  }
  return detail::LaunchMergeSplits(kp, v.num_q, params.shape.head_dim, stream);
}

}  // namespace lazyrag::kernels
