// The device's HBM read ceiling, for benchmark programs compiled as C++ (ttft_bench): the
// read kernel of bench_cuda.cuh over 2 GiB, median of `iters` calls after warm-up.
#pragma once

namespace lazyrag::bench_cuda {

// TB/s on the current device; allocates and frees 2 GiB of device memory.
double MeasureReadCeilingTbs(int iters);

}  // namespace lazyrag::bench_cuda
