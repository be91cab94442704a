// fp32 CPU backend: BLAS GEMMs for every linear layer and for attention, threads from
// common/parallel.h. The reference the CUDA backend is checked against, and the laptop default.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/model/weights.h"

namespace lazyrag {

struct CpuBackendOptions {
  // Attention implementation: false = BLAS tiles (fast), true = the scalar reference
  // PagedAttentionCpu (tests use it to check the fast path).
  bool reference_attention = false;
};

// Takes ownership of `weights`. INVALID_ARGUMENT when the weights do not match their config.
absl::StatusOr<std::unique_ptr<Backend>> CreateCpuBackend(std::unique_ptr<ModelWeights> weights,
                                                          const CpuBackendOptions& options = {});

// Attention over the segment view with BLAS tiles; same contract as PagedAttentionCpu.
void PagedAttentionBlas(const AttentionShape& shape, const SegmentView& view,
                        const float* inv_freq, const float* q, const float* k_cache,
                        const float* v_cache, float* out);

}  // namespace lazyrag
