// The host tier's data path in the CUDA backend (Backend::StartKvToHost / StartKvFromHost):
// document KV copied between the pool and pinned host memory by the copy engines (one batched
// copy of the run's contiguous pieces, so no SM is held while the bus moves the bytes) and
// checksummed by a short kernel that reads the pool's side, on a stream of its own at the
// highest priority, so that the copies overlap the forward steps.
//
// Ordering, the contract Backend states:
//   * a transfer starts after everything queued on the compute stream before Start (the pages
//     it reads were written there; pages it writes may still be read there);
//   * a to-host transfer's pages may be freed at once: the compute stream is made to wait for it
//     (OrderWritesAfter) before any later work that writes one of its pages;
//   * a from-host transfer's pages are used only after Poll or Wait reported it done (the caller
//     checks the checksum first), so nothing waits for it on the device.
//
// Thread safety: none; the backend serializes calls under its lock.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/backend/backend.h"
#include "worker/backend/cuda/device_buffers.h"
#include "worker/kernels/kv_transport.h"

namespace lazyrag::cuda_backend {

// Pinned host memory (cudaHostAlloc, portable and mapped): the copy engines move it at the
// bus's speed, and with unified addressing the host pointer is also its device address.
absl::StatusOr<std::unique_ptr<HostMemory>> AllocatePinnedHostMemory(int64_t bytes);

// One contiguous piece of a run's transport form (cuda_model::KvTransportParams): `elems`
// elements at pool + pool_elem and at buffer + buffer_elem. A run of consecutive page ids is
// one piece per layer and K or V.
struct KvCopyChunk {
  int64_t pool_elem = 0;
  int64_t buffer_elem = 0;
  int64_t elems = 0;
};
// The pieces of tokens [0, kv.num_tokens) of the run `pages` (kv.pages unused), layer-major.
// REQUIRES: pages holds ceil(num_tokens / page_size) ids.
std::vector<KvCopyChunk> KvCopyChunks(const cuda_model::KvTransportParams& kv,
                                      const std::vector<int32_t>& pages);

class HostTransfers {
 public:
  HostTransfers();
  ~HostTransfers();  // waits for unfinished transfers; REQUIRES: the device is current
  HostTransfers(const HostTransfers&) = delete;
  HostTransfers& operator=(const HostTransfers&) = delete;

  // Creates the transfer stream. REQUIRES: the backend's device is current.
  absl::Status Init();

  // Queues `kv` (its `pages` field is set here from `pages`; kv.buffer is the host buffer) after
  // the work queued on `compute` so far. kv.to_buffer true: pool -> host.
  absl::StatusOr<KvTransferId> Start(cuda_model::KvTransportParams kv,
                                     const std::vector<int32_t>& pages, cudaStream_t compute);
  // Backend::PollKvTransfer / WaitKvTransfer.
  absl::StatusOr<std::optional<uint64_t>> Poll(KvTransferId id);
  absl::StatusOr<uint64_t> Wait(KvTransferId id);

  // Makes `compute` wait (on the device; the host does not block) for every unfinished to-host
  // transfer that reads one of `written`, the pages the caller is about to write there.
  absl::Status OrderWritesAfter(const std::vector<int32_t>& written, cudaStream_t compute);
  // Same for page slots (page * page_size + offset), as a forward step writes them.
  absl::Status OrderSlotWritesAfter(const std::vector<int64_t>& slots, int page_size,
                                    cudaStream_t compute);
  // Blocks until every queued transfer finished (before the pool is replaced).
  absl::Status Drain();

 private:
  struct Transfer;
  Transfer* Find(KvTransferId id);
  // The transfer's result once its event completed; frees its slot.
  uint64_t Finish(Transfer& t);
  // Queues the copy of kv's run on the stream (the pieces are kept in `t`).
  absl::Status CopyChunks(const cuda_model::KvTransportParams& kv,
                          const std::vector<int32_t>& pages, Transfer& t);

  cudaStream_t stream_ = nullptr;
  cudaEvent_t compute_mark_ = nullptr;  // recorded on the compute stream at each Start
  std::vector<std::unique_ptr<Transfer>> transfers_;  // slots, reused once finished
  KvTransferId next_id_ = 1;
  bool batch_copies_ = true;  // cudaMemcpyBatchAsync works (else one copy per piece)
};

}  // namespace lazyrag::cuda_backend
