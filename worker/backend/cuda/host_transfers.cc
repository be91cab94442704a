#include "worker/backend/cuda/host_transfers.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
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
  cudaEvent_t event = nullptr;   // recorded after the checksum's copy back
  ~Transfer() {
    if (event != nullptr) cudaEventDestroy(event);
  }
};

HostTransfers::HostTransfers() = default;

HostTransfers::~HostTransfers() {
  if (stream_ != nullptr) cudaStreamSynchronize(stream_);
  transfers_.clear();
  if (compute_mark_ != nullptr) cudaEventDestroy(compute_mark_);
  if (stream_ != nullptr) cudaStreamDestroy(stream_);
}

absl::Status HostTransfers::Init() {
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
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
  kv.pages = reinterpret_cast<const int32_t*>(t->pages_device.data());
  cuda_model::KvHostTransportParams hp;
  hp.kv = kv;
  hp.checksum = reinterpret_cast<unsigned long long*>(t->checksum_device.data());
  RETURN_IF_ERROR(cuda_model::LaunchKvHostTransport(hp, stream_));
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
