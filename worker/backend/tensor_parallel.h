// Tensor parallelism inside one worker: one Backend over N rank backends, each built with
// ShardConfig (worker/backend/tp_shard.h) and holding its share of every weight and of every
// page of the KV pool. The ranks all-reduce the partial sums of the O and down projections
// themselves (CPU: HostAllReduce; CUDA: NCCL), so the wrapper only fans calls out and joins:
//
// * Forward: every rank runs the batch; rank 0 alone computes logits (the others get the
//   batch without logit rows), which the wrapper returns.
// * InitPool, Materialize: on every rank (page ids are the same on every rank).
// * ExportKv / ImportKv: the transport form stays the global one
//   ([layer][K, V][tokens, kv_heads, head_dim]); ranks' parts are interleaved by head on export
//   and split on import, so a TP=2 worker reads documents that a TP=1 worker stored and back.
// * config() is the global config; BytesPerPage() therefore counts all ranks together.
//
// Rank 0 runs on the calling thread, ranks 1..N-1 on one persistent thread each. The first
// failing rank (lowest rank among the failures) gives the returned status; a failing rank
// aborts the shared collective so that ranks blocked in it return instead of hanging.
// Thread safety: calls are serialized by an internal lock.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/backend/backend.h"
#include "worker/backend/tp_shard.h"

namespace lazyrag {

// A collective the ranks share, as seen by the wrapper: Abort() makes every rank blocked in
// (or later entering) the collective fail with ABORTED; Reset() re-arms it. The wrapper calls
// Reset() before each fan-out and Abort() when a rank fails.
class RankCollective {
 public:
  virtual ~RankCollective() = default;
  virtual void Abort() = 0;
  virtual void Reset() = 0;
};

// In-process all-reduce (sum) of fp32 buffers across N rank threads: every rank calls
// AllReduceSum with its rank and a buffer of the same length; each returns once every buffer
// holds the element-wise sum, added in rank order 0, 1, ..., N-1 (the same bits on every rank
// and on every run, whatever the thread timing). Rank r adds the r-th slice of the elements.
// Thread safety: one call per rank at a time; calls of all ranks must come in the same order.
class HostAllReduce final : public RankCollective {
 public:
  explicit HostAllReduce(int size) : size_(size), buffers_(size, nullptr) {}
  int size() const { return size_; }
  // ABORTED when Abort() was called before every rank arrived.
  absl::Status AllReduceSum(int rank, float* data, int64_t n);
  void Abort() override;
  void Reset() override;

 private:
  // Waits for all ranks; the last to arrive runs `on_last` first (under the lock).
  absl::Status Barrier(const std::function<void()>& on_last);

  const int size_;
  absl::Mutex mu_;
  int arrived_ ABSL_GUARDED_BY(mu_) = 0;
  int64_t generation_ ABSL_GUARDED_BY(mu_) = 0;
  bool aborted_ ABSL_GUARDED_BY(mu_) = false;
  // Written by each rank for itself before the first barrier, read by all between the
  // barriers (the barriers order these accesses).
  std::vector<float*> buffers_;
  std::vector<float> sum_;
  int64_t n_ = 0;
};

// Wraps `ranks` (rank r at index r, each built with ShardConfig(global, {N, r})).
// `collective`, when not null, is the one the ranks share (aborted on a rank failure).
// INVALID_ARGUMENT when there are no ranks or their configs are not the shards of `global`.
absl::StatusOr<std::unique_ptr<Backend>> CreateTensorParallelBackend(
    const ModelConfig& global, std::vector<std::unique_ptr<Backend>> ranks,
    std::shared_ptr<RankCollective> collective = nullptr);

}  // namespace lazyrag
