// LAZY decode attention (one query row per request), flash-decoding style.
//
// Block = (request, KV head, KV split), 4 warps. The group's query heads (<= 16) form the 16
// rows of one mma A fragment, so all heads of the group share every K/V byte loaded. K/V
// tiles of 64 keys are gathered from the pages with 16-byte cp.async, 3-4 stages deep (64-96
// KiB in flight per block, two blocks per multiprocessor); each warp takes 16 keys of every
// tile (mma.sync m16n8k16; the tensor cores make the math free next to the bytes) with its
// own online softmax, and the 4 warps' partial results are merged through shared memory at
// the end. Splits (chosen so that the grid fills the GPU) are merged by the merge kernel, or,
// given LazyAttentionParams::merge_counters, by the last split block of each (request, KV head)
// to finish (one kernel per launch instead of two).
// DecodeKernel::kWarpPipes (head dim 128, LAZY layout): each warp gathers only its own 16 keys
// of every tile into its own ring, so the loop needs a __syncwarp instead of a block barrier
// and a warp never waits for the others; same arithmetic in the same order (bit-identical). The
// default where it applies (DecodeKernel::kAuto). With LazyAttentionParams::stable_history it
// also issues the copies of its first tiles below the query's position before the PDL wait.
#include "common/status.h"
#include "worker/kernels/attention_internal.cuh"
#include "worker/kernels/attention_trace.cuh"
#include "worker/kernels/lazy_attention.h"

namespace lazyrag::kernels {
namespace detail {
namespace {

#ifdef LAZYRAG_ATTN_TRACE
__device__ AttentionTrace g_trace;
#endif

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
  static_assert((16 * kMaxKvSplits + 17) * 4 <= 2 * kStages * kTileBytes,
                "MergeSplitsInLastBlock reuses the tiles");
  // [Q][K stages][V stages][inv_freq D/2][split plan][dynamic split's ring of slices]
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kTileBytes + (D / 2) * 4 +
                                    int(sizeof(SplitPlan)) +
                                    kWarps * kStages * int(sizeof(TileCursor<kBlockN>));
};

// The split merge done by the last of a (request, KV head)'s split blocks to finish (a
// counter per (request, KV head) in p.merge_counters, reset by that block): its `group` rows
// are out = sum_s w_s O_s / sum_s w_s, w_s = 2^(lse_s - max lse), read through L2 from every
// split's partial results (this block's own included). `smem` holds >= 16 x kMaxKvSplits + 17
// floats; the caller has written its partial results and may not touch smem afterwards.
template <int D, int kThreads>
__device__ __forceinline__ void MergeSplitsInLastBlock(const AttentionKernelParams& p, int b,
                                                       int kvh, int q_row, char* smem) {
  constexpr int kWarps = kThreads / 32;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  float* w = reinterpret_cast<float*>(smem);  // [16][kMaxKvSplits]
  float* inv_l = w + 16 * kMaxKvSplits;       // [16]
  int* last = reinterpret_cast<int*>(inv_l + 16);
  __threadfence();  // this thread's partial results are visible GPU-wide before the count
  __syncthreads();
  if (tid == 0) {
    int* counter = p.merge_counters + int64_t(b) * p.num_kv_heads + kvh;
    const int done = atomicAdd(counter, 1) + 1;
    *last = done == p.num_splits;
    if (done == p.num_splits) *counter = 0;  // every split has counted: ready for the next launch
  }
  __syncthreads();
  if (*last == 0) return;
  __threadfence();  // the other splits' partial results, counted before ours, are visible

  const int group = p.group, splits = p.num_splits;
  const int64_t rows = int64_t(p.view.num_q) * p.num_heads;
  const int64_t row0 = int64_t(q_row) * p.num_heads + int64_t(kvh) * group;
  for (int r = warp; r < group; r += kWarps) {
    float lse[kMaxKvSplits / 32];
    float m = kNegInf;
#pragma unroll
    for (int i = 0; i < kMaxKvSplits / 32; ++i) {
      const int s = lane + 32 * i;
      lse[i] = s < splits ? __ldcg(p.lse_partial + s * rows + row0 + r) : kNegInf;
      m = fmaxf(m, lse[i]);
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, off));
    float l = 0.f;
#pragma unroll
    for (int i = 0; i < kMaxKvSplits / 32; ++i) {
      const int s = lane + 32 * i;
      const float wt = m == kNegInf ? 0.f : Exp2(lse[i] - m);  // empty split: lse -inf, w 0
      if (s < splits) w[r * kMaxKvSplits + s] = wt;
      l += wt;
    }
#pragma unroll
    for (int off = 16; off > 0; off /= 2) l += __shfl_xor_sync(0xffffffffu, l, off);
    if (lane == 0) inv_l[r] = l > 0.f ? 1.f / l : 0.f;
  }
  __syncthreads();
  for (int idx = tid; idx < group * (D / 4); idx += kThreads) {
    const int r = idx / (D / 4), d = (idx % (D / 4)) * 4;
    const float* src = p.o_partial + (row0 + r) * D + d;
    float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll 16
    for (int s = 0; s < splits; ++s) {
      const float wt = w[r * kMaxKvSplits + s];
      const float4 x = __ldcg(reinterpret_cast<const float4*>(src + s * rows * D));
      acc.x += wt * x.x;
      acc.y += wt * x.y;
      acc.z += wt * x.z;
      acc.w += wt * x.w;
    }
    const float inv = inv_l[r];
    uint2 packed;
    packed.x = PackBf16(acc.x * inv, acc.y * inv);
    packed.y = PackBf16(acc.z * inv, acc.w * inv);
    *reinterpret_cast<uint2*>(p.out + (row0 + r) * D + d) = packed;
  }
}

// Dynamic split (DecodeKernel::kWarpPipesDynamic): every warp of a (request, KV head)'s
// split blocks takes 16-key slices of the request's keys, numbered segment by segment
// (ceil(visible / 16) per segment), first kAhead fixed ones ((k * splits + split) * warps +
// warp, before PdlWait with stable_history), then the next free one from a counter per
// (request, KV head) (atomicAdd after PdlWait; the merge kernel resets it), so a warp that runs
// slower takes fewer slices instead of finishing last. Each lane holds one segment of a
// 32-segment window (start, visible keys, page base, first and end slice); a warp's slices
// only increase, so the window only moves forward.
struct SliceWalker {
  int c, chunk_end;                             // window: segments c .. c + 31
  int start_l, vis_l, pb_l, begin_l, end_l;     // this lane's segment

  __device__ __forceinline__ void Load(const SplitPlan* plan, const SegmentView& v, int base,
                                       int lane) {
    const int s = c + lane;
    start_l = vis_l = pb_l = 0;
    int slices = 0;
    if (s < plan->s_end) {
      const int i = s - plan->s_first;
      if (i < kSegCache) {
        const SegEntry e = plan->seg[i];
        start_l = e.start;
        vis_l = e.vis;
        pb_l = e.page_base;
      } else {
        start_l = v.seg_start[s];
        vis_l = VisibleKeys(start_l, v.seg_len[s], plan->max_pos);
        pb_l = v.page_indptr[s];
      }
      slices = (vis_l + 15) / 16;
    }
    end_l = base + WarpInclusiveScan(slices, lane);
    begin_l = end_l - slices;
    chunk_end = __shfl_sync(0xffffffffu, end_l, 31);
  }
  __device__ __forceinline__ void Init(const SplitPlan* plan, const SegmentView& v, int lane) {
    c = plan->s_first;
    Load(plan, v, 0, lane);
  }
  // Points `cur` (TileCursor fields as the decode loop reads them: s, start, page_base, j =
  // the slice's first key - key0, j_end = the segment's visible keys) at slice g (warp-uniform),
  // or marks it invalid past the request's last slice.
  template <int N>
  __device__ __forceinline__ void Locate(int g, const SplitPlan* plan, const SegmentView& v,
                                         int key0, int lane, TileCursor<N>* cur) {
    while (g >= chunk_end && c + 32 < plan->s_end) {
      c += 32;
      Load(plan, v, chunk_end, lane);
    }
    const unsigned hit = __ballot_sync(0xffffffffu, g < end_l);
    cur->valid = hit != 0;
    if (hit == 0) return;
    const int l = __ffs(hit) - 1;
    cur->s = c + l;
    cur->start = __shfl_sync(0xffffffffu, start_l, l);
    cur->page_base = __shfl_sync(0xffffffffu, pb_l, l);
    cur->j_end = __shfl_sync(0xffffffffu, vis_l, l);
    cur->j = (g - __shfl_sync(0xffffffffu, begin_l, l)) * 16 - key0;
  }
};

template <int D, bool kRotateKeys, bool kWarpPipes, bool kDynamic = false>
__device__ __forceinline__ void DecodeBody(const AttentionKernelParams& p, char* smem) {
  static_assert(!(kRotateKeys && kWarpPipes), "key rotation works on whole tiles");
  static_assert(!kDynamic || kWarpPipes, "dynamic slices are per warp");
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

  char* q_smem = smem;
  char* k_smem = smem + Cfg::kQBytes;
  char* v_smem = k_smem + kStages * Cfg::kTileBytes;
  float* freq_smem = reinterpret_cast<float*>(v_smem + kStages * Cfg::kTileBytes);
  SplitPlan* plan = reinterpret_cast<SplitPlan*>(freq_smem + D / 2);
  // Dynamic split: the slice each stage of each warp's ring holds, written by the warp's lane 0
  // when it issues the copies, read by the warp when it consumes them.
  TileCursor<Cfg::kBlockN>* ring = reinterpret_cast<TileCursor<Cfg::kBlockN>*>(plan + 1);

  LAZYRAG_TRACE_POINT(g_trace, 0);
  PdlLaunchDependents();
  // Three rounds of dependent loads before the first K/V request: (q_indptr, seg_indptr),
  // (q_pos, the request's segment metadata, 32 segments per lane round), the first tiles'
  // page ids. They read only the step's segment view and inv_freq (uploaded or written before
  // the previous kernel started), so they run before PdlWait, overlapping the previous
  // kernel's tail; the query and the K/V bytes (the previous kernels write the step's own
  // rows) are read after it.
  const int q_row = v.q_indptr[b];
  const int s_first = v.seg_indptr[b], s_end = v.seg_indptr[b + 1];
  const int pos = v.q_pos[q_row];
  for (int i = tid; i < D / 2; i += kThreads) freq_smem[i] = p.inv_freq[i];
  if (warp == 0) PlanSplit<kBlockN>(v, s_first, s_end, pos, split, p.num_splits, plan, lane);
  __syncthreads();
  LAZYRAG_TRACE_POINT(g_trace, 2);
  LAZYRAG_TRACE_POINT(g_trace, 3);

  // Tiles in flight ahead of the one being consumed. Block tiles: kStages - 1 (a stage is
  // refilled before the tile in front of it is consumed, right after the block barrier that
  // frees it). Warp pipelines: every stage (a warp refills the stage it has just consumed, after
  // a __syncwarp), so the prologue, and with stable_history the copies before PdlWait, cover
  // the whole ring.
  constexpr int kAhead = kWarpPipes ? kStages : kStages - 1;
  TileCursor<kBlockN> cons;
  const int key0 = warp * 16;  // this warp's keys within every tile
  // Dynamic split: the slices this warp takes (g: fixed ones first, then claimed) and the
  // claim in flight (lane 0's atomicAdd result, read one refill later).
  // Claims are runs of kClaim slices from one of kWarps counters per (request, KV head) (the
  // one of this warp's index: a quarter of the contention), run c of counter w being the
  // (c * kWarps + w)-th run after the fixed slices.
  constexpr int kClaim = 2;
  SliceWalker walker;
  int fixed_left = 0, next_fixed = 0, claim = 0, run_g = 0, run_left = 0;
  int* counter = nullptr;
  const int fixed_stride = p.num_splits * kWarps;
  if constexpr (kDynamic) {
    walker.Init(plan, v, lane);
    next_fixed = split * kWarps + warp;
    fixed_left = kAhead - 1;
    counter = p.claim_counters + (int64_t(b) * p.num_kv_heads + kvh) * kWarps + warp;
    walker.Locate(next_fixed, plan, v, key0, lane, &cons);
  } else {
    cons.Init(plan, v);
  }
  TileCursor<kBlockN> prod = cons;
  // Moves the producer to its next tile (dynamic: its next slice).
  const auto advance = [&]() {
    if constexpr (kDynamic) {
      if (!prod.valid) return;
      int g;
      bool claimed = false;
      if (fixed_left > 0) {
        --fixed_left;
        next_fixed += fixed_stride;
        g = next_fixed;
      } else if (run_left > 0) {
        --run_left;
        g = ++run_g;
      } else {
        // The claim issued a run ago (or after PdlWait for the first).
        const int c = __shfl_sync(0xffffffffu, claim, 0);
        g = run_g = fixed_stride * kAhead + (c * kWarps + warp) * kClaim;
        run_left = kClaim - 1;
        claimed = true;
      }
      walker.Locate(g, plan, v, key0, lane, &prod);
      // The next run's claim, in flight until this run is used up.
      if (claimed && prod.valid && lane == 0) claim = atomicAdd(counter, 1);
    } else {
      if (prod.valid) prod.Next(plan, v);
    }
  };
  // Block tiles: all threads move each 64-key tile. Warp pipelines: each warp moves only its
  // own 16 rows of every tile (the rows it consumes), so it needs no other warp's copies.
  using Loader = KvTileLoader<D, kWarpPipes ? 16 : kBlockN, kWarpPipes ? 32 : kThreads>;
  const int load_tid = kWarpPipes ? lane : tid;
  const int slice = kWarpPipes ? key0 * D * 2 : 0;  // bytes: TileOffset<D>(key0 + r, c)
  const auto prefetch = [&](Loader& l, const TileCursor<kBlockN>& c) {
    TileCursor<kBlockN> w = c;
    if (kWarpPipes) w.j += key0;
    l.Prefetch(w, v, load_tid);
  };
  Loader loader;
  const int64_t token_stride = int64_t(p.num_kv_heads) * D;
  const int head_off = kvh * D;
  {
    // Prologue: the page ids of the first kAhead tiles are fetched together (one round trip,
    // not one per tile), then their copies issued.
    Loader first[kAhead];
    // Warp pipelines with stable_history: the leading prologue stages whose rows (this warp's
    // 16 of the tile) all sit at positions below the query's are copied before PdlWait, in
    // order (one commit group per stage either way).
    int early = 0;
    bool stable = kWarpPipes && p.stable_history != 0;
#pragma unroll
    for (int st = 0; st < kAhead; ++st) {
      prefetch(first[st], prod);
      if (kDynamic && lane == 0) ring[warp * kStages + st] = prod;
      stable = stable && (!prod.valid || prod.start + min(prod.j + key0 + 16, prod.j_end) <= pos);
      if (stable) ++early;
      // Dynamic split: the slice after the fixed ones is claimed after PdlWait (the counter is
      // reset by the merge kernel that precedes this launch).
      if (!kDynamic || st + 1 < kAhead) advance();
    }
    if constexpr (kWarpPipes) {
#pragma unroll
      for (int st = 0; st < kAhead; ++st) {
        if (st < early) {
          first[st].Issue(k_smem + st * Cfg::kTileBytes + slice,
                          v_smem + st * Cfg::kTileBytes + slice, p.k_cache, p.v_cache,
                          token_stride, head_off, load_tid);
          CpAsyncCommit();
        }
      }
    }
    PdlWait();
    LAZYRAG_TRACE_POINT(g_trace, 1);
    if (kDynamic && lane == 0) claim = atomicAdd(counter, 1);
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
    for (int st = 0; st < kAhead; ++st) {
      if (st >= early) {
        first[st].Issue(k_smem + st * Cfg::kTileBytes + slice,
                        v_smem + st * Cfg::kTileBytes + slice, p.k_cache, p.v_cache, token_stride,
                        head_off, load_tid);
        CpAsyncCommit();
      }
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
  if constexpr (kDynamic) {
    advance();
    cons = ring[warp * kStages];
  }
  prefetch(loader, prod);
  LAZYRAG_TRACE_POINT(g_trace, 4);

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_lo = kNegInf, m_hi = kNegInf, l_lo = 0.f, l_hi = 0.f;
  uint32_t qf[D / 16][4];
  int q_seg = -1;
  int stage = 0;

  // Refills `st` with the producer's next tile (one commit group per call, empty or not).
  const auto refill = [&](int st) {
    if (kDynamic && lane == 0) ring[warp * kStages + st] = prod;
    loader.Issue(k_smem + st * Cfg::kTileBytes + slice, v_smem + st * Cfg::kTileBytes + slice,
                 p.k_cache, p.v_cache, token_stride, head_off, load_tid);
    CpAsyncCommit();
    advance();
    prefetch(loader, prod);
  };

  while (cons.valid) {
    CpAsyncWait<kAhead - 1>();
    // Warp pipelines: this warp's copies landed; no other warp is involved.
    if constexpr (kWarpPipes) {
      __syncwarp();
    } else {
      __syncthreads();
    }
#ifdef LAZYRAG_ATTN_TRACE
    if (stage == 0 && q_seg < 0) LAZYRAG_TRACE_POINT(g_trace, 5);
#endif
    // Block tiles: the stage consumed last iteration is free for every thread now.
    if constexpr (!kWarpPipes) refill((stage + kStages - 1) % kStages);

    char* kt = k_smem + stage * Cfg::kTileBytes;
    char* vt = v_smem + stage * Cfg::kTileBytes;
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
      const int row = key0 + (lane & 7) + ((lane >> 4) << 3);
      LdMatrixX4(r, kt_addr + TileOffset<D>(row, kb * 2 + ((lane >> 3) & 1)));
      MmaBf16(s[0], qf[kb], r[0], r[1]);
      MmaBf16(s[1], qf[kb], r[2], r[3]);
    }

    const int lim = min(cons.j_end, pos - cons.start + 1) - cons.j - key0;
    OnlineSoftmaxTile(s, o, lim, lim, p.scale_log2, t, m_lo, m_hi, l_lo, l_hi);
    const uint32_t a[4] = {PackBf16(s[0][0], s[0][1]), PackBf16(s[0][2], s[0][3]),
                           PackBf16(s[1][0], s[1][1]), PackBf16(s[1][2], s[1][3])};
    const int vrow = key0 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
    for (int dp = 0; dp < D / 16; ++dp) {
      uint32_t r[4];
      LdMatrixX4Trans(r, vt_addr + TileOffset<D>(vrow, dp * 2 + (lane >> 4)));
      MmaBf16(o[2 * dp], a, r[0], r[1]);
      MmaBf16(o[2 * dp + 1], a, r[2], r[3]);
    }
    if constexpr (kWarpPipes) {
      __syncwarp();  // every lane's reads of this stage are done
      refill(stage);
    }
    stage = (stage + 1) % kStages;
    if constexpr (kDynamic) {
      cons = ring[warp * kStages + stage];
    } else {
      cons.Next(plan, v);
    }
  }
  CpAsyncWait<0>();
  __syncthreads();  // the tile buffers become the merge buffer
  LAZYRAG_TRACE_POINT(g_trace, 6);

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
  if (p.num_splits > 1 && p.merge_counters != nullptr) {
    MergeSplitsInLastBlock<D, kThreads>(p, b, kvh, q_row, k_smem);
  }
  LAZYRAG_TRACE_POINT(g_trace, 7);
}

template <int D, bool kRotateKeys, bool kWarpPipes, bool kDynamic>
__global__ void __launch_bounds__(DecodeConfig<D>::kThreads, 2)
    LazyDecodeKernel(const __grid_constant__ AttentionKernelParams p) {
  extern __shared__ __align__(128) char smem[];
  DecodeBody<D, kRotateKeys, kWarpPipes, kDynamic>(p, smem);
}

template <int D, bool kRotateKeys, bool kWarpPipes = false, bool kDynamic = false>
absl::Status LaunchDecode(const AttentionKernelParams& kp, int blocks, cudaStream_t stream) {
  using Cfg = DecodeConfig<D>;
  auto* kernel = LazyDecodeKernel<D, kRotateKeys, kWarpPipes, kDynamic>;
  static std::atomic<uint64_t> smem_configured{0};
  return LaunchPdlKernel(kernel, dim3(blocks, kp.num_splits), Cfg::kThreads, Cfg::kSmemBytes,
                         &smem_configured, stream, kp);
}

}  // namespace

#ifdef LAZYRAG_ATTN_TRACE
absl::Status ReadDecodeTrace(int blocks, std::vector<uint64_t>* out) {
  return ReadTraceSymbol(g_trace, blocks, out);
}
#endif
}  // namespace detail

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
  // Dynamic split (head dim 128, LAZY layout; 4 counters per block's (request, KV head)),
  // merged by the merge kernel, which resets the counters; or the static split merged in its
  // last blocks.
  if (kp.num_splits > 1 && params.merge_counters != nullptr) {
    if (params.decode_kernel == DecodeKernel::kWarpPipesDynamic &&
        params.shape.head_dim == 128 && params.key_layout == KeyLayout::kRotatedLocal) {
      if (params.merge_counters_size >= 4 * blocks) kp.claim_counters = params.merge_counters;
    } else if (params.merge_counters_size >= blocks) {
      kp.merge_counters = params.merge_counters;
    }
  }
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
      } else if (kp.claim_counters != nullptr) {
        RETURN_IF_ERROR((detail::LaunchDecode<128, false, true, true>(kp, b, stream)));
      } else if (params.decode_kernel != DecodeKernel::kBlockTiles) {
        RETURN_IF_ERROR((detail::LaunchDecode<128, false, true>(kp, b, stream)));
      } else {
        RETURN_IF_ERROR((detail::LaunchDecode<128, false>(kp, b, stream)));
      }
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("head_dim must be 64 or 128, got ", params.shape.head_dim));
  }
  if (kp.merge_counters != nullptr) return absl::OkStatus();  // merged by the last blocks
  return detail::LaunchMergeSplits(kp, v.num_q, params.shape.head_dim, stream);
}

}  // namespace lazyrag::kernels
