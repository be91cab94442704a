// wgmma (sm_90a warpgroup matrix multiply) PTX wrappers shared by the wgmma prefill kernels
// (lazy_attention_prefill_wgmma.cu, lazy_attention_prefill_ws.cu) and the projections of
// wgmma_gemm.cu. Everything is inside
// LAZYRAG_HAVE_WGMMA: defined for the host pass and for sm_90a device code, where these
// instructions exist; a kernel body compiled for another target must not call them.
#pragma once

#include <cstdint>

namespace lazyrag::kernels::detail {

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
// The "+f" operands d[0][0] .. d[7][3] of the 32 fp32 accumulators of an m64n64 wgmma.
#define LAZYRAG_WGMMA_D32_OPERANDS(d)                                                          \
  "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),    \
      "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]), \
      "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3]), "+f"(d[4][0]), "+f"(d[4][1]), \
      "+f"(d[4][2]), "+f"(d[4][3]), "+f"(d[5][0]), "+f"(d[5][1]), "+f"(d[5][2]), "+f"(d[5][3]), \
      "+f"(d[6][0]), "+f"(d[6][1]), "+f"(d[6][2]), "+f"(d[6][3]), "+f"(d[7][0]), "+f"(d[7][1]), \
      "+f"(d[7][2]), "+f"(d[7][3])
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
      : LAZYRAG_WGMMA_D32_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}

// The 64 fp32 accumulators of an m64n128 wgmma: the register list {%0, ..., %63} of the
// instruction and the matching "+f" operands d[0][0] .. d[15][3].
#define LAZYRAG_WGMMA_D64_REGS                                                  \
  "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "     \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, " \
  "%31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, " \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, " \
  "%61, %62, %63}"
#define LAZYRAG_WGMMA_D64_ROW(d, i) "+f"(d[i][0]), "+f"(d[i][1]), "+f"(d[i][2]), "+f"(d[i][3])
#define LAZYRAG_WGMMA_D64_OPERANDS(d)                                                           \
  LAZYRAG_WGMMA_D64_ROW(d, 0), LAZYRAG_WGMMA_D64_ROW(d, 1), LAZYRAG_WGMMA_D64_ROW(d, 2),        \
      LAZYRAG_WGMMA_D64_ROW(d, 3), LAZYRAG_WGMMA_D64_ROW(d, 4), LAZYRAG_WGMMA_D64_ROW(d, 5),    \
      LAZYRAG_WGMMA_D64_ROW(d, 6), LAZYRAG_WGMMA_D64_ROW(d, 7), LAZYRAG_WGMMA_D64_ROW(d, 8),    \
      LAZYRAG_WGMMA_D64_ROW(d, 9), LAZYRAG_WGMMA_D64_ROW(d, 10), LAZYRAG_WGMMA_D64_ROW(d, 11),  \
      LAZYRAG_WGMMA_D64_ROW(d, 12), LAZYRAG_WGMMA_D64_ROW(d, 13), LAZYRAG_WGMMA_D64_ROW(d, 14), \
      LAZYRAG_WGMMA_D64_ROW(d, 15)

// D[64 x 128] += A[64 x 16] B[16 x 128]: A (bf16) from registers in the mma.sync m16n8k16
// A-fragment layout of each warp's 16 rows, B (bf16) through `desc`, MN-major (transposed), D
// fp32 in the m16n8 C-fragment layout per 8 columns (d[j] = columns 8j..8j+7). scale_d = 0:
// D = A B.
__device__ __forceinline__ void WgmmaM64N128K16Trans(float (&d)[16][4], const uint32_t (&a)[4],
                                                     uint64_t desc, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " LAZYRAG_WGMMA_D64_REGS
      ", "
      "{%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
      : LAZYRAG_WGMMA_D64_OPERANDS(d)
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc), "r"(scale_d));
}
// D[64 x 128] += A[64 x 16] B[16 x 128], both operands K-major in shared memory (128-byte
// swizzle) through descriptors; D fp32 in the m16n8 C-fragment layout per 8 columns.
__device__ __forceinline__ void WgmmaM64N128K16SS(float (&d)[16][4], uint64_t desc_a,
                                                  uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 " LAZYRAG_WGMMA_D64_REGS
      ", "
      "%64, %65, p, 1, 1, 0, 0;\n}\n"
      : LAZYRAG_WGMMA_D64_OPERANDS(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
// D[64 x 32] += A[64 x 16] B[16 x 32], both K-major in shared memory (128-byte swizzle).
__device__ __forceinline__ void WgmmaM64N32K16SS(float (&d)[4][4], uint64_t desc_a,
                                                 uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n32k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15}, "
      "%16, %17, p, 1, 1, 0, 0;\n}\n"
      : "+f"(d[0][0]), "+f"(d[0][1]), "+f"(d[0][2]), "+f"(d[0][3]), "+f"(d[1][0]), "+f"(d[1][1]),
        "+f"(d[1][2]), "+f"(d[1][3]), "+f"(d[2][0]), "+f"(d[2][1]), "+f"(d[2][2]), "+f"(d[2][3]),
        "+f"(d[3][0]), "+f"(d[3][1]), "+f"(d[3][2]), "+f"(d[3][3])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
// D[64 x 64] += A[64 x 16] B[16 x 64], both K-major in shared memory (128-byte swizzle).
__device__ __forceinline__ void WgmmaM64N64K16SS(float (&d)[8][4], uint64_t desc_a,
                                                 uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 "
      "{%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, "
      "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, "
      "%32, %33, p, 1, 1, 0, 0;\n}\n"
      : LAZYRAG_WGMMA_D32_OPERANDS(d)
      : "l"(desc_a), "l"(desc_b), "r"(scale_d));
}
#undef LAZYRAG_WGMMA_D32_OPERANDS
#undef LAZYRAG_WGMMA_D64_OPERANDS
#undef LAZYRAG_WGMMA_D64_ROW
#undef LAZYRAG_WGMMA_D64_REGS
// clang-format on
#endif  // LAZYRAG_HAVE_WGMMA

}  // namespace lazyrag::kernels::detail
