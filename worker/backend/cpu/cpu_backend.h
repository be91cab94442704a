// fp32 CPU backend: BLAS GEMMs for every linear layer and for attention, threads from
// common/parallel.h. The reference the CUDA backend is checked against, and the laptop default.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/backend/tensor_parallel.h"
#include "worker/backend/tp_shard.h"
#include "worker/model/weights.h"

namespace lazyrag {

struct CpuBackendOptions {
  // Attention implementation: false = BLAS tiles (fast), true = the scalar reference
  // PagedAttentionCpu (tests use it to check the fast path).
  bool reference_attention = false;
  // Tensor parallelism (worker/backend/tp_shard.h): this backend is rank shard.rank of
  // shard.size and its weights are that rank's slice; the O and down projections' partial sums
  // are all-reduced through `all_reduce` (REQUIRED when shard.size > 1, of that size). Rank 0
  // adds the residual. CreateCpuTensorParallelBackend sets these; the default is the plain path.
  TpShard shard = {};
  std::shared_ptr<HostAllReduce> all_reduce = nullptr;
};

// Takes ownership of `weights`. INVALID_ARGUMENT when the weights do not match their config.
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(std::unique_ptr<ModelWeights> weights,
                                                          const CpuBackendOptions& options = {});

// N ranks of the CPU backend behind one TensorParallelBackend (worker/backend/tensor_parallel.h),
// each holding its slice of `weights` (ShardWeights), all-reducing through one HostAllReduce.
// N = 1 gives the wrapper over one plain backend (tests compare it with CreateCpuBackend).
// INVALID_ARGUMENT when the model does not split into N ranks (tp_shard.h: CheckShardable).
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuTensorParallelBackend(
    std::unique_ptr<ModelWeights> weights, int tensor_parallel,
    const CpuBackendOptions& options = {});

// Attention over the segment view with BLAS tiles; same contract as PagedAttentionCpu.
void PagedAttentionBlas(const AttentionShape& shape, const SegmentView& view,
                        const float* inv_freq, const float* q, const float* k_cache,
                        const float* v_cache, float* out);

}  // namespace lazyrag
