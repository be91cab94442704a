#include "worker/backend/cuda/step_graphs.h"

#include <algorithm>
#include <limits>

#include "common/logging.h"
#include "worker/kernels/cuda_check.h"

namespace lazyrag::cuda_backend {

absl::Status StepGraphs::Run(const StepGraphKey& key, int tokens, cudaStream_t stream,
                             const std::function<absl::Status()>& enqueue) {
  ++clock_;
  if (auto it = graphs_.find(key); it != graphs_.end()) {
    it->second.last_use = clock_;
    ++replays_;
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaGraphLaunch(it->second.exec, stream));
    return absl::OkStatus();
  }
  // Capture on the second sighting: a shape seen once (say, one request's prompt) is not worth
  // the ~1 ms an instantiation costs.
  if (sightings_.size() > 4096) sightings_.clear();
  if (++sightings_[key] < 2) return enqueue();
  sightings_.erase(key);
  if (graphs_.size() >= size_t(std::max(1, max_graphs_))) {
    auto lru = graphs_.begin();
    for (auto it = graphs_.begin(); it != graphs_.end(); ++it) {
      if (it->second.last_use < lru->second.last_use) lru = it;
    }
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
    cudaGraphExecDestroy(lru->second.exec);
    graphs_.erase(lru);
  }
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  absl::Status queued = enqueue();
  cudaGraph_t graph = nullptr;
  const cudaError_t end = cudaStreamEndCapture(stream, &graph);
  cudaGraphExec_t exec = nullptr;
  cudaError_t inst = cudaErrorUnknown;
  if (queued.ok() && end == cudaSuccess && graph != nullptr) {
    inst = cudaGraphInstantiate(&exec, graph, 0);
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  if (!queued.ok() || end != cudaSuccess || inst != cudaSuccess) {
    // Nothing ran while capturing: run the step eagerly, and never capture this shape again
    // (a sighting count that cannot reach 2).
    (void)cudaGetLastError();
    sightings_[key] = std::numeric_limits<int>::min();
    LOG_WARNING << "cuda backend: no CUDA graph for a step of " << tokens << " tokens ("
                << (queued.ok() ? cudaGetErrorString(end != cudaSuccess ? end : inst)
                                : queued.ToString())
                << "); running it without";
    return enqueue();
  }
  graphs_[key] = {exec, clock_};
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaGraphLaunch(exec, stream));
  return absl::OkStatus();
}

void StepGraphs::Clear(cudaStream_t stream) {
  if (graphs_.empty()) return;
  cudaStreamSynchronize(stream);  // no launch of them may still be queued
  DestroyAll();
  sightings_.clear();
}

void StepGraphs::DestroyAll() {
  for (auto& [key, g] : graphs_) cudaGraphExecDestroy(g.exec);
  graphs_.clear();
}

}  // namespace lazyrag::cuda_backend
