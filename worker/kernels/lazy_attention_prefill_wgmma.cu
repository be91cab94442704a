// LAZY prefill attention with wgmma (sm_90a), head dim 128, keys stored rotated at their
// segment-local position (KeyLayout::kRotatedLocal). Same work split, grid, split planner,
// segment walk, masking and merge as the mma.sync kernel (lazy_attention_prefill.cu); only the
// two matrix products and the shared-memory layout of the K/V tiles differ.
//
// Block = 2 consumer warpgroups x 64 rows = 128 packed (query row, group head) rows of one
// request and one KV head; warp w owns packed rows 16w..16w+15 as in the mma.sync kernel (the
// wgmma register fragments of a warp's 16 rows are the mma.sync m16n8k16 A and C fragments).
// Two instantiations by keys per K/V tile, kBlockN (the launcher picks, WgmmaKeyTile):
//  * 64: 4-stage ring; the rotated Q lives in registers as the wgmma A operand
//    (BuildRotatedQ once per segment); 202 registers.
//  * 128: 2-stage ring (the same 128 KiB in flight); S needs 64 accumulator registers, so the
//    rotated Q is written once per segment into shared memory in the 128-byte-swizzle layout
//    (RotateQRowsSw128, each warpgroup its own 64 rows behind a named barrier) and read by
//    the S wgmma through a descriptor; half the tiles, hence half the per-tile barriers, waits
//    and softmax row reductions; 249 registers, no spills.
// Per tile, each warpgroup:
//   S[64 x kBlockN] = Q[64 x 128] K^T  wgmma m64n{64,128}k16 x 8, K [kBlockN keys x 128]
//                                      K-major from shared memory (128-byte swizzle) as B;
//   online softmax on the S accumulators (fp32, log2 domain), P rounded to bf16;
//   O[64 x 128] += P V                 wgmma m64n128k16 x kBlockN/16: P as the register A
//                                      operand, V [kBlockN keys x 128] from shared memory as
//                                      B, MN-major (transpose bit).
// K/V tiles are gathered per token with 16-byte cp.async by all 256 threads into the ring in
// exactly the layout the descriptors read (Sw128Offset): two halves of 64 columns each,
// 128-byte rows, 16-byte chunks XOR-swizzled by row % 8; every tile base is 1024-byte
// aligned. No producer warp and no mbarriers: the ring advances on one block barrier per tile,
// as in the mma.sync kernel (cp.async data then crosses to the async proxy through
// fence.proxy.async before that barrier). Each product waits for its wgmma group at once (a
// variant that kept P V in flight into the next tile, branch wip/wgmma-pipelined, was not
// faster); between the per-tile barriers the two warpgroups run independently, so one's
// softmax can overlap the other's matrix work. Launch bounds 256 threads, 1 block per SM.
#include "common/status.h"
#include "worker/kernels/attention_internal.cuh"
#include "worker/kernels/attention_trace.cuh"
#include "worker/kernels/lazy_attention.h"

namespace lazyrag::kernels::detail {
namespace {

#ifdef LAZYRAG_ATTN_TRACE
__device__ AttentionTrace g_trace;
#endif

template <int kBlockN_>
struct WgmmaPrefillConfig {
  static constexpr int kD = 128;
  static constexpr int kWarps = 8;  // two warpgroups
  static constexpr int kThreads = kWarps * 32;
  static constexpr int kBlockM = kWarps * 16;  // packed rows, as PrefillConfig<D>::kBlockM
  static constexpr int kBlockN = kBlockN_;     // keys per tile
  // The same bytes in flight either way: 4 x 64-key or 2 x 128-key K/V tiles (128 KiB).
  static constexpr int kStages = kBlockN == 64 ? 4 : 2;
  static constexpr int kTileBytes = kBlockN * kD * 2;  // two halves of kBlockN x 128 B
  static constexpr int kHalfBytes = kBlockN * 128;
  static constexpr int kQBytes = kBlockM * kD * 2;
  // Where Q K^T reads the rotated query from: 64-key tiles keep it in registers (the wgmma A
  // fragments, 32 registers); 128-key tiles need those registers for S and read it from
  // shared memory (Sw128 layout, rewritten once per segment).
  static constexpr bool kQRegs = kBlockN == 64;
  static constexpr int kQRotBytes = kQRegs ? 0 : kQBytes;
  // [1024-byte alignment slack][K stages][V stages][rotated Q (128-key tiles)][raw Q]
  // [inv_freq D/2][row positions kBlockM][block max position kWarps][split plan]
  static constexpr int kSmemBytes = 1024 + 2 * kStages * kTileBytes + kQRotBytes + kQBytes +
                                    (kD / 2) * 4 + kBlockM * 4 + kWarps * 4 +
                                    int(sizeof(SplitPlan));
  static_assert(kSmemBytes + 1024 <= 228 * 1024, "one block per SM");
};

#if !defined(__CUDA_ARCH__) || defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define LAZYRAG_HAVE_WGMMA 1
#endif

#ifdef LAZYRAG_HAVE_WGMMA
// ---------------------------------------------------------------------------------------
// wgmma PTX wrappers (warpgroup-wide: all 128 threads of the warpgroup, uniform operands).

__device__ __forceinline__ void WgmmaFence() {
  asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void WgmmaCommit() {
  asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
template <int N>
__device__ __forceinline__ void WgmmaWait() {
  asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Generic-proxy writes to shared memory (cp.async included) made visible to the async proxy
// (wgmma operand reads); each writing thread, before the barrier that publishes them.
__device__ __forceinline__ void FenceProxyAsyncShared() {
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
// Keeps the compiler from moving reads or writes of wgmma accumulators across the
// wgmma.wait / wgmma.fence around them (the asm statements are volatile, hence ordered).
template <int N>
__device__ __forceinline__ void FenceAccumulators(float (&d)[N][4]) {
#pragma unroll
  for (int i = 0; i < N; ++i) {
#pragma unroll
    for (int e = 0; e < 4; ++e) asm volatile("" : "+f"(d[i][e])::"memory");
  }
}

// Shared-memory matrix descriptor of a 128-byte-swizzled operand (layout type 1 in bits
// 62-63), start address `addr` (bytes, shared window), leading-dimension byte offset `lbo`
// (MN-major: stride between 64-element column blocks; ignored for K-major swizzled), stride
// byte offset 1024 (between groups of 8 rows).
__device__ __forceinline__ uint64_t Sw128Desc(uint32_t addr, uint32_t lbo) {
  return uint64_t((addr & 0x3ffffu) >> 4) | (uint64_t((lbo >> 4) & 0x3fffu) << 16) |
         (uint64_t(1024 >> 4) << 32) | (uint64_t(1) << 62);
}

// clang-format off (one line per 8 accumulator columns)
// D[64 x 64] += A[64 x 16] B[16 x 64]: A (bf16) from registers in the mma.sync m16n8k16
// A-fragment layout of each warp's 16 rows, B (bf16) through `desc`, K-major, D fp32 in
// the m16n8 C-fragment layout per 8 columns (d[j] = columns 8j..8j+7). scale_d = 0: D = A B.
__device__ __forceinline__ void WgmmaM64N64K16(float (&d)[8][4], const uint32_t (&a)[4],
                                               uint64_t desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31}, "
      "{%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}

// D[64 x 128] += A[64 x 16] B[16 x 128]: A (bf16) from registers in the mma.sync m16n8k16
// A-fragment layout of each warp's 16 rows, B (bf16) through `desc`, MN-major (transposed), D
// fp32 in the m16n8 C-fragment layout per 8 columns (d[j] = columns 8j..8j+7). scale_d = 0:
// D = A B.
__device__ __forceinline__ void WgmmaM64N128K16Trans(float (&d)[16][4], const uint32_t (&a)[4],
                                                     uint64_t desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63}, "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]), "+f"(d[10][1]),
        "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]), "+f"(d[11][2]),
        "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]), "+f"(d[12][3]),
        "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]), "+f"(d[14][0]),
        "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]), "+f"(d[15][1]),
        "+f"(d[15][2]), "+f"(d[15][3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}
// D[64 x 128] += A[64 x 16] B[16 x 128], both operands K-major in shared memory (128-byte
// swizzle) through descriptors; D fp32 in the m16n8 C-fragment layout per 8 columns.
__device__ __forceinline__ void WgmmaM64N128K16SS(float (&d)[16][4], uint64_t desc_a, uint64_t desc_b,
                                                        int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 "
      "{"
      "%0, %1, %2, %3, %4, %5, %6, %7, "
      "%8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, "
      "%24, %25, %26, %27, %28, %29, %30, %31, "
      "%32, %33, %34, %35, %36, %37, %38, %39, "
      "%40, %41, %42, %43, %44, %45, %46, %47, "
      "%48, %49, %50, %51, %52, %53, %54, %55, "
      "%56, %57, %58, %59, %60, %61, %62, %63"
      "}, "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]),
        "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]),
        "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]),
        "+f"(d[7][2]), "+f"(d[7][3]), "+f"(d[8][0]), "+f"(d[8][1]), "+f"(d[8][2]), "+f"(d[8][3]),
        "+f"(d[9][0]), "+f"(d[9][1]), "+f"(d[9][2]), "+f"(d[9][3]), "+f"(d[10][0]),
        "+f"(d[10][1]), "+f"(d[10][2]), "+f"(d[10][3]), "+f"(d[11][0]), "+f"(d[11][1]),
        "+f"(d[11][2]), "+f"(d[11][3]), "+f"(d[12][0]), "+f"(d[12][1]), "+f"(d[12][2]),
        "+f"(d[12][3]), "+f"(d[13][0]), "+f"(d[13][1]), "+f"(d[13][2]), "+f"(d[13][3]),
        "+f"(d[14][0]), "+f"(d[14][1]), "+f"(d[14][2]), "+f"(d[14][3]), "+f"(d[15][0]),
        "+f"(d[15][1]), "+f"(d[15][2]), "+f"(d[15][3])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
// clang-format on
#endif  // LAZYRAG_HAVE_WGMMA

// Rotates packed query rows row0 .. row0 + 63 of the raw tile at q_smem (TileOffset layout)
// by RoPE to position pos_smem[row] - seg_start and stores them as bf16 at rot_smem in the
// Sw128 layout of a kRows-row operand (the wgmma A operand of Q K^T). The 128 threads of one
// warpgroup (wt = thread index within it), 16-byte chunk pairs (c, c + 8): the same products
// and roundings as BuildRotatedQ.
template <int kRows>
__device__ __forceinline__ void RotateQRowsSw128(char* rot_smem, const char* q_smem, int row0,
                                                 int seg_start, const int* pos_smem,
                                                 const float* inv_freq_smem, int wt) {
  constexpr int D = 128, kPairs = D / 16;
#pragma unroll
  for (int it = wt; it < 64 * kPairs; it += 128) {
    const int row = row0 + it / kPairs, cp = it % kPairs;
    uint4 lo = *reinterpret_cast<const uint4*>(q_smem + TileOffset<D>(row, cp));
    uint4 hi = *reinterpret_cast<const uint4*>(q_smem + TileOffset<D>(row, cp + kPairs));
    uint32_t* lw = reinterpret_cast<uint32_t*>(&lo);
    uint32_t* hw = reinterpret_cast<uint32_t*>(&hi);
    const int pos = pos_smem[row] - seg_start;
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const float2 x0 = UnpackBf16(lw[e]), x1 = UnpackBf16(hw[e]);
      float s0, c0, s1, c1;
      RopeSinCos(pos, inv_freq_smem[cp * 8 + 2 * e], &s0, &c0);
      RopeSinCos(pos, inv_freq_smem[cp * 8 + 2 * e + 1], &s1, &c1);
      lw[e] = PackBf16(x0.x * c0 - x1.x * s0, x0.y * c1 - x1.y * s1);
      hw[e] = PackBf16(x1.x * c0 + x0.x * s0, x1.y * c1 + x0.y * s1);
    }
    *reinterpret_cast<uint4*>(rot_smem + Sw128Offset<kRows>(row, cp)) = lo;
    *reinterpret_cast<uint4*>(rot_smem + Sw128Offset<kRows>(row, cp + kPairs)) = hi;
  }
}

template <int kBlockN_>
__device__ __forceinline__ void PrefillWgmmaBody(const AttentionKernelParams& p, char* smem_raw) {
#ifdef LAZYRAG_HAVE_WGMMA
  using Cfg = WgmmaPrefillConfig<kBlockN_>;
  constexpr int D = Cfg::kD, kBlockN = Cfg::kBlockN, kStages = Cfg::kStages;
  constexpr int kThreads = Cfg::kThreads;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int t = lane & 3;
  const SegmentView& v = p.view;
  LAZYRAG_TRACE_POINT(g_trace, 0);
  PdlLaunchDependents();
  // Everything up to the first K/V page ids reads only the step's segment view and inv_freq
  // (uploaded or written before the previous kernel started), so it runs before PdlWait,
  // overlapping the previous kernel's tail; the query and the K/V bytes (the previous kernels
  // write the step's own rows) are read after it.

  int bid = blockIdx.x;
  const int qblock = bid % p.q_blocks;
  bid /= p.q_blocks;
  const int kvh = bid % p.num_kv_heads;
  const int b = bid / p.num_kv_heads;
  const int split = blockIdx.y;
  const int q_begin = v.q_indptr[b];
  const int nq = v.q_indptr[b + 1] - q_begin;
  const int qi0 = qblock * p.q_rows_per_block;
  if (qi0 >= nq) return;  // whole block idle (uniform)
  const int group = p.group, H = p.num_heads;
  const int packed_rows = p.q_rows_per_block * group;

  char* smem = smem_raw + ((1024u - (SmemAddr(smem_raw) & 1023u)) & 1023u);
  char* k_smem = smem;
  char* v_smem = k_smem + kStages * Cfg::kTileBytes;
  char* qrot_smem = v_smem + kStages * Cfg::kTileBytes;  // 1024-byte aligned
  char* q_smem = qrot_smem + Cfg::kQRotBytes;
  float* freq_smem = reinterpret_cast<float*>(q_smem + Cfg::kQBytes);
  int* pos_smem = reinterpret_cast<int*>(freq_smem + D / 2);
  int* max_smem = pos_smem + Cfg::kBlockM;
  SplitPlan* plan = reinterpret_cast<SplitPlan*>(max_smem + Cfg::kWarps);
  const int s_first = v.seg_indptr[b], s_end = v.seg_indptr[b + 1];

  // Row positions (-1 = padding row: attends nothing) and the block's largest position.
  int my_max = -1;
  if (tid < Cfg::kBlockM) {
    const int qi = qi0 + tid / group;
    const bool ok = tid < packed_rows && qi < nq;
    const int pos = ok ? v.q_pos[q_begin + qi] : -1;
    pos_smem[tid] = pos;
    my_max = pos;
  }
  for (int i = tid; i < D / 2; i += kThreads) freq_smem[i] = p.inv_freq[i];
#pragma unroll
  for (int off = 16; off > 0; off /= 2)
    my_max = max(my_max, __shfl_xor_sync(0xffffffffu, my_max, off));
  if (lane == 0) max_smem[warp] = my_max;
  __syncthreads();
  LAZYRAG_TRACE_POINT(g_trace, 2);
  if (warp == 0) {
    int max_pos = max_smem[0];
#pragma unroll
    for (int w = 1; w < Cfg::kWarps; ++w) max_pos = max(max_pos, max_smem[w]);
    PlanSplit<kBlockN>(v, s_first, s_end, max_pos, split, p.num_splits, plan, lane);
  }
  __syncthreads();
  LAZYRAG_TRACE_POINT(g_trace, 3);

  using Loader = KvTileLoader<D, kBlockN, kThreads, /*kSw128=*/true>;
  TileCursor<kBlockN> cons;
  cons.Init(plan, v);
  TileCursor<kBlockN> prod = cons;
  Loader loader;
  const int64_t token_stride = int64_t(p.num_kv_heads) * D;
  const int head_off = kvh * D;
  {
    Loader first[kStages - 1];
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      first[st].Prefetch(prod, v, tid);
      if (prod.valid) prod.Next(plan, v);
    }
    PdlWait();
    LAZYRAG_TRACE_POINT(g_trace, 1);
    // Raw query tile (TileOffset layout, read by BuildRotatedQ); its cp.async group completes
    // with the first K/V tile.
    for (int it = tid; it < Cfg::kBlockM * (D / 8); it += kThreads) {
      const int row = it / (D / 8), chunk = it % (D / 8);
      const int qi = qi0 + row / group;
      const bool ok = row < packed_rows && qi < nq;
      const __nv_bfloat16* src =
          ok ? p.q + (int64_t(q_begin + qi) * H + kvh * group + row % group) * D + chunk * 8
             : p.q;
      CpAsync16(SmemAddr(q_smem) + TileOffset<D>(row, chunk), src, ok);
    }
#pragma unroll
    for (int st = 0; st < kStages - 1; ++st) {
      first[st].Issue(k_smem + st * Cfg::kTileBytes, v_smem + st * Cfg::kTileBytes, p.k_cache,
                      p.v_cache, token_stride, head_off, tid);
      CpAsyncCommit();
    }
  }
  loader.Prefetch(prod, v, tid);
  LAZYRAG_TRACE_POINT(g_trace, 4);

  const int r_lo = warp * 16 + (lane >> 2);  // this thread's packed rows: r_lo, r_lo + 8
  const int pos_lo = pos_smem[r_lo], pos_hi = pos_smem[r_lo + 8];

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float s[kBlockN / 8][4];
#pragma unroll
  for (int i = 0; i < kBlockN / 8; ++i) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
  float m_lo = kNegInf, m_hi = kNegInf, l_lo = 0.f, l_hi = 0.f;
  uint32_t qf[Cfg::kQRegs ? D / 16 : 1][4];  // rotated Q fragments (64-key tiles)
  int q_seg = -1;
  const int wg = warp / 4;  // this thread's warpgroup: packed rows 64 wg .. 64 wg + 63
  int stage = 0;
  const uint32_t k_base = SmemAddr(k_smem), v_base = SmemAddr(v_smem);
  const uint32_t q_base = SmemAddr(qrot_smem);

  while (cons.valid) {
    CpAsyncWait<kStages - 2>();
    FenceProxyAsyncShared();  // this thread's landed cp.async bytes, for the wgmma reads
    __syncthreads();          // tile `stage` landed for all; everyone is done with the previous one
#ifdef LAZYRAG_ATTN_TRACE
    if (q_seg < 0) LAZYRAG_TRACE_POINT(g_trace, 5);
#endif
    loader.Issue(k_smem + ((stage + kStages - 1) % kStages) * Cfg::kTileBytes,
                 v_smem + ((stage + kStages - 1) % kStages) * Cfg::kTileBytes, p.k_cache, p.v_cache,
                 token_stride, head_off, tid);
    CpAsyncCommit();
    if (prod.valid) prod.Next(plan, v);
    loader.Prefetch(prod, v, tid);

    if (cons.s != q_seg) {  // LAZY: re-rotate by p - seg_start once per segment
      if constexpr (Cfg::kQRegs) {
        BuildRotatedQ<D>(qf, q_smem, r_lo, pos_lo - cons.start, pos_hi - cons.start, freq_smem,
                         lane);
      } else {
        // The warpgroup's wgmma reads only its own 64 rows: rotate them, publish them to the
        // async proxy, and wait for the warpgroup alone (named barrier 1 + wg). The previous
        // segment's products that read these rows have completed (wgmma.wait_group 0).
        RotateQRowsSw128<Cfg::kBlockM>(qrot_smem, q_smem, wg * 64, cons.start, pos_smem,
                                       freq_smem, tid % 128);
        FenceProxyAsyncShared();
        asm volatile("bar.sync %0, 128;\n" ::"r"(1 + wg) : "memory");
      }
      q_seg = cons.s;
    }

    // S = Q K^T over the tile: k-step kk reads columns 16kk..16kk+15 of every query and key
    // row, 32 bytes at (kk % 4) * 32 of column half kk / 4 (both operands K-major, Sw128).
    const uint32_t kt = k_base + stage * Cfg::kTileBytes;
    const uint32_t vt = v_base + stage * Cfg::kTileBytes;
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk) {
      const uint64_t kd = Sw128Desc(kt + (kk / 4) * Cfg::kHalfBytes + (kk % 4) * 32, 16);
      if constexpr (Cfg::kQRegs) {
        WgmmaM64N64K16(s, qf[kk], kd, kk > 0 ? 1 : 0);
      } else {
        const uint64_t qd = Sw128Desc(
            q_base + (kk / 4) * (Cfg::kBlockM * 128) + wg * 64 * 128 + (kk % 4) * 32, 16);
        WgmmaM64N128K16SS(s, qd, kd, kk > 0 ? 1 : 0);
      }
    }
    WgmmaCommit();
    WgmmaWait<0>();
    FenceAccumulators(s);

    // Mask (segment tail, split end, causality) and online softmax in the log2 domain. The
    // loop is bound by instruction latency (two warps per scheduler), so the common cases
    // are kept short: tiles whose 64 keys are all visible to the warp's rows skip the mask,
    // the scale is folded into the exponent (max of the raw scores times scale_log2 > 0, which
    // ValidateLazyAttentionParams requires, then exp2(fma(s, scale, -max))), and O is rescaled
    // only when some row's running maximum moved.
    const int lim_lo = min(cons.j_end, pos_lo - cons.start + 1) - cons.j;
    const int lim_hi = min(cons.j_end, pos_hi - cons.start + 1) - cons.j;
    float mx_lo = kNegInf, mx_hi = kNegInf;
    if (__all_sync(0xffffffffu, lim_lo >= kBlockN && lim_hi >= kBlockN)) {
#pragma unroll
      for (int nb = 0; nb < kBlockN / 8; ++nb) {
        mx_lo = fmaxf(mx_lo, fmaxf(s[nb][0], s[nb][1]));
        mx_hi = fmaxf(mx_hi, fmaxf(s[nb][2], s[nb][3]));
      }
    } else {
#pragma unroll
      for (int nb = 0; nb < kBlockN / 8; ++nb) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = nb * 8 + 2 * t + e;
          s[nb][e] = key < lim_lo ? s[nb][e] : kNegInf;
          s[nb][2 + e] = key < lim_hi ? s[nb][2 + e] : kNegInf;
          mx_lo = fmaxf(mx_lo, s[nb][e]);
          mx_hi = fmaxf(mx_hi, s[nb][2 + e]);
        }
      }
    }
#pragma unroll
    for (int off = 1; off <= 2; off *= 2) {
      mx_lo = fmaxf(mx_lo, __shfl_xor_sync(0xffffffffu, mx_lo, off));
      mx_hi = fmaxf(mx_hi, __shfl_xor_sync(0xffffffffu, mx_hi, off));
    }
    const float scale = p.scale_log2;
    const float new_lo = fmaxf(m_lo, mx_lo * scale), new_hi = fmaxf(m_hi, mx_hi * scale);
    const float use_lo = new_lo == kNegInf ? 0.f : new_lo;
    const float use_hi = new_hi == kNegInf ? 0.f : new_hi;
    const float alpha_lo = Exp2(m_lo - use_lo), alpha_hi = Exp2(m_hi - use_hi);
    m_lo = new_lo;
    m_hi = new_hi;
    float sum_lo = 0.f, sum_hi = 0.f;
#pragma unroll
    for (int nb = 0; nb < kBlockN / 8; ++nb) {
      s[nb][0] = Exp2(fmaf(s[nb][0], scale, -use_lo));
      s[nb][1] = Exp2(fmaf(s[nb][1], scale, -use_lo));
      s[nb][2] = Exp2(fmaf(s[nb][2], scale, -use_hi));
      s[nb][3] = Exp2(fmaf(s[nb][3], scale, -use_hi));
      sum_lo += s[nb][0] + s[nb][1];
      sum_hi += s[nb][2] + s[nb][3];
    }
    l_lo = l_lo * alpha_lo + sum_lo;
    l_hi = l_hi * alpha_hi + sum_hi;
    if (!__all_sync(0xffffffffu, alpha_lo == 1.f && alpha_hi == 1.f)) {
#pragma unroll
      for (int db = 0; db < D / 8; ++db) {
        o[db][0] *= alpha_lo;
        o[db][1] *= alpha_lo;
        o[db][2] *= alpha_hi;
        o[db][3] *= alpha_hi;
      }
    }

    // O += P V: P (the S accumulators as bf16) is the A fragment of k-step kk (keys
    // 16kk..16kk+15); V's k-step is two 8-key row groups (2 KiB) further on, its 128 columns
    // two 64-column halves kHalfBytes apart (the leading-dimension offset).
    uint32_t pa[kBlockN / 16][4];
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      pa[kk][0] = PackBf16(s[2 * kk][0], s[2 * kk][1]);
      pa[kk][1] = PackBf16(s[2 * kk][2], s[2 * kk][3]);
      pa[kk][2] = PackBf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[kk][3] = PackBf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
    FenceAccumulators(o);
    WgmmaFence();
#pragma unroll
    for (int kk = 0; kk < kBlockN / 16; ++kk) {
      WgmmaM64N128K16Trans(o, pa[kk], Sw128Desc(vt + kk * 16 * 128, Cfg::kHalfBytes), 1);
    }
    WgmmaCommit();
    WgmmaWait<0>();
    FenceAccumulators(o);
    cons.Next(plan, v);
    stage = (stage + 1) % kStages;
  }
  CpAsyncWait<0>();  // nothing may land in shared memory after the block exits
  LAZYRAG_TRACE_POINT(g_trace, 6);

  // Finalize: row sums across the quad, then the output (or this split's partial result).
#pragma unroll
  for (int off = 1; off <= 2; off *= 2) {
    l_lo += __shfl_xor_sync(0xffffffffu, l_lo, off);
    l_hi += __shfl_xor_sync(0xffffffffu, l_hi, off);
  }
#pragma unroll
  for (int hi = 0; hi < 2; ++hi) {
    const int r = r_lo + hi * 8;
    const int qi = qi0 + r / group;
    if (r >= packed_rows || qi >= nq) continue;
    const int64_t row_head = int64_t(q_begin + qi) * H + kvh * group + r % group;
    const float l = hi ? l_hi : l_lo;
    const float m = hi ? m_hi : m_lo;
    const float inv = l > 0.f ? 1.f / l : 0.f;
    if (p.num_splits == 1) {
      __nv_bfloat16* dst = p.out + row_head * D + 2 * t;
#pragma unroll
      for (int db = 0; db < D / 8; ++db) {
        *reinterpret_cast<uint32_t*>(dst + db * 8) =
            PackBf16(o[db][2 * hi] * inv, o[db][2 * hi + 1] * inv);
      }
    } else {
      const int64_t rows = int64_t(v.num_q) * H;
      float* dst = p.o_partial + (split * rows + row_head) * D + 2 * t;
#pragma unroll
      for (int db = 0; db < D / 8; ++db) {
        *reinterpret_cast<float2*>(dst + db * 8) =
            make_float2(o[db][2 * hi] * inv, o[db][2 * hi + 1] * inv);
      }
      if (t == 0) p.lse_partial[split * rows + row_head] = l > 0.f ? m + __log2f(l) : kNegInf;
    }
  }
  LAZYRAG_TRACE_POINT(g_trace, 7);
#else
  // Built for a target without wgmma: the launcher never selects this kernel there
  // (WgmmaPrefillSupported), so reaching this is a bug.
  (void)p;
  (void)smem_raw;
  __trap();
#endif
}

template <int kBlockN>
__global__ void __launch_bounds__(WgmmaPrefillConfig<kBlockN>::kThreads, 1)
    LazyPrefillWgmmaKernel(const __grid_constant__ AttentionKernelParams p) {
  extern __shared__ __align__(1024) char smem[];
  PrefillWgmmaBody<kBlockN>(p, smem);
}

}  // namespace

bool WgmmaPrefillSupported() {
  constexpr int kMaxDevices = 64;
  // 0 unknown, 1 yes, 2 no; benign race: every writer stores the same value.
  static std::atomic<int> cached[kMaxDevices] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return false;
  if (dev >= 0 && dev < kMaxDevices) {
    const int c = cached[dev].load(std::memory_order_relaxed);
    if (c != 0) return c == 1;
  }
  int major = 0, minor = 0;
  cudaFuncAttributes attr = {};
  bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
            cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
            major == 9 && minor == 0 &&
            cudaFuncGetAttributes(&attr, LazyPrefillWgmmaKernel<128>) == cudaSuccess &&
            attr.binaryVersion == 90;
  if (!ok) (void)cudaGetLastError();  // clear a failed attribute query
  if (dev >= 0 && dev < kMaxDevices) cached[dev].store(ok ? 1 : 2, std::memory_order_relaxed);
  return ok;
}

absl::Status LaunchPrefillWgmma128(const AttentionKernelParams& kp, int blocks, int key_tile,
                                   cudaStream_t stream) {
  auto launch = [&](auto kernel, int threads, int smem_bytes,
                    std::atomic<uint64_t>* configured) -> absl::Status {
    RETURN_IF_ERROR(
        SetSmemLimitOnce(reinterpret_cast<const void*>(kernel), smem_bytes, configured));
    return LaunchAttentionKernel(kernel, dim3(blocks, kp.num_splits), threads, smem_bytes, kp,
                                 stream);
  };
  if (key_tile == 64) {
    using Cfg = WgmmaPrefillConfig<64>;
    static std::atomic<uint64_t> configured{0};
    return launch(LazyPrefillWgmmaKernel<64>, Cfg::kThreads, Cfg::kSmemBytes, &configured);
  }
  using Cfg = WgmmaPrefillConfig<128>;
  static std::atomic<uint64_t> configured{0};
  return launch(LazyPrefillWgmmaKernel<128>, Cfg::kThreads, Cfg::kSmemBytes, &configured);
}

#ifdef LAZYRAG_ATTN_TRACE
absl::Status ReadPrefillWgmmaTrace(int blocks, std::vector<uint64_t>* out) {
  return ReadTraceSymbol(g_trace, blocks, out);
}
#endif

}  // namespace lazyrag::kernels::detail
