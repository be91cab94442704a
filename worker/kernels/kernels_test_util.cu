#include <cuda_runtime.h>

#include "worker/kernels/kernels_test_util.h"

namespace lazyrag::kernels::testing {
namespace {

__global__ void DelayedRowWriteKernel(uint16_t* k_cache, uint16_t* v_cache, const int64_t* offsets,
                                      const uint16_t* k_rows, const uint16_t* v_rows, int rows,
                                      int row_elems, int64_t delay_ns) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;\n" ::: "memory");
#endif
  uint64_t t0, t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t0));
  do {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  } while (int64_t(t - t0) < delay_ns);
  for (int i = blockIdx.x; i < rows; i += gridDim.x) {
    for (int e = threadIdx.x; e < row_elems; e += blockDim.x) {
      k_cache[offsets[i] + e] = k_rows[int64_t(i) * row_elems + e];
      v_cache[offsets[i] + e] = v_rows[int64_t(i) * row_elems + e];
    }
  }
}

}  // namespace

bool LaunchDelayedRowWrite(uint16_t* k_cache, uint16_t* v_cache, const int64_t* offsets,
                           const uint16_t* k_rows, const uint16_t* v_rows, int rows, int row_elems,
                           int64_t delay_ns, cudaStream_t stream) {
  if (rows <= 0) return true;
  DelayedRowWriteKernel<<<1, 128, 0, stream>>>(k_cache, v_cache, offsets, k_rows, v_rows, rows,
                                               row_elems, delay_ns);
  return cudaGetLastError() == cudaSuccess;
}

}  // namespace lazyrag::kernels::testing
