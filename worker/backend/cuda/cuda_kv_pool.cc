#include "worker/backend/cuda/cuda_kv_pool.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "common/status.h"
#include "worker/kernels/cuda_check.h"
#include "worker/kernels/materialize.h"
#include "worker/kernels/model_kernels.h"

namespace lazyrag::cuda_backend {

absl::Status CudaKvPool::CheckShape(int num_pages, int page_size) {
  if (num_pages <= 0 || page_size <= 0 || page_size > 1024) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv pool: bad shape ", num_pages, " pages x ", page_size, " tokens"));
  }
  return absl::OkStatus();
}

absl::Status CudaKvPool::Init(int num_pages, int page_size, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckShape(num_pages, page_size));
  num_pages_ = 0;
  pool_.Release();
  const int64_t kv_elems = int64_t(num_pages) * page_size * config_.kv_dim();
  const size_t bytes = size_t(2) * config_.num_layers * kv_elems * sizeof(uint16_t);
  if (auto st = pool_.Allocate(bytes); !st.ok()) {
    return absl::Status(st.code(),
                        absl::StrCat("kv pool: ", bytes / double(1 << 30), " GiB: ", st.message()));
  }
  // Zeroed so that masked page tails never hold NaN patterns.
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaMemsetAsync(pool_.data(), 0, bytes, stream));
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
  pool_k_ = reinterpret_cast<uint16_t*>(pool_.data());
  kv_elems_ = kv_elems;
  layer_stride_ = 2 * kv_elems;
  num_pages_ = num_pages;
  page_size_ = page_size;
  return absl::OkStatus();
}

absl::Status CudaKvPool::CheckRun(const std::vector<int32_t>& pages, int64_t num_tokens) const {
  if (num_pages_ == 0) return absl::FailedPreconditionError("kv run: KV pool not initialised");
  if (num_tokens < 0 || int64_t(pages.size()) * page_size_ < num_tokens) {
    return absl::InvalidArgumentError("kv run: more tokens than pages hold");
  }
  for (int32_t p : pages) {
    if (p < 0 || p >= num_pages_) {
      return absl::InvalidArgumentError(absl::StrCat("kv run: page ", p, " out of range"));
    }
  }
  return absl::OkStatus();
}

absl::Status CudaKvPool::Materialize(const std::vector<MaterializeCopy>& copies,
                                     const float* inv_freq, bool tensor_core, UploadFn upload,
                                     cudaStream_t stream) {
  for (const MaterializeCopy& m : copies) {
    if (m.len < 0 || m.dst_offset < 0 || m.src_offset < 0) {
      return absl::InvalidArgumentError("materialize: negative length or offset");
    }
    RETURN_IF_ERROR(CheckRun(m.src_pages, int64_t(m.src_offset) + m.len));
    RETURN_IF_ERROR(CheckRun(m.dst_pages, int64_t(m.dst_offset) + m.len));
  }
  if (copies.empty()) return absl::OkStatus();
  const int n = int(copies.size());
  std::vector<int32_t> src_indptr{0}, src_pages, dst_indptr{0}, dst_pages, len, dst_offset, delta,
      src_offset;
  int max_len = 0;
  for (const MaterializeCopy& m : copies) {
    src_pages.insert(src_pages.end(), m.src_pages.begin(), m.src_pages.end());
    src_indptr.push_back(int32_t(src_pages.size()));
    dst_pages.insert(dst_pages.end(), m.dst_pages.begin(), m.dst_pages.end());
    dst_indptr.push_back(int32_t(dst_pages.size()));
    len.push_back(m.len);
    dst_offset.push_back(m.dst_offset);
    delta.push_back(m.delta);
    src_offset.push_back(m.src_offset);
    max_len = std::max(max_len, m.len);
  }
  UploadPlan plan;
  const size_t o_si = plan.Add(src_indptr), o_sp = plan.Add(src_pages), o_di = plan.Add(dst_indptr),
               o_dp = plan.Add(dst_pages), o_len = plan.Add(len), o_off = plan.Add(dst_offset),
               o_delta = plan.Add(delta), o_src = plan.Add(src_offset);
  ASSIGN_OR_RETURN(char* dev, upload(plan));
  auto i32 = [&](size_t off) { return reinterpret_cast<const int32_t*>(dev + off); };
  kernels::MaterializeParams p;
  p.k_cache = pool_k_;
  p.v_cache = pool_k_ + kv_elems_;
  p.layer_stride = layer_stride_;
  p.num_layers = config_.num_layers;
  p.page_size = page_size_;
  p.num_kv_heads = config_.num_kv_heads;
  p.head_dim = config_.head_dim;
  p.inv_freq = inv_freq;
  p.num_copies = n;
  p.src_page_indptr = i32(o_si);
  p.src_pages = i32(o_sp);
  p.dst_page_indptr = i32(o_di);
  p.dst_pages = i32(o_dp);
  p.len = i32(o_len);
  p.dst_offset = i32(o_off);
  p.delta = i32(o_delta);
  p.src_offset = i32(o_src);
  p.max_len = max_len;
  if (tensor_core) return kernels::Materialize(p, stream);
  return cuda_model::LaunchFallbackMaterialize(p, stream);
}

size_t CudaKvPool::TransportBytes(int num_tokens) const {
  return size_t(2) * config_.num_layers * num_tokens * config_.kv_dim() * sizeof(uint16_t);
}

cuda_model::KvTransportParams CudaKvPool::TransportParams(const int32_t* pages, int num_tokens,
                                                          uint16_t* buffer, bool to_buffer) const {
  cuda_model::KvTransportParams p;
  p.pool = pool_k_;
  p.layer_stride = layer_stride_;
  p.v_offset = kv_elems_;
  p.num_layers = config_.num_layers;
  p.page_size = page_size_;
  p.kv_dim = config_.kv_dim();
  p.pages = pages;
  p.num_tokens = num_tokens;
  p.buffer = buffer;
  p.to_buffer = to_buffer;
  return p;
}

absl::Status CudaKvPool::Export(const std::vector<int32_t>& pages, int num_tokens, std::string* out,
                                UploadFn upload, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckRun(pages, num_tokens));
  const size_t bytes = TransportBytes(num_tokens);
  out->resize(bytes);
  if (bytes == 0) return absl::OkStatus();
  UploadPlan plan;
  const size_t o_pages = plan.Add(pages);
  ASSIGN_OR_RETURN(char* dev, upload(plan));
  DeviceBuffer staging;
  RETURN_IF_ERROR(staging.Allocate(bytes));
  RETURN_IF_ERROR(cuda_model::LaunchKvTransport(
      TransportParams(reinterpret_cast<const int32_t*>(dev + o_pages), num_tokens,
                      reinterpret_cast<uint16_t*>(staging.data()), /*to_buffer=*/true),
      stream));
  LAZYRAG_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(out->data(), staging.data(), bytes, cudaMemcpyDeviceToHost, stream));
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

absl::Status CudaKvPool::Import(const std::vector<int32_t>& pages, int num_tokens,
                                std::string_view data, UploadFn upload, cudaStream_t stream) {
  RETURN_IF_ERROR(CheckRun(pages, num_tokens));
  const size_t bytes = TransportBytes(num_tokens);
  if (data.size() != bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("kv import: payload is ", data.size(), " bytes, expected ", bytes));
  }
  if (bytes == 0) return absl::OkStatus();
  UploadPlan plan;
  const size_t o_pages = plan.Add(pages);
  ASSIGN_OR_RETURN(char* dev, upload(plan));
  DeviceBuffer staging;
  RETURN_IF_ERROR(staging.Allocate(bytes));
  LAZYRAG_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(staging.data(), data.data(), bytes, cudaMemcpyHostToDevice, stream));
  RETURN_IF_ERROR(cuda_model::LaunchKvTransport(
      TransportParams(reinterpret_cast<const int32_t*>(dev + o_pages), num_tokens,
                      reinterpret_cast<uint16_t*>(staging.data()), /*to_buffer=*/false),
      stream));
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

peer_copy::PoolLayout CudaKvPool::Layout() const {
  peer_copy::PoolLayout l;
  l.num_layers = config_.num_layers;
  l.num_pages = num_pages_;
  l.page_size = page_size_;
  l.kv_dim = config_.kv_dim();
  l.elem_bytes = sizeof(uint16_t);
  return l;
}

absl::StatusOr<PeerPoolHandle> CudaKvPool::PeerHandle(int device) const {
  PeerPoolHandle h;
  ASSIGN_OR_RETURN(h.ipc_handle, peer_copy::PoolIpcHandle(pool_.data()));
  cudaDeviceProp prop;
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaGetDeviceProperties(&prop, device));
  h.device_uuid.assign(prop.uuid.bytes, sizeof(prop.uuid.bytes));
  const peer_copy::PoolLayout l = Layout();
  h.num_layers = l.num_layers;
  h.num_pages = l.num_pages;
  h.page_size = l.page_size;
  h.kv_dim = l.kv_dim;
  h.elem_bytes = l.elem_bytes;
  return h;
}

absl::Status CudaKvPool::CopyFromPeer(const PeerPoolHandle& peer,
                                      const std::vector<int32_t>& peer_pages,
                                      const std::vector<int32_t>& own_pages, UploadFn upload,
                                      cudaStream_t stream) {
  if (num_pages_ == 0) return absl::FailedPreconditionError("kv pool not initialised");
  peer_copy::PoolLayout src;
  src.num_layers = peer.num_layers;
  src.num_pages = peer.num_pages;
  src.page_size = peer.page_size;
  src.kv_dim = peer.kv_dim;
  src.elem_bytes = peer.elem_bytes;
  const peer_copy::PoolLayout dst = Layout();
  RETURN_IF_ERROR(peer_copy::CheckPageCopy(src, dst, peer_pages, own_pages));
  if (peer_pages.empty()) return absl::OkStatus();
  auto it = peer_pools_.find(peer.ipc_handle);
  if (it == peer_pools_.end()) {
    // Maps the peer's whole pool once; peer access between the two GPUs is enabled by the
    // driver (cudaIpcMemLazyEnablePeerAccess). Same GPU: a plain device mapping.
    auto mapped = peer_copy::OpenPoolIpcHandle(peer.ipc_handle);
    if (!mapped.ok()) {
      // Not sticky, but recorded as the last error: clear it, or the next launch check of a
      // forward step would report it (the engine falls back to bytes and carries on).
      (void)cudaGetLastError();
      return mapped.status();
    }
    it = peer_pools_.emplace(peer.ipc_handle, *mapped).first;
  }
  UploadPlan plan;
  const size_t o_src = plan.Add(peer_pages);
  const size_t o_dst = plan.Add(own_pages);
  ASSIGN_OR_RETURN(char* dev, upload(plan));
  peer_copy::PageGatherParams p;
  p.src_pool = it->second;
  p.dst_pool = pool_.data();
  p.src = src;
  p.dst = dst;
  p.src_pages = reinterpret_cast<const int32_t*>(dev + o_src);
  p.dst_pages = reinterpret_cast<const int32_t*>(dev + o_dst);
  p.num_pages = int(peer_pages.size());
  // Pull: this GPU's SMs read the peer's pages over NVLink (bench/peer_transfer_bench measures
  // pull, push and the copy engines).
  RETURN_IF_ERROR(peer_copy::LaunchPageGather(p, stream));
  // Complete before returning: the caller then lets the peer unpin (release its lease).
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaStreamSynchronize(stream));
  return absl::OkStatus();
}

void CudaKvPool::ClosePeerPools() {
  for (auto& [handle, mapped] : peer_pools_) (void)peer_copy::ClosePoolIpcHandle(mapped);
  peer_pools_.clear();
}

}  // namespace lazyrag::cuda_backend
