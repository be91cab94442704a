#include "bench/read_ceiling.h"

#include "bench/bench_cuda.cuh"

namespace lazyrag::bench_cuda {

double MeasureReadCeilingTbs(int iters) {
  int device = 0, sms = 0, l2 = 0;
  BENCH_CUDA(cudaGetDevice(&device));
  BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  BENCH_CUDA(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, device));
  size_t free_bytes = 0, total_bytes = 0;
  BENCH_CUDA(cudaMemGetInfo(&free_bytes, &total_bytes));
  constexpr size_t kMiB = size_t(1) << 20;
  constexpr size_t kHeadroom = 256 * kMiB;  // for the sink and the allocator's rounding
  const size_t fits =
      free_bytes > kHeadroom ? (free_bytes - kHeadroom) / (64 * kMiB) * 64 * kMiB : 0;
  const size_t bytes = std::min(size_t(2) << 30, fits);
  if (bytes < 8 * size_t(l2)) return 0;
  return MeasureReadTbs(iters, sms, bytes);
}

}  // namespace lazyrag::bench_cuda
