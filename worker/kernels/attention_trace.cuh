// Optional per-block phase timestamps inside the attention kernels, for finding where a
// kernel's fixed costs go when no profiler can say it (bench only: build with
// -DLAZYRAG_ATTN_TRACE, then `kernel_bench --trace`). Without the macro every trace point
// compiles to nothing and the kernels are unchanged.
//
// Thread 0 of each block records, at trace point i, the SM's cycle counter (clock64) and the
// global nanosecond timer; a kernel file owns one buffer (the last launch's blocks overwrite
// it) and exports a host reader.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/status.h"

namespace lazyrag::kernels::detail {

inline constexpr int kTracePoints = 8;
inline constexpr int kTraceBlocks = 4096;
inline constexpr int kTraceStride = 2 * kTracePoints + 1;  // values per block read back

struct AttentionTrace {
  uint64_t clock[kTraceBlocks][kTracePoints];
  uint64_t global_ns[kTraceBlocks][kTracePoints];
  uint32_t smid[kTraceBlocks];  // the multiprocessor the block ran on
};

#ifdef LAZYRAG_ATTN_TRACE
__device__ __forceinline__ void TracePoint(AttentionTrace* trace, int i) {
  if (threadIdx.x != 0) return;
  const int blk = blockIdx.y * gridDim.x + blockIdx.x;
  if (blk >= kTraceBlocks) return;
  uint64_t ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(ns));
  trace->clock[blk][i] = clock64();
  trace->global_ns[blk][i] = ns;
  if (i == 0) {
    uint32_t sm;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));
    trace->smid[blk] = sm;
  }
}
#define LAZYRAG_TRACE_POINT(buffer, i) ::lazyrag::kernels::detail::TracePoint(&(buffer), (i))

// Copies the buffer of the last traced launch of each kernel (blocks in launch order:
// blockIdx.y * gridDim.x + blockIdx.x), kTracePoints clock values, kTracePoints global_ns
// values and the SM id per block (kTraceStride values).
// `slot`: the buffer's index when the symbol is an array of them.
template <typename Symbol>
absl::Status ReadTraceSymbol(const Symbol& symbol, int blocks, std::vector<uint64_t>* out,
                             int slot = 0) {
  auto host = std::make_unique<AttentionTrace>();
  const cudaError_t err = cudaMemcpyFromSymbol(host.get(), symbol, sizeof(AttentionTrace),
                                               size_t(slot) * sizeof(AttentionTrace));
  if (err != cudaSuccess) return absl::InternalError(cudaGetErrorString(err));
  out->clear();
  for (int b = 0; b < std::min(blocks, kTraceBlocks); ++b) {
    out->insert(out->end(), host->clock[b], host->clock[b] + kTracePoints);
    out->insert(out->end(), host->global_ns[b], host->global_ns[b] + kTracePoints);
    out->push_back(host->smid[b]);
  }
  return absl::OkStatus();
}
absl::Status ReadPrefillWgmmaTrace(int blocks, std::vector<uint64_t>* out);
// The decode kernel and the split-merge kernel trace into two buffers each, alternating
// between decode launches (AttentionKernelParams::trace_slot), so the last launch and the one
// before it can be read together: slot (launches - 1) % 2 is the last one's.
int DecodeTraceLaunches();
absl::Status ReadDecodeTrace(int blocks, std::vector<uint64_t>* out, int slot);
absl::Status ReadMergeTrace(int blocks, std::vector<uint64_t>* out, int slot);
#else
#define LAZYRAG_TRACE_POINT(buffer, i) ((void)0)
#endif

}  // namespace lazyrag::kernels::detail
