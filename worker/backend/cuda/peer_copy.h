// Document KV copied between the paged pools of two GPUs of one host (issue 9, the fast path of
// the peer tier): pages of a peer's pool straight into free pages of ours over NVLink, no host
// round trip. Free functions on raw device pointers and a pool layout, so that a backend hooks
// them in with a few lines (CudaKvPool::PeerHandle / CopyFromPeer) and bench/peer_transfer_bench
// measures them beside the kvstore path's device parts.
//
// Pool layout (CudaKvPool, cuda_kv_pool.h): one allocation
//   [num_layers][K | V][num_pages * page_size, kv_dim] elements of elem_bytes,
// so one (layer, K|V, page) is a contiguous block of page_size * kv_dim * elem_bytes bytes
// (32 KiB for the Llama-3.1-8B shape at page size 16, bf16).
//
// Knows nothing of gRPC, scheduling or cache policy (DESIGN section 9).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace lazyrag::peer_copy {

struct PoolLayout {
  int num_layers = 0;
  int num_pages = 0;
  int page_size = 0;
  int kv_dim = 0;      // kv heads * head dim
  int elem_bytes = 2;  // bf16

  // One (layer, K|V, page) block.
  int64_t PageBytes() const { return int64_t(page_size) * kv_dim * elem_bytes; }
  // One layer's K (or V) region; V starts this far after K.
  int64_t KvBytes() const { return int64_t(num_pages) * PageBytes(); }
  int64_t LayerStrideBytes() const { return 2 * KvBytes(); }
  int64_t PoolBytes() const { return int64_t(num_layers) * LayerStrideBytes(); }
  // Byte offset of (layer, kv = 0 for K / 1 for V, page).
  int64_t Offset(int layer, int kv, int page) const {
    return int64_t(layer) * LayerStrideBytes() + int64_t(kv) * KvBytes() +
           int64_t(page) * PageBytes();
  }
};

// INVALID_ARGUMENT unless the two layouts have the same page shape (layers, page size, kv dim,
// element size), the page lists have the same length, and every page is inside its pool.
absl::Status CheckPageCopy(const PoolLayout &src, const PoolLayout &dst,
                           const std::vector<int32_t> &src_pages,
                           const std::vector<int32_t> &dst_pages);

// One gather: for every layer, K and V, and i < num_pages, the block of src page
// src_pages[i] is copied to dst page dst_pages[i]. src_pool may be memory of another GPU
// (peer access enabled, or opened from a CUDA IPC handle); the kernel runs on the current
// device, which must be able to address both pools (pull: the destination's device reading
// the peer; push: the source's device writing into the peer).
struct PageGatherParams {
  const void *src_pool = nullptr;
  void *dst_pool = nullptr;
  PoolLayout src;
  PoolLayout dst;
  const int32_t *src_pages = nullptr;  // device array [num_pages]
  const int32_t *dst_pages = nullptr;  // device array [num_pages]
  int num_pages = 0;
};

// REQUIRES: CheckPageCopy passed for the host copies of the page lists; page bytes a multiple
// of 16 (any kv_dim that is a multiple of 8 in bf16). INVALID_ARGUMENT otherwise.
absl::Status LaunchPageGather(const PageGatherParams &p, cudaStream_t stream);

// The same copy by the copy engines: one cudaMemcpyPeerAsync (cudaMemcpyAsync when the two
// devices are the same) per maximal run of pages consecutive in both pools, per layer and K|V.
// Page lists are host vectors. Returns the number of copies issued. Checks its arguments.
absl::StatusOr<int64_t> CopyPageRuns(const void *src_pool, int src_device, const PoolLayout &src,
                                     const std::vector<int32_t> &src_pages, void *dst_pool,
                                     int dst_device, const PoolLayout &dst,
                                     const std::vector<int32_t> &dst_pages, cudaStream_t stream);

// Document KV between the pool and a contiguous buffer in transport order (the kvstore
// payload of a whole-page document: for each layer, K then V, each [pages * page_size, kv_dim]).
// to_buffer: pool -> buffer, else buffer -> pool. For the NCCL and host-staged paths.
absl::Status LaunchPagesToBuffer(const void *pool, const PoolLayout &layout,
                                 const int32_t *pages_device, int num_pages, void *buffer,
                                 bool to_buffer, cudaStream_t stream);

// Lets `device` address `peer_device`'s memory (cudaDeviceEnablePeerAccess); OK when already
// enabled or when the two are the same. FAILED_PRECONDITION when the pair cannot (no P2P).
absl::Status EnablePeerAccess(int device, int peer_device);

// CUDA IPC of a pool allocation, across processes. The exporter calls PoolIpcHandle once on
// the base pointer of its cudaMalloc'd pool (64 opaque bytes to send to peers); an importer
// calls OpenPoolIpcHandle once per peer on its own device (peer access enabled lazily by the
// driver) and ClosePoolIpcHandle at the end. A process cannot open its own handles.
absl::StatusOr<std::string> PoolIpcHandle(void *pool_base);
absl::StatusOr<void *> OpenPoolIpcHandle(std::string_view handle);
absl::Status ClosePoolIpcHandle(void *mapped);

}  // namespace lazyrag::peer_copy
