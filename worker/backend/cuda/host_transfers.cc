#include "worker/backend/cuda/host_transfers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/logging.h"
#include "common/status.h"
#include "worker/kernels/cuda_check.h"

namespace lazyrag::cuda_backend {

absl::StatusOr<std::unique_ptr<HostMemory>> AllocatePinnedHostMemory(int64_t bytes) {
  if (bytes <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("host memory: ", bytes, " bytes asked"));
  }
  void* p = nullptr;
  // Portable and mapped: with unified addressing the host pointer is the device address.
  const cudaError_t err =
      cudaHostAlloc(&p, size_t(bytes), cudaHostAllocPortable | cudaHostAllocMapped);
  if (err != cudaSuccess) {
    cudaGetLastError();
    return absl::ResourceExhaustedError(
        absl::StrCat("host memory: cannot pin ", bytes, " bytes: ", cudaGetErrorString(err)));
  }
  return std::make_unique<OwnedHostMemory>(static_cast<char*>(p), bytes,
                                           [](char* q) { cudaFreeHost(q); });
}

struct HostTransfers::Transfer {
  KvTransferId id = 0;  // 0: the slot is free
  bool to_host = false;
  bool done = false;             // its event was seen complete (to-host: no wait needed)
  std::vector<int32_t> pages;    // sorted, for OrderWritesAfter
  PinnedBuffer pages_host;       // [n] page ids
  DeviceBuffer pages_device;     // [n] page ids
  DeviceBuffer checksum_device;  // one uint64
  PinnedBuffer checksum_host;    // one uint64
  // The copy engines' pieces of the transfer (KvCopyChunks), kept until it is done.
  std::vector<void*> dsts;
  std::vector<const void*> srcs;
  std::vector<size_t> sizes;
  cudaEvent_t event = nullptr;  // recorded after the checksum's copy back
  ~Transfer() {
    if (event != nullptr) cudaEventDestroy(event);
  }
};

std::vector<KvCopyChunk> KvCopyChunks(const cuda_model::KvTransportParams& kv,
                                      const std::vector<int32_t>& pages) {
  std::vector<KvCopyChunk> chunks;
  if (kv.num_tokens <= 0 || kv.page_size <= 0) return chunks;
  const int num_pages = (kv.num_tokens + kv.page_size - 1) / kv.page_size;
  // Runs of consecutive page ids: [first page index, end page index).
  std::vector<std::pair<int, int>> runs;
  for (int q = 0; q < num_pages; ++q) {
    if (!runs.empty() && pages[q] == pages[q - 1] + 1) {
      runs.back().second = q + 1;
    } else {
      runs.push_back({q, q + 1});
    }
  }
  chunks.reserve(runs.size() * 2 * kv.num_layers);
  for (int plane = 0; plane < 2 * kv.num_layers; ++plane) {
    const int64_t plane_pool = int64_t(plane / 2) * kv.layer_stride + (plane % 2) * kv.v_offset;
    for (const auto& [q0, q1] : runs) {
      const int64_t t0 = int64_t(q0) * kv.page_size;
      const int64_t t1 = std::min<int64_t>(int64_t(q1) * kv.page_size, kv.num_tokens);
      KvCopyChunk c;
      c.pool_elem = plane_pool + int64_t(pages[q0]) * kv.page_size * kv.kv_dim;
      c.buffer_elem = (int64_t(plane) * kv.num_tokens + t0) * kv.kv_dim;
      c.elems = (t1 - t0) * kv.kv_dim;
      chunks.push_back(c);
    }
  }
  return chunks;
}

HostTransfers::HostTransfers() = default;

HostTransfers::~HostTransfers() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  transfers_.clear();
  if (compute_mark_ != nullptr) cudaEventDestroy(compute_mark_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status HostTransfers::Init() {
  // The highest priority: the checksum kernel's blocks go before the forward step's, so a
  // promotion is not held behind a long step (the copies themselves use the copy engines).
  int least = 0, greatest = 0;
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaDeviceGetStreamPriorityRange(&least, &greatest));
  LAZYRAG_RETURN_IF_CUDA_ERROR(
      cudaStreamCreateWithPriority(&stream_, cudaStreamNonBlocking, greatest));
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&compute_mark_, cudaEventDisableTiming));
  return absl::OkStatus();
}

absl::StatusOr<KvTransferId> HostTransfers::Start(cuda_model::KvTransportParams kv,
                                                  const std::vector<int32_t>& pages,
                                                  cudaStream_t compute) {
  if (stream_ == nullptr) return absl::FailedPreconditionError("host transfers: not initialised");
  Transfer* t = nullptr;
  for (auto& slot : transfers_) {
    if (slot->id == 0) {
      t = slot.get();
      break;
    }
  }
  if (t == nullptr) {
    transfers_.push_back(std::make_unique<Transfer>());
    t = transfers_.back().get();
    LAZYRAG_RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&t->event, cudaEventDisableTiming));
    RETURN_IF_ERROR(t->checksum_device.Allocate(sizeof(uint64_t)));
    RETURN_IF_ERROR(t->checksum_host.Reserve(sizeof(uint64_t)));
  }
  const size_t page_bytes = std::max<size_t>(1, pages.size()) * sizeof(int32_t);
  RETURN_IF_ERROR(t->pages_host.Reserve(page_bytes));
  RETURN_IF_ERROR(t->pages_device.Reserve(page_bytes));
  std::copy(pages.begin(), pages.end(), reinterpret_cast<int32_t*>(t->pages_host.data()));

  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaEventRecord(compute_mark_, compute));
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(stream_, compute_mark_, 0));
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(t->pages_device.data(), t->pages_host.data(),
                                               pages.size() * sizeof(int32_t),
                                               cudaMemcpyHostToDevice, stream_));
  cuda_model::KvChecksumParams check;
  check.kv = kv;
  check.kv.pages = reinterpret_cast<const int32_t*>(t->pages_device.data());
  check.checksum = reinterpret_cast<unsigned long long*>(t->checksum_device.data());
  // To host: the pool's bytes are checked where they are and copied; from host: copied, then
  // checked where they landed. Either way the checksum covers the bytes the pool holds.
  if (kv.to_buffer) RETURN_IF_ERROR(cuda_model::LaunchKvChecksum(check, stream_));
  RETURN_IF_ERROR(CopyChunks(kv, pages, *t));
  if (!kv.to_buffer) RETURN_IF_ERROR(cuda_model::LaunchKvChecksum(check, stream_));
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaMemcpyAsync(t->checksum_host.data(), t->checksum_device.data(),
                                               sizeof(uint64_t), cudaMemcpyDeviceToHost, stream_));
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaEventRecord(t->event, stream_));
  t->id = next_id_++;
  t->to_host = kv.to_buffer;
  t->done = false;
  t->pages = pages;
  std::sort(t->pages.begin(), t->pages.end());
  return t->id;
}

absl::Status HostTransfers::CopyChunks(const cuda_model::KvTransportParams& kv,
                                       const std::vector<int32_t>& pages, Transfer& t) {
  const std::vector<KvCopyChunk> chunks = KvCopyChunks(kv, pages);
  t.dsts.clear();
  t.srcs.clear();
  t.sizes.clear();
  for (const KvCopyChunk& c : chunks) {
    uint16_t* pool = kv.pool + c.pool_elem;
    uint16_t* buffer = kv.buffer + c.buffer_elem;
    t.dsts.push_back(kv.to_buffer ? buffer : pool);
    t.srcs.push_back(kv.to_buffer ? pool : buffer);
    t.sizes.push_back(size_t(c.elems) * sizeof(uint16_t));
  }
  if (t.sizes.empty()) return absl::OkStatus();
  if (batch_copies_) {
    cudaMemcpyAttributes attr = {};
    attr.srcAccessOrder = cudaMemcpySrcAccessOrderStream;
    attr.flags = cudaMemcpyFlagPreferOverlapWithCompute;
    size_t attr_index = 0;
    const cudaError_t st = cudaMemcpyBatchAsync(t.dsts.data(), t.srcs.data(), t.sizes.data(),
                                                t.sizes.size(), &attr, &attr_index, 1, stream_);
    if (st == cudaSuccess) return absl::OkStatus();
    if (st != cudaErrorInvalidValue && st != cudaErrorNotSupported) {
      return CudaErrorStatus(st, "kv transfer: batched copy");
    }
    // A driver without batched copies: one copy per piece from here on.
    cudaGetLastError();
    batch_copies_ = false;
    LOG_WARNING << "kv transfer: cudaMemcpyBatchAsync unavailable (" << cudaGetErrorString(st)
                << "); copying piece by piece";
  }
  for (size_t i = 0; i < t.sizes.size(); ++i) {
    LAZYRAG_RETURN_IF_CUDA_ERROR(
        cudaMemcpyAsync(t.dsts[i], t.srcs[i], t.sizes[i], cudaMemcpyDefault, stream_));
  }
  return absl::OkStatus();
}

HostTransfers::Transfer* HostTransfers::Find(KvTransferId id) {
  for (auto& slot : transfers_) {
    if (id != 0 && slot->id == id) return slot.get();
  }
  return nullptr;
}

uint64_t HostTransfers::Finish(Transfer& t) {
  const uint64_t checksum = *reinterpret_cast<const uint64_t*>(t.checksum_host.data());
  t.id = 0;
  t.pages.clear();
  return checksum;
}

absl::StatusOr<std::optional<uint64_t>> HostTransfers::Poll(KvTransferId id) {
  Transfer* t = Find(id);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("kv transfer ", id, ": unknown"));
  const cudaError_t st = cudaEventQuery(t->event);
  if (st == cudaErrorNotReady) return std::optional<uint64_t>();
  if (st != cudaSuccess) {
    t->id = 0;
    return CudaErrorStatus(st, "kv transfer");
  }
  return std::optional<uint64_t>(Finish(*t));
}

absl::StatusOr<uint64_t> HostTransfers::Wait(KvTransferId id) {
  Transfer* t = Find(id);
  if (t == nullptr) return absl::NotFoundError(absl::StrCat("kv transfer ", id, ": unknown"));
  if (const cudaError_t st = cudaEventSynchronize(t->event); st != cudaSuccess) {
    t->id = 0;
    return CudaErrorStatus(st, "kv transfer");
  }
  return Finish(*t);
}

absl::Status HostTransfers::OrderWritesAfter(const std::vector<int32_t>& written,
                                             cudaStream_t compute) {
  for (auto& slot : transfers_) {
    Transfer& t = *slot;
    if (t.id == 0 || !t.to_host || t.done) continue;
    const cudaError_t st = cudaEventQuery(t.event);
    if (st == cudaSuccess) {
      t.done = true;
      continue;
    }
    if (st != cudaErrorNotReady) return CudaErrorStatus(st, "kv transfer");
    const bool overlaps = std::any_of(written.begin(), written.end(), [&](int32_t page) {
      return std::binary_search(t.pages.begin(), t.pages.end(), page);
    });
    if (overlaps) LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamWaitEvent(compute, t.event, 0));
  }
  return absl::OkStatus();
}

absl::Status HostTransfers::OrderSlotWritesAfter(const std::vector<int64_t>& slots, int page_size,
                                                 cudaStream_t compute) {
  bool any = false;
  for (auto& slot : transfers_) any |= slot->id != 0 && slot->to_host && !slot->done;
  if (!any) return absl::OkStatus();
  std::vector<int32_t> pages;
  pages.reserve(slots.size());
  for (int64_t s : slots) pages.push_back(int32_t(s / page_size));
  return OrderWritesAfter(pages, compute);
}

absl::Status HostTransfers::Drain() {
  if (stream_ != nullptr) LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

}  // namespace lazyrag::cuda_backend
