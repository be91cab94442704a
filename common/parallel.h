// ParallelFor over a process-wide pool of worker threads (size = hardware threads, or
// LAZYRAG_NUM_THREADS). Calls fn(begin, end) on disjoint chunks of [0, n) and returns when all
// are done. Safe to call from several threads at once; nested calls run inline.
#pragma once

#include <cstdint>
#include <functional>

namespace lazyrag {

int NumWorkerThreads();
void ParallelFor(int64_t n, int64_t min_chunk, const std::function<void(int64_t, int64_t)>& fn);

}  // namespace lazyrag
