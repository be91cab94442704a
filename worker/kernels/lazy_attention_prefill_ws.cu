// LAZY prefill attention, warp-specialized (FlashAttention-3's structure) on sm_90a: head dim
// 128, keys stored rotated at their segment-local position; the default where
// LazyAttentionPrefillUsesWs. Same work split, grid, split planner, segment walk, masking,
// epilogue and merge as the wgmma kernel (lazy_attention_prefill_wgmma.cu, 128-key tiles);
// what differs is who loads and how the stages advance:
//  * warpgroup 0 is the producer: after setmaxnreg.dec its warp 0 alone walks the tiles and
//    gathers each 128-key K/V tile with the tensor memory accelerator (TmaTileLoader: page
//    boxes of page_size rows x 128 bytes, 128-byte swizzle, landing in the Sw128 layout the
//    descriptors read; ops spread over the 32 lanes), completing on the stage's "full"
//    mbarrier (32 arrivals + the bytes), each tile's page ids loaded a tile ahead (the first
//    before the PDL wait, and with stable_history the first tile's copies too). A segment's
//    last, partial tile goes to a separate mbarrier first; the warp then zeroes V's rows past
//    the valid keys (0 x NaN would poison P V) and only then arrives on "full" (with narrow
//    tails only up to the 32 or 64 keys the consumers then compute over, TileKeys);
//  * warpgroups 1 and 2 are the consumers (setmaxnreg.inc), 64 packed rows each: at a new
//    segment rotate the query rows (before waiting for the tile), wait on "full", S = Q K^T,
//    online softmax, O += P V, then each warp arrives on the stage's "empty" mbarrier (8
//    arrivals), which the producer waits on before refilling it.
// No block-wide barrier inside the loop: the two consumer warpgroups and the producer run
// decoupled, and the consumers issue no load instructions at all.
#include <cudaTypedefs.h>

#include "common/status.h"
#include "worker/kernels/attention_internal.cuh"
#include "worker/kernels/lazy_attention.h"
#include "worker/kernels/tma_tile_loader.cuh"
#include "worker/kernels/wgmma.cuh"
#include "worker/kernels/wgmma_tile.cuh"

namespace lazyrag::kernels::detail {
namespace {

struct WsConfig {
  static constexpr int kD = 128;
  static constexpr int kThreads = 384;  // producer warpgroup + 2 consumer warpgroups
  static constexpr int kBlockM = 128;   // packed rows: 64 per consumer warpgroup
  static constexpr int kBlockN = 128;   // keys per tile
  static constexpr int kStages = 2;
  static constexpr int kTileBytes = kBlockN * kD * 2;  // 32 KiB: two halves of 128 x 128 B
  static constexpr int kQBytes = kBlockM * kD * 2;     // 32 KiB
  static constexpr int kProducerRegs = 56, kConsumerRegs = 224;
  static_assert(128 * kProducerRegs + 256 * kConsumerRegs <= 65536, "register file");
  // [1024-byte alignment slack][K stages][V stages][rotated Q (Sw128)][raw Q][inv_freq D/2]
  // [row positions kBlockM][block max position 4][split plan][8-byte slack]
  // [full mbarriers kStages][empty mbarriers kStages][tail mbarrier]
  static constexpr int kSmemBytes = 1024 + 2 * kStages * kTileBytes + 2 * kQBytes + (kD / 2) * 4 +
                                    kBlockM * 4 + 4 * 4 + int(sizeof(SplitPlan)) + 8 +
                                    (2 * kStages + 1) * 8;
  static_assert(kSmemBytes <= 227 * 1024, "one block per SM");
};

__device__ __forceinline__ void NamedBarrierSync(int id, int threads) {
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
}

// The keys of a tile with `valid` of them that the consumers' products read: with narrow tails
// (AttentionKernelParams::narrow_tail) the smallest wgmma width of 32, 64 or 128 that holds
// them, else the whole tile. Producer and consumers decide alike.
__device__ __forceinline__ int TileKeys(int valid, bool narrow) {
  return !narrow || valid > 64 ? WsConfig::kBlockN : valid > 32 ? 64 : 32;
}

__device__ __forceinline__ void PrefillWsBody(const AttentionKernelParams& p, const TmaMaps& maps,
                                              char* smem_raw) {
#ifdef LAZYRAG_HAVE_WGMMA
  using Cfg = WsConfig;
  constexpr int D = Cfg::kD, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const SegmentView& v = p.view;
  PdlLaunchDependents();

  const PrefillBlock blk = LocatePrefillBlock(p);
  const auto [kvh, b, split, q_begin, nq, qi0, packed_rows] = blk;
  if (qi0 >= nq) return;  // whole block idle (uniform)
  const int group = p.group;

  char* smem = smem_raw + ((1024u - (SmemAddr(smem_raw) & 1023u)) & 1023u);
  char* k_smem = smem;
  char* v_smem = k_smem + kStages * Cfg::kTileBytes;
  char* qrot_smem = v_smem + kStages * Cfg::kTileBytes;  // 1024-byte aligned
  char* q_smem = qrot_smem + Cfg::kQBytes;
  float* freq_smem = reinterpret_cast<float*>(q_smem + Cfg::kQBytes);
  int* pos_smem = reinterpret_cast<int*>(freq_smem + D / 2);
  int* max_smem = pos_smem + Cfg::kBlockM;
  SplitPlan* plan = reinterpret_cast<SplitPlan*>(max_smem + 4);
  const uint32_t full_bar = (SmemAddr(plan + 1) + 7u) & ~7u;  // + 8 stage
  const uint32_t empty_bar = full_bar + 8 * kStages;          // + 8 stage
  const uint32_t tail_bar = empty_bar + 8 * kStages;
  const uint32_t k_base = SmemAddr(k_smem), v_base = SmemAddr(v_smem);
  const int s_first = v.seg_indptr[b], s_end = v.seg_indptr[b + 1];

  // Set-up by the producer warpgroup's 128 threads (idle otherwise): the barriers, the row
  // positions (-1 = padding row: attends nothing) and the block's largest position, inv_freq.
  if (tid == 0) {
    for (int st = 0; st < kStages; ++st) {
      MbarInit(full_bar + 8 * st, 32);
      MbarInit(empty_bar + 8 * st, 8);
    }
    MbarInit(tail_bar, 32);
    MbarInitFence();
  }
  if (tid < Cfg::kBlockM) {
    StoreRowPositions<Cfg::kBlockM>(v, blk, group, tid, pos_smem, max_smem);
  } else if (tid < Cfg::kBlockM + D / 2) {
    freq_smem[tid - Cfg::kBlockM] = p.inv_freq[tid - Cfg::kBlockM];
  }
  __syncthreads();
  if (warp == 0) {
    const int max_pos = max(max(max_smem[0], max_smem[1]), max(max_smem[2], max_smem[3]));
    PlanSplit<kBlockN>(v, s_first, s_end, max_pos, split, p.num_splits, plan, lane);
  }
  __syncthreads();
  TileCursor<kBlockN> cur;
  cur.Init(plan, v);
  // The query and the step's own K/V rows are written by the previous kernels: each role
  // waits for them (PdlWait) only where it first needs them.
  if (warp < 4) {
    // ---- Producer warpgroup. Its page ids come before the wait (the page table is uploaded
    // before the step), those of tile i + 1 right after tile i's copies, so that no page-table
    // round trip sits between a stage coming free and its refill. With stable_history the
    // first tile's copies are issued before the wait where all its keys sit below the
    // request's first query position (LazyAttentionParams::stable_history).
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Cfg::kProducerRegs));
    if (warp != 0) return;
    TmaTileLoader<kBlockN, 32> loader;  // op o of a tile is lane o % 32's
    const uint64_t policy = p.kv_evict_first != 0 ? L2EvictFirstPolicy() : 0;
    loader.Prefetch(cur, v, /*warp=*/lane, /*lane=*/0);
    const bool early = p.stable_history != 0 && cur.valid && cur.j_end - cur.j >= kBlockN &&
                       cur.start + cur.j + kBlockN <= v.q_pos[q_begin];
    const bool narrow = p.narrow_tail != 0;
    if (early) loader.Issue(k_base, v_base, full_bar, maps, kvh, v.page_size, lane, 0, policy);
    PrefetchL2Share(p, lane, /*at_start=*/true);
    PdlWait();
    int tile = 0, tails = 0;
    while (cur.valid) {
      const int st = tile % kStages;
      if (tile >= kStages) MbarWait(empty_bar + 8 * st, uint32_t(tile / kStages - 1) & 1u);
      const int valid_rows = min(kBlockN, cur.j_end - cur.j);
      const int keys = TileKeys(valid_rows, narrow);  // what the consumers read
      const uint32_t kt = k_base + st * Cfg::kTileBytes, vt = v_base + st * Cfg::kTileBytes;
      if (tile == 0 && early) {
        // issued before the wait
      } else if (valid_rows == keys) {
        loader.Issue(kt, vt, full_bar + 8 * st, maps, kvh, v.page_size, lane, 0, policy);
      } else {
        loader.Issue(kt, vt, tail_bar, maps, kvh, v.page_size, lane, 0, policy);
        MbarWait(tail_bar, uint32_t(tails) & 1u);
        ++tails;
        ZeroTileTail<kBlockN, 32>(v_smem + st * Cfg::kTileBytes, valid_rows, lane, keys);
        FenceProxyAsyncShared();
        __syncwarp();
        MbarArrive(full_bar + 8 * st);
      }
      cur.Next(plan, v);
      loader.Prefetch(cur, v, /*warp=*/lane, /*lane=*/0);
      ++tile;
    }
    // Every copy of this block is issued: its share of the next kernel's bytes into L2.
    PrefetchL2Share(p, lane, /*at_start=*/false);
    return;
  }

  // ---- Consumer warpgroups: consumer thread ct, warp cw (0..7), warpgroup wg (0, 1).
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Cfg::kConsumerRegs));
  const int ct = tid - 128, cw = ct / 32, wg = cw / 4, t = lane & 3;
  PdlWait();
  // Raw query tile (TileOffset layout, read by RotateQRowsSw128).
  CopyQueryTile<D, Cfg::kBlockM>(p, blk, q_smem, ct, 256);
  CpAsyncCommit();
  CpAsyncWait<0>();
  NamedBarrierSync(1, 256);  // the consumers' raw Q is complete

  const int r_lo = cw * 16 + (lane >> 2);  // this thread's packed rows: r_lo, r_lo + 8
  const int pos_lo = pos_smem[r_lo], pos_hi = pos_smem[r_lo + 8];
  const uint32_t q_rows = SmemAddr(qrot_smem) + wg * 64 * 128;
  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  RowStats rows;
  // Ping-pong (p.ws_pingpong, FlashAttention-3's inter-warpgroup schedule): the two consumer
  // warpgroups take turns issuing their products (named barriers 4 and 5: the waiting
  // warpgroup's 128 threads + the other's 128 arriving), so one's softmax runs while the
  // other's matrix products have the tensor cores. Warpgroup 1 hands warpgroup 0 the first
  // turn; both walk the same tiles, so the turns alternate to the end.
  const bool pingpong = p.ws_pingpong != 0;
  const auto pass_turn = [&]() {
    if (pingpong) asm volatile("bar.arrive %0, 256;\n" ::"r"(5 - wg) : "memory");
  };
  if (pingpong && wg == 1) pass_turn();
  const bool narrow = p.narrow_tail != 0;
  int q_seg = -1, tile = 0;
  SegScores sc;  // of segment q_seg
  // One tile's S = Q K^T, softmax and O += P V over its first kN keys (TileKeys).
  const auto consume = [&]<int kN>(uint32_t kt, uint32_t vt, int lo, int lim_lo, int lim_hi) {
    float s[kN / 8][4];
    if (pingpong) NamedBarrierSync(4 + wg, 256);  // my turn on the tensor cores
    QkTile<Cfg::kBlockM, kN>(s, q_rows, kt, pass_turn);
    SoftmaxTile<kN>(s, o, lo, lim_lo, lim_hi, sc, t, &rows);
    if (pingpong) NamedBarrierSync(4 + wg, 256);
    PvTile<kN, kBlockN>(o, s, vt, pass_turn);
  };
  while (cur.valid) {
    const int st = tile % kStages;
    if (cur.s != q_seg) {
      // LAZY: re-rotate this warpgroup's rows by p - seg_start once per segment, publish them
      // to the async proxy, wait for the warpgroup alone (its previous products are done);
      // before the wait for the tile, so that the rotation overlaps its copies.
      RotateQRowsSw128<Cfg::kBlockM>(qrot_smem, q_smem, wg * 64, cur.start, pos_smem, freq_smem,
                                     ct % 128);
      FenceProxyAsyncShared();
      NamedBarrierSync(2 + wg, 128);
      sc = SegScoresOf(plan, v, cur.s, p.scale_log2);
      q_seg = cur.s;
    }
    MbarWait(full_bar + 8 * st, uint32_t(tile / kStages) & 1u);
    const uint32_t kt = k_base + st * Cfg::kTileBytes, vt = v_base + st * Cfg::kTileBytes;
    const int lo = sc.skip - cur.j, lim_lo = min(cur.j_end, pos_lo - cur.start + 1) - cur.j,
              lim_hi = min(cur.j_end, pos_hi - cur.start + 1) - cur.j;
    const int keys = TileKeys(min(kBlockN, cur.j_end - cur.j), narrow);
    if (keys == 32) {
      consume.template operator()<32>(kt, vt, lo, lim_lo, lim_hi);
    } else if (keys == 64) {
      consume.template operator()<64>(kt, vt, lo, lim_lo, lim_hi);
    } else {
      consume.template operator()<kBlockN>(kt, vt, lo, lim_lo, lim_hi);
    }
    __syncwarp();
    if (lane == 0) MbarArrive(empty_bar + 8 * st);  // this warp is done with the stage
    cur.Next(plan, v);
    ++tile;
  }
  StoreRows<128>(p, o, rows, r_lo, qi0, q_begin, nq, packed_rows, kvh, split, t);
#else
  // Built for a target without wgmma: the launcher never selects this kernel there.
  (void)p;
  (void)maps;
  (void)smem_raw;
  __trap();
#endif
}

__global__ void __launch_bounds__(WsConfig::kThreads, 1)
    LazyPrefillWsKernel(const __grid_constant__ AttentionKernelParams p,
                        const __grid_constant__ TmaMaps maps) {
  extern __shared__ __align__(1024) char smem[];
  PrefillWsBody(p, maps, smem);
}

}  // namespace

PFN_cuTensorMapEncodeTiled_v12000 TensorMapEncoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault,
                                         &found) != cudaSuccess ||
        found != cudaDriverEntryPointSuccess) {
      (void)cudaGetLastError();
      fn = nullptr;
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  return encode;
}

absl::Status EncodeKvTmaMaps(const LazyAttentionParams& params, TmaMaps* maps, int box_tokens,
                             bool l2_promotion) {
  const PFN_cuTensorMapEncodeTiled_v12000 encode = TensorMapEncoder();
  if (encode == nullptr) return absl::UnavailableError("cuTensorMapEncodeTiled not available");
  const AttentionShape& sh = params.shape;
  const cuuint64_t dims[3] = {cuuint64_t(sh.head_dim), cuuint64_t(sh.num_kv_heads),
                              cuuint64_t(params.num_pages) * cuuint64_t(params.view.page_size)};
  const cuuint64_t strides[2] = {cuuint64_t(sh.head_dim) * 2,
                                 cuuint64_t(sh.num_kv_heads) * sh.head_dim * 2};
  const cuuint32_t box[3] = {64, 1,
                             cuuint32_t(box_tokens > 0 ? box_tokens : params.view.page_size)};
  const cuuint32_t element_strides[3] = {1, 1, 1};
  const std::pair<CUtensorMap*, const uint16_t*> tensors[] = {{&maps->k, params.k_cache},
                                                              {&maps->v, params.v_cache}};
  for (const auto& [map, base] : tensors) {
    const CUresult r =
        encode(map, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 3, const_cast<uint16_t*>(base), dims, strides,
               box, element_strides, CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B,
               l2_promotion ? CU_TENSOR_MAP_L2_PROMOTION_L2_256B : CU_TENSOR_MAP_L2_PROMOTION_NONE,
               CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
    if (r != CUDA_SUCCESS) {
      return absl::InternalError(absl::StrCat("cuTensorMapEncodeTiled failed: ", int(r)));
    }
  }
  return absl::OkStatus();
}

absl::Status LaunchPrefillWs(const AttentionKernelParams& kp, const TmaMaps& maps, int blocks,
                             cudaStream_t stream) {
  static std::atomic<uint64_t> configured{0};
  return LaunchPdlKernel(LazyPrefillWsKernel, dim3(blocks, kp.num_splits), WsConfig::kThreads,
                         WsConfig::kSmemBytes, &configured, stream, kp, maps);
}

}  // namespace lazyrag::kernels::detail
