// LAZY prefill attention: query blocks against their request's segments (DESIGN section 2).
//
// Block = 8 warps = 128 packed rows: (query row, group head) pairs of one request and one KV
// head, so every query head of the GQA group shares each K/V tile the block loads (a 32-token
// query block of a group of 4 is one block per KV head: K/V read once), one block per SM.
// Each warp owns 16 packed rows and the whole 64-key tile: S = Q K^T and O += P V with mma.sync
// m16n8k16 (bf16 in, fp32 accumulate), FlashAttention-2 online softmax in registers.
// K/V tiles are gathered per token from the pages with 16-byte cp.async into a swizzled,
// 4-stage shared-memory tile ring. The query is kept un-rotated in shared memory and
// re-rotated into the warp's mma A fragments once per segment (by p - seg_start). Grid:
// (request x KV head x query block, KV split), the splits filling one wave of the SMs (batch
// 1: 8 KV heads x 16 splits); splits are merged by the merge kernel (a merge fused into the
// last split block would put 128 rows x 16 splits of fp32 partials, ~1 MB, through one SM).
// For head dim 128 with the LAZY layout on sm_90a the launcher runs a wgmma kernel instead
// (lazy_attention_prefill_ws.cu or lazy_attention_prefill_wgmma.cu; same grid and splits);
// this kernel serves the other shapes, layouts and devices, and PrefillKernel::kMmaSync forces
// it so that tests can compare it with the wgmma kernels.
#include "common/status.h"
#include "worker/kernels/attention_internal.cuh"
#include "worker/kernels/lazy_attention.h"
#include "worker/kernels/tma_tile_loader.cuh"

namespace lazyrag::kernels {
namespace detail {
namespace {

template <int D>
struct PrefillConfig {
  // 8 warps x 16 rows = 128 packed rows: a 32-token query block of a GQA group of 4 (or 16
  // tokens of a group of 8) shares every K/V tile the block loads, one block per SM.
  static constexpr int kWarps = 8;
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = kWarps * 16;  // packed (query row, head) rows
  static constexpr int kBlockN = 64;           // keys per tile
  static constexpr int kStages = 4;
  static constexpr int kTileBytes = kBlockN * D * 2;
  static constexpr int kQBytes = kBlockM * D * 2;
  // [Q][K stages][V stages][inv_freq D/2][row positions kBlockM][block max position kWarps]
  // [split plan]
  static constexpr int kSmemBytes = kQBytes + 2 * kStages * kTileBytes + (D / 2) * 4 + kBlockM * 4 +
                                    kWarps * 4 + int(sizeof(SplitPlan));
  // One block per multiprocessor: 228 KiB of shared memory, 1 KiB reserved per block.
  static_assert(kSmemBytes + 1024 <= 228 * 1024, "one block per SM");
};

template <int D, bool kRotateKeys>
__device__ __forceinline__ void PrefillBody(const AttentionKernelParams& p, char* smem) {
  using Cfg = PrefillConfig<D>;
  constexpr int kBlockN = Cfg::kBlockN, kStages = Cfg::kStages, kThreads = Cfg::kThreads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int t = lane & 3;
  const SegmentView& v = p.view;
  PdlLaunchDependents();
  PdlWait();

  const PrefillBlock blk = LocatePrefillBlock(p);
  const auto [kvh, b, split, q_begin, nq, qi0, packed_rows] = blk;
  if (qi0 >= nq) return;  // whole block idle (uniform)
  const int group = p.group;

  char* q_smem = smem;
  char* k_smem = smem + Cfg::kQBytes;
  char* v_smem = k_smem + kStages * Cfg::kTileBytes;
  float* freq_smem = reinterpret_cast<float*>(v_smem + kStages * Cfg::kTileBytes);
  int* pos_smem = reinterpret_cast<int*>(freq_smem + D / 2);
  int* max_smem = pos_smem + Cfg::kBlockM;
  SplitPlan* plan = reinterpret_cast<SplitPlan*>(max_smem + Cfg::kWarps);
  const int s_first = v.seg_indptr[b], s_end = v.seg_indptr[b + 1];

  // Row positions and the block's largest position; the raw query tile, whose cp.async group
  // completes with the first K/V tile.
  StoreRowPositions<Cfg::kBlockM>(v, blk, group, tid, pos_smem, max_smem);
  for (int i = tid; i < D / 2; i += kThreads) freq_smem[i] = p.inv_freq[i];
  CopyQueryTile<D, Cfg::kBlockM>(p, blk, q_smem, tid, kThreads);
  __syncthreads();
  if (warp == 0) {
    int max_pos = max_smem[0];
#pragma unroll
    for (int w = 1; w < Cfg::kWarps; ++w) max_pos = max(max_pos, max_smem[w]);
    PlanSplit<kBlockN>(v, s_first, s_end, max_pos, split, p.num_splits, plan, lane);
  }
  __syncthreads();

  TileCursor<kBlockN> cons;
  cons.Init(plan, v);
  TileCursor<kBlockN> prod = cons;
  KvTileLoader<D, kBlockN, kThreads> loader;
  const int64_t token_stride = int64_t(p.num_kv_heads) * D;
  const int head_off = kvh * D;
  {
    // Prologue: the page ids of the first kStages - 1 tiles are fetched together (one round
    // trip, not one per tile), then their copies issued.
    KvTileLoader<D, kBlockN, kThreads> first[kStages - 1];
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      first[st].Prefetch(prod, v, tid);
      if (prod.valid) prod.Next(plan, v);
    }
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      first[st].Issue(k_smem + st * Cfg::kTileBytes, v_smem + st * Cfg::kTileBytes, p.k_cache,
                      p.v_cache, token_stride, head_off, tid);
      CpAsyncCommit();
    }
  }
  loader.Prefetch(prod, v, tid);

  const int r_lo = warp * 16 + (lane >> 2);  // this thread's packed rows: r_lo, r_lo + 8
  const int pos_lo = pos_smem[r_lo], pos_hi = pos_smem[r_lo + 8];

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_lo = kNegInf, m_hi = kNegInf, l_lo = 0.f, l_hi = 0.f;
  uint32_t qf[D / 16][4];
  int q_seg = -1;
  SegScores sc{0, p.scale_log2, 0.f};  // of segment sc_seg
  int sc_seg = -1;
  int stage = 0;

  while (cons.valid) {
    CpAsyncWait<kStages - 2>();
    __syncthreads();  // tile `stage` landed for all; everyone is done with the previous one
    loader.Issue(k_smem + ((stage + kStages - 1) % kStages) * Cfg::kTileBytes,
                 v_smem + ((stage + kStages - 1) % kStages) * Cfg::kTileBytes, p.k_cache, p.v_cache,
                 token_stride, head_off, tid);
    CpAsyncCommit();
    if (prod.valid) prod.Next(plan, v);
    loader.Prefetch(prod, v, tid);

    char* kt = k_smem + stage * Cfg::kTileBytes;
    char* vt = v_smem + stage * Cfg::kTileBytes;
    if constexpr (kRotateKeys) {
      RotateKeyTile<D, kBlockN, kThreads>(kt, cons.start + cons.j, freq_smem, tid);
      __syncthreads();
      if (q_seg < 0) {  // query rotated once, at its absolute position
        BuildRotatedQ<D>(qf, q_smem, r_lo, pos_lo, pos_hi, freq_smem, lane);
        q_seg = 0;
      }
    } else if (cons.s != q_seg) {  // LAZY: re-rotate by p - seg_start once per segment
      BuildRotatedQ<D>(qf, q_smem, r_lo, pos_lo - cons.start, pos_hi - cons.start, freq_smem, lane);
      q_seg = cons.s;
    }

    // S = Q K^T over the 64-key tile.
    float s[kBlockN / 8][4];
#pragma unroll
    for (int i = 0; i < kBlockN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
    const uint32_t kt_addr = SmemAddr(kt), vt_addr = SmemAddr(vt);
#pragma unroll
    for (int kb = 0; kb < D / 16; ++kb) {
#pragma unroll
      for (int np = 0; np < kBlockN / 16; ++np) {
        uint32_t r[4];
        const int row = np * 16 + (lane & 7) + ((lane >> 4) << 3);
        LdMatrixX4(r, kt_addr + TileOffset<D>(row, kb * 2 + ((lane >> 3) & 1)));
        MmaBf16(s[2 * np], qf[kb], r[0], r[1]);
        MmaBf16(s[2 * np + 1], qf[kb], r[2], r[3]);
      }
    }

    // Mask (segment tail, split end, causality) and online softmax in the log2 domain.
    if (cons.s != sc_seg) {
      sc = SegScoresOf(plan, v, cons.s, p.scale_log2);
      sc_seg = cons.s;
    }
    const int lim_lo = min(cons.j_end, pos_lo - cons.start + 1) - cons.j;
    const int lim_hi = min(cons.j_end, pos_hi - cons.start + 1) - cons.j;
    OnlineSoftmaxTile(s, o, sc.skip - cons.j, lim_lo, lim_hi, sc, t, m_lo, m_hi, l_lo, l_hi);

    // O += P V: the S accumulators re-packed as bf16 A fragments.
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      const uint32_t a[4] = {PackBf16(s[2 * kk][0], s[2 * kk][1]),
                             PackBf16(s[2 * kk][2], s[2 * kk][3]),
                             PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                             PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
      const int row = kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3);
#pragma unroll
      for (int dp = 0; dp < D / 16; ++dp) {
        uint32_t r[4];
        LdMatrixX4Trans(r, vt_addr + TileOffset<D>(row, dp * 2 + (lane >> 4)));
        MmaBf16(o[2 * dp], a, r[0], r[1]);
        MmaBf16(o[2 * dp + 1], a, r[2], r[3]);
      }
    }
    cons.Next(plan, v);
    stage = (stage + 1) % kStages;
  }
  CpAsyncWait<0>();  // nothing may land in shared memory after the block exits

  StoreRows<D>(p, o, RowStats{m_lo, m_hi, l_lo, l_hi}, r_lo, qi0, q_begin, nq, packed_rows, kvh,
               split, t);
}

template <int D, bool kRotateKeys>
__global__ void __launch_bounds__(PrefillConfig<D>::kThreads, 1)
    LazyPrefillKernel(const __grid_constant__ AttentionKernelParams p) {
  extern __shared__ __align__(128) char smem[];
  PrefillBody<D, kRotateKeys>(p, smem);
}

template <int D, bool kRotateKeys>
absl::Status LaunchPrefill(const AttentionKernelParams& kp, int blocks, cudaStream_t stream) {
  using Cfg = PrefillConfig<D>;
  auto* kernel = LazyPrefillKernel<D, kRotateKeys>;
  static std::atomic<uint64_t> smem_configured{0};
  return LaunchPdlKernel(kernel, dim3(blocks, kp.num_splits), Cfg::kThreads, Cfg::kSmemBytes,
                         &smem_configured, stream, kp);
}

}  // namespace
}  // namespace detail

namespace {
// Keys per K/V tile of the cp.async wgmma kernel. 128-key tiles halve the per-tile barriers,
// waits and softmax reductions but hold 2 stages instead of 4 and read Q from shared memory;
// with the KV split into many short ranges (few query blocks) the deeper 64-key pipeline is
// faster. Both measured on the H200; see bench/README.md.
int WgmmaKeyTile(const detail::AttentionKernelParams& kp) { return kp.num_splits > 1 ? 64 : 128; }
}  // namespace

bool LazyAttentionPrefillUsesWgmma(const LazyAttentionParams& params) {
  return params.prefill_kernel != PrefillKernel::kMmaSync && params.shape.head_dim == 128 &&
         params.key_layout == KeyLayout::kRotatedLocal && detail::WgmmaPrefillSupported();
}

bool LazyAttentionPrefillUsesWs(const LazyAttentionParams& params) {
  const int ps = params.view.page_size;
  const auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  return LazyAttentionPrefillUsesWgmma(params) && params.num_pages > 0 &&
         (ps == 8 || ps == 16 || ps == 32 || ps == 64) &&
         int64_t(params.num_pages) * ps < (int64_t(1) << 31) && aligned(params.k_cache) &&
         aligned(params.v_cache);
}

absl::Status LazyAttentionPrefill(const LazyAttentionParams& params, cudaStream_t stream) {
  RETURN_IF_ERROR(ValidateLazyAttentionParams(params, /*decode=*/false));
  const SegmentView& v = params.view;
  if (v.num_requests == 0 || v.num_q == 0) return absl::OkStatus();
  const int group = params.shape.num_heads / params.shape.num_kv_heads;
  const int rows_per_block = detail::PrefillConfig<64>::kBlockM / group;
  const int q_blocks = (params.max_q_len + rows_per_block - 1) / rows_per_block;
  const int64_t blocks = int64_t(v.num_requests) * params.shape.num_kv_heads * q_blocks;
  detail::AttentionKernelParams kp;
  RETURN_IF_ERROR(detail::MakeKernelParams(params, static_cast<int>(blocks), /*blocks_per_sm=*/1,
                                           /*min_split_keys=*/256, &kp));
  kp.q_rows_per_block = rows_per_block;
  kp.q_blocks = q_blocks;
  const bool rotate_keys = params.key_layout == KeyLayout::kUnrotated;
  const int b = static_cast<int>(blocks);
  if (LazyAttentionPrefillUsesWs(params)) {
    detail::TmaMaps maps;
    RETURN_IF_ERROR(detail::EncodeKvTmaMaps(params, &maps));
    // Ping-pong where the launch splits the KV (few query blocks), where it measured faster on
    // the H200 (bench/README.md); the plain schedule otherwise.
    kp.ws_pingpong = kp.num_splits > 1 ? 1 : 0;
    RETURN_IF_ERROR(detail::LaunchPrefillWs(kp, maps, b, stream));
    return detail::LaunchMergeSplits(kp, v.num_q, params.shape.head_dim, stream);
  }
  if (LazyAttentionPrefillUsesWgmma(params)) {
    RETURN_IF_ERROR(detail::LaunchPrefillWgmma128(kp, b, WgmmaKeyTile(kp), stream));
    return detail::LaunchMergeSplits(kp, v.num_q, params.shape.head_dim, stream);
  }
  switch (params.shape.head_dim) {
    case 64:
      RETURN_IF_ERROR((rotate_keys ? detail::LaunchPrefill<64, true>(kp, b, stream)
                                   : detail::LaunchPrefill<64, false>(kp, b, stream)));
      break;
    case 128:
      RETURN_IF_ERROR((rotate_keys ? detail::LaunchPrefill<128, true>(kp, b, stream)
                                   : detail::LaunchPrefill<128, false>(kp, b, stream)));
      break;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("head_dim must be 64 or 128, got ", params.shape.head_dim));
  }
  return detail::LaunchMergeSplits(kp, v.num_q, params.shape.head_dim, stream);
}

}  // namespace lazyrag::kernels
