// Tensor parallelism for the CUDA backend: one rank's NCCL communicator and the all-reduce of
// the O and down projections' partial sums. CreateCudaTensorParallelBackend (cuda_backend.h)
// builds the ranks and their communicators (cuda_tensor_parallel.cc).
//
// Builds without NCCL compile the same interface; a communicator cannot exist there
// (CreateCudaBackend refuses shard.size > 1), so its methods are then never reached.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"

namespace lazyrag::cuda_backend {

// Destroys `nccl_comm` (an ncclComm_t; nothing for null or without NCCL).
void DestroyNcclComm(void* nccl_comm);

// One rank's share of the all-reduce. Thread safety: none; the backend serializes calls.
class NcclAllReduce {
 public:
  // Takes ownership of `nccl_comm` (an ncclComm_t), REQUIRED when ranks > 1; null with one rank.
  NcclAllReduce(int ranks, void* nccl_comm) : ranks_(ranks), comm_(nccl_comm) {}
  ~NcclAllReduce() { DestroyNcclComm(comm_); }
  NcclAllReduce(const NcclAllReduce&) = delete;
  NcclAllReduce& operator=(const NcclAllReduce&) = delete;

  // Sums `count` bf16 elements at `data` (device) over the ranks in place, queued on `stream`
  // (every rank must queue the same sums in the same order). No-op with one rank.
  absl::Status SumBf16(uint16_t* data, int64_t count, cudaStream_t stream);
  // Waits for `stream` (when not null, on `device`) and destroys the communicator.
  void Destroy(int device, cudaStream_t stream);

 private:
  const int ranks_;
  void* comm_;
};

}  // namespace lazyrag::cuda_backend
