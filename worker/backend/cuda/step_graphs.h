// CUDA graphs of forward steps, keyed by step shape: a shape seen a second time is captured
// once and replayed from then on; at most max_graphs are kept (least recently used dropped).
//
// A graph holds the device addresses its step read (weights, pool, activations, the upload
// buffer): whoever moves one of those calls Clear first.
//
// Thread safety: none; the backend serializes calls. Runs on the caller's current device.
#pragma once

#include <cuda_runtime.h>

#include <array>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>

#include "absl/status/status.h"

namespace lazyrag::cuda_backend {

// The shape of a step as far as its kernels' launches depend on it: (tokens, logit rows,
// requests, segments, longest query, KV bound, decode, quality arrays). Equal keys must give
// identical launch sequences and device addresses for everything but the uploaded contents.
using StepGraphKey = std::array<int, 8>;

class StepGraphs {
 public:
  explicit StepGraphs(int max_graphs) : max_graphs_(max_graphs) {}
  ~StepGraphs() { DestroyAll(); }
  StepGraphs(const StepGraphs&) = delete;
  StepGraphs& operator=(const StepGraphs&) = delete;

  // Queues the step of shape `key` on `stream`: replays its graph when one is cached; on the
  // key's second sighting captures `enqueue` (which must queue the whole step on `stream` and
  // nothing else) and launches the graph; otherwise calls `enqueue` eagerly. A capture that
  // fails is logged, the step runs eagerly, and the key is never captured again. `tokens` is
  // for the log only.
  absl::Status Run(const StepGraphKey& key, int tokens, cudaStream_t stream,
                   const std::function<absl::Status()>& enqueue);
  // Drops every graph (after `stream` has finished their launches) and the sightings.
  void Clear(cudaStream_t stream);
  // Destroys every graph without synchronizing. REQUIRES: no launch of them is still queued.
  void DestroyAll();
  // Replays so far.
  size_t replays() const { return replays_; }

 private:
  struct CachedGraph {
    cudaGraphExec_t exec = nullptr;
    uint64_t last_use = 0;
  };
  const int max_graphs_;
  std::map<StepGraphKey, CachedGraph> graphs_;
  std::map<StepGraphKey, int> sightings_;
  uint64_t clock_ = 0;
  size_t replays_ = 0;
};

}  // namespace lazyrag::cuda_backend
