// The device's HBM read ceiling, for benchmark programs compiled as C++ (ttft_bench): the
// read kernel of bench_cuda.cuh, median of `iters` calls after warm-up.
#pragma once

namespace lazyrag::bench_cuda {

// The H200's read ceiling (2026-12-01), at which issue 29's targets were set.
inline constexpr double kIssue29ReadTbs = 4.52;

// TB/s on the current device over 2 GiB, or over less when less is free (at least 8x the L2,
// so that the reads come from HBM); 0 when not even that much device memory is free.
double MeasureReadCeilingTbs(int iters);

}  // namespace lazyrag::bench_cuda
