#include "bench/read_ceiling.h"

#include "bench/bench_cuda.cuh"

namespace lazyrag::bench_cuda {

double MeasureReadCeilingTbs(int iters) {
  int device = 0, sms = 0;
  BENCH_CUDA(cudaGetDevice(&device));
  BENCH_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device));
  return MeasureReadTbs(iters, sms);
}

}  // namespace lazyrag::bench_cuda
