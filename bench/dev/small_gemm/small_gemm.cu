// SmallGemm's launcher (small_gemm.h): the default configuration of each row bucket, the occupancy
// it plans with, and the dispatch. The kernel and its plan: small_gemm.cuh.
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>

#include "absl/strings/str_cat.h"
#include "bench/dev/small_gemm/small_gemm.cuh"
#include "bench/dev/small_gemm/small_gemm.h"
#include "worker/kernels/cuda_check.h"

namespace lazyrag::kernels {
namespace {

using small_gemm_internal::LaunchSmallGemmKernel;
using small_gemm_internal::PlanSmallGemm;
using small_gemm_internal::SmallGemmKernel;

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
static_assert(kSmallGemmSwiGluMultiple == 8 * kWarps, "half a tile of gate rows");
constexpr int kMaxDevices = 64;
// Weight chunks in flight per warp, and resident blocks per SM the registers are sized for: bucket
// 64 holds 32 accumulators and two chunks of x for 8 token tiles per thread, so it runs one block
// per SM and a deeper queue.
template <int kBucket>
constexpr int kDepth = kBucket == 8 || kBucket == 64 ? 8 : 4;
template <int kBucket>
constexpr int kBlocksPerSm = kBucket == 64 ? 1 : 2;
template <int kBucket>
constexpr auto kKernel =
    SmallGemmKernel<kBucket, kWarps, kDepth<kBucket>, true, kBlocksPerSm<kBucket>>;

constexpr int kBuckets[] = {8, 16, 32, 64};
constexpr int kNumBuckets = 4;

int BucketIndex(int rows) {
  for (int i = 0; i < kNumBuckets; ++i) {
    if (rows <= kBuckets[i]) return i;
  }
  return -1;
}

const void* KernelFor(int bucket_index) {
  switch (bucket_index) {
    case 0:
      return reinterpret_cast<const void*>(kKernel<8>);
    case 1:
      return reinterpret_cast<const void*>(kKernel<16>);
    case 2:
      return reinterpret_cast<const void*>(kKernel<32>);
    case 3:
      return reinterpret_cast<const void*>(kKernel<64>);
    default:
      return nullptr;
  }
}

// Resident blocks of each bucket's kernel on each device (0: not queried yet).
std::atomic<int> g_slots[kMaxDevices][kNumBuckets];

absl::Status QuerySlots(int device) {
  int sms = 0;
  LAZYRAG_RETURN_IF_CUDA_ERROR(
      cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  for (int b = 0; b < kNumBuckets; ++b) {
    int per_sm = 0;
    LAZYRAG_RETURN_IF_CUDA_ERROR(
        cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, KernelFor(b), kThreads, 0));
    g_slots[device][b].store(std::max(1, per_sm * sms), std::memory_order_relaxed);
  }
  return absl::OkStatus();
}

absl::StatusOr<int> Slots(int bucket_index) {
  int device = 0;
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) {
    return absl::InternalError(absl::StrCat("small gemm: device ", device, " out of range"));
  }
  int slots = g_slots[device][bucket_index].load(std::memory_order_relaxed);
  if (slots == 0) {
    RETURN_IF_ERROR(QuerySlots(device));
    slots = g_slots[device][bucket_index].load(std::memory_order_relaxed);
  }
  return slots;
}

template <int kBucket>
absl::Status LaunchBucket(const SmallGemmParams& p, int slots, cudaStream_t stream) {
  return LaunchSmallGemmKernel(kKernel<kBucket>, PlanSmallGemm(p, kWarps, kBucket, slots), kThreads,
                               slots, p.programmatic, stream);
}

}  // namespace

absl::Status CheckSmallGemmShape(int rows, int n, int k, SmallGemmEpilogue epilogue) {
  if (rows < 0 || rows > kSmallGemmMaxRows) {
    return absl::InvalidArgumentError(
        absl::StrCat("small gemm: rows ", rows, " outside 0..", kSmallGemmMaxRows));
  }
  if (n <= 0 || k <= 0 || k % kSmallGemmKMultiple != 0) {
    return absl::InvalidArgumentError(absl::StrCat("small gemm: n ", n, ", k ", k,
                                                   ": need n > 0 and k a positive multiple of ",
                                                   kSmallGemmKMultiple));
  }
  if (epilogue == SmallGemmEpilogue::kSwiGluBf16 &&
      (n % 2 != 0 || (n / 2) % kSmallGemmSwiGluMultiple != 0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("small gemm: fused SwiGLU needs n / 2 a "
                     "multiple of ",
                     kSmallGemmSwiGluMultiple, ", n is ", n));
  }
  if (epilogue != SmallGemmEpilogue::kFloat && epilogue != SmallGemmEpilogue::kBf16 &&
      epilogue != SmallGemmEpilogue::kSwiGluBf16) {
    return absl::InvalidArgumentError("small gemm: unknown epilogue");
  }
  return absl::OkStatus();
}

absl::Status PrepareSmallGemm() {
  int device = 0;
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaGetDevice(&device));
  if (device < 0 || device >= kMaxDevices) {
    return absl::InternalError(absl::StrCat("small gemm: device ", device, " out of range"));
  }
  return QuerySlots(device);
}

absl::Status SmallGemm(const SmallGemmParams& p, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckSmallGemmShape(p.rows, p.n, p.k, p.epilogue));
  const auto misaligned = [](const void* ptr) {
    return reinterpret_cast<uintptr_t>(ptr) % 16 != 0;
  };
  if (p.x == nullptr || p.w == nullptr || p.y == nullptr || misaligned(p.x) || misaligned(p.w)) {
    return absl::InvalidArgumentError(
        "small gemm: x, w and y must be set, x and w 16-byte aligned");
  }
  if (p.workspace != nullptr && misaligned(p.workspace)) {
    return absl::InvalidArgumentError("small gemm: workspace must be 16-byte aligned");
  }
  if (p.rows == 0) return absl::OkStatus();
  const int b = BucketIndex(p.rows);
  ASSIGN_OR_RETURN(const int slots, Slots(b));
  switch (b) {
    case 0:
      return LaunchBucket<8>(p, slots, stream);
    case 1:
      return LaunchBucket<16>(p, slots, stream);
    case 2:
      return LaunchBucket<32>(p, slots, stream);
    case 3:
      return LaunchBucket<64>(p, slots, stream);
    default:
      return absl::InternalError(absl::StrCat("small gemm: no bucket for rows ", p.rows));
  }
}

}  // namespace lazyrag::kernels
