// The CUDA backend's paged KV pool: one bf16 allocation,
//   [num_layers][K | V][num_pages * page_size, kv_dim]
// (kv_dim = kv heads * head dim of the rank), zeroed at Init, and the operations on whole page
// runs: MATERIALIZE's copy + re-rotation, export / import in the transport form, and the peer
// tier's fast path (the pool lent by CUDA IPC; pages pulled from a peer's pool,
// worker/backend/cuda/peer_copy.h).
//
// Operations that need host arrays on the device take an Upload function (the backend's
// staged upload on the same stream). Every operation queues on the stream it is given; those
// that hand data back or must be complete for the caller synchronize it before returning.
//
// Thread safety: none; the backend serializes calls. Runs on the caller's current device.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/statusor.h"
#include "worker/attention/attention_cpu.h"
#include "worker/backend/backend.h"
#include "worker/backend/cuda/device_buffers.h"
#include "worker/backend/cuda/peer_copy.h"
#include "worker/kernels/kv_transport.h"
#include "worker/model/config.h"

namespace lazyrag::cuda_backend {

// Queues the upload of `plan` on the pool's stream; returns the device base address.
using UploadFn = absl::FunctionRef<absl::StatusOr<char*>(const UploadPlan&)>;

class CudaKvPool {
 public:
  // `config` is the rank's config.
  explicit CudaKvPool(const ModelConfig& config) : config_(config) {}
  ~CudaKvPool() { ClosePeerPools(); }
  CudaKvPool(const CudaKvPool&) = delete;
  CudaKvPool& operator=(const CudaKvPool&) = delete;

  // INVALID_ARGUMENT unless 0 < num_pages and 0 < page_size <= 1024.
  static absl::Status CheckShape(int num_pages, int page_size);
  // Replaces the pool with num_pages pages of page_size tokens, zeroed (masked page tails never
  // hold NaN patterns); returns once it is zeroed. On failure the pool is left uninitialised.
  // INVALID_ARGUMENT for a bad shape (CheckShape); RESOURCE_EXHAUSTED when it does not fit.
  // REQUIRES: nothing still queued reads the old pool.
  absl::Status Init(int num_pages, int page_size, cudaStream_t stream);
  bool initialized() const { return num_pages_ > 0; }
  int num_pages() const { return num_pages_; }
  int page_size() const { return page_size_; }

  // Layer `layer`'s K and V: [num_pages * page_size, kv_dim] bf16 each.
  uint16_t* LayerK(int layer) const { return pool_k_ + int64_t(layer) * layer_stride_; }
  uint16_t* LayerV(int layer) const { return LayerK(layer) + kv_elems_; }

  // FAILED_PRECONDITION before Init; INVALID_ARGUMENT unless `pages` hold num_tokens tokens and
  // every page is in the pool.
  absl::Status CheckRun(const std::vector<int32_t>& pages, int64_t num_tokens) const;

  // MATERIALIZE: every copy on every layer, keys re-rotated by the copy's delta. `inv_freq` is
  // the device RoPE table [head_dim / 2]; `tensor_core` picks worker/kernels' kernel (head dims
  // 64 / 128), else the CUDA-core fallback. Queued, not synchronized.
  absl::Status Materialize(const std::vector<MaterializeCopy>& copies, const float* inv_freq,
                           bool tensor_core, UploadFn upload, cudaStream_t stream);
  // The transport form (Backend::ExportKv / ImportKv) of tokens 0..num_tokens-1 of the run.
  absl::Status Export(const std::vector<int32_t>& pages, int num_tokens, std::string* out,
                      UploadFn upload, cudaStream_t stream);
  absl::Status Import(const std::vector<int32_t>& pages, int num_tokens, std::string_view data,
                      UploadFn upload, cudaStream_t stream);

  // The handle of the pool for peer workers on the same host. REQUIRES: initialized().
  absl::StatusOr<PeerPoolHandle> PeerHandle(int device) const;
  // Backend::CopyPagesFromPeer: the peer's pool is mapped once per handle (kept until
  // destruction) and this device pulls the pages over NVLink.
  absl::Status CopyFromPeer(const PeerPoolHandle& peer, const std::vector<int32_t>& peer_pages,
                            const std::vector<int32_t>& own_pages, UploadFn upload,
                            cudaStream_t stream);
  // Unmaps every peer pool mapped by CopyFromPeer.
  void ClosePeerPools();

  // The transport kernel's parameters for `num_tokens` tokens to or from `buffer`; the caller
  // sets the device page list (`pages`). REQUIRES: CheckRun passed for the run.
  cuda_model::KvTransportParams Transport(int num_tokens, void* buffer, bool to_buffer) const {
    return TransportParams(nullptr, num_tokens, static_cast<uint16_t*>(buffer), to_buffer);
  }

 private:
  peer_copy::PoolLayout Layout() const;
  // The transport kernel's parameters for `num_tokens` tokens of the page run at `pages` (device).
  cuda_model::KvTransportParams TransportParams(const int32_t* pages, int num_tokens,
                                                uint16_t* buffer, bool to_buffer) const;
  // Bytes of num_tokens tokens in the transport form.
  size_t TransportBytes(int num_tokens) const;

  const ModelConfig config_;
  DeviceBuffer pool_;
  uint16_t* pool_k_ = nullptr;
  int64_t kv_elems_ = 0;      // elements of one layer's K (or V)
  int64_t layer_stride_ = 0;  // 2 * kv_elems_
  int num_pages_ = 0;
  int page_size_ = 16;
  // Peer pools mapped by CUDA IPC, by handle bytes (a restarted peer has a new handle).
  std::map<std::string, void*> peer_pools_;
};

}  // namespace lazyrag::cuda_backend
