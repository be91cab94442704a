#include "worker/backend/cuda/device_buffers.h"

#include "common/status.h"
#include "worker/kernels/cuda_check.h"

namespace lazyrag::cuda_backend {

absl::Status DeviceBuffer::Allocate(size_t bytes) {
  Release();
  if (bytes == 0) return absl::OkStatus();
  if (const cudaError_t err = cudaMalloc(&ptr_, bytes); err != cudaSuccess) {
    ptr_ = nullptr;
    (void)cudaGetLastError();  // out of memory is not sticky: clear it for later launch checks
    return CudaErrorStatus(err, "cudaMalloc(&ptr_, bytes)");
  }
  bytes_ = bytes;
  return absl::OkStatus();
}

void DeviceBuffer::Release() {
  if (ptr_ != nullptr) cudaFree(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

absl::Status PinnedBuffer::Reserve(size_t bytes) {
  if (bytes <= bytes_) return absl::OkStatus();
  Release();
  const size_t n = std::max<size_t>(bytes, 64 << 10);
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaMallocHost(&ptr_, n));
  bytes_ = n;
  return absl::OkStatus();
}

void PinnedBuffer::Release() {
  if (ptr_ != nullptr) cudaFreeHost(ptr_);
  ptr_ = nullptr;
  bytes_ = 0;
}

StagedUpload::~StagedUpload() {
  if (done_ != nullptr) cudaEventDestroy(done_);
}

absl::Status StagedUpload::Init() {
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming));
  return absl::OkStatus();
}

absl::StatusOr<char*> StagedUpload::Upload(const UploadPlan& plan, cudaStream_t stream,
                                           const std::function<void()>& before_move) {
  const size_t bytes = plan.bytes();
  // The previous upload must have left the pinned buffer before it is rewritten.
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaEventSynchronize(done_));
  RETURN_IF_ERROR(host_.Reserve(bytes));
  if (bytes > device_.size()) before_move();
  RETURN_IF_ERROR(device_.Reserve(bytes));
  plan.CopyTo(host_.data());
  LAZYRAG_RETURN_IF_CUDA_ERROR(
      cudaMemcpyAsync(device_.data(), host_.data(), bytes, cudaMemcpyHostToDevice, stream));
  LAZYRAG_RETURN_IF_CUDA_ERROR(cudaEventRecord(done_, stream));
  return device_.data();
}

absl::Status StepActivations::Reserve(int tokens, int rows) {
  if (Fits(tokens, rows)) return absl::OkStatus();
  const int T = std::max(tokens_, (tokens + 63) / 64 * 64);
  const int R = std::max(rows_, (rows + 7) / 8 * 8);
  const ModelConfig& c = config_;
  const size_t d = c.hidden_size, qd = c.q_dim(), kvd = c.kv_dim(), ff = c.intermediate_size;
  size_t bytes = 0;
  auto region = [&](size_t n) {
    const size_t off = bytes;
    bytes = AlignUp(bytes + n);
    return off;
  };
  const size_t ox = region(T * d * 4), oh = region(T * d * 2),
               oqkv = region(T * (qd + 2 * kvd) * 4), oq = region(T * qd * 2),
               oattn = region(T * qd * 2), odelta = region(T * d * 2), ogu = region(T * 2 * ff * 2),
               oact = region(T * ff * 2), orope = region(T * size_t(c.head_dim) * 4),
               ohr = region(R * d * 2), olog = region(R * size_t(c.vocab_size) * 4),
               oparts = region((d + 64) * 4);
  tokens_ = rows_ = 0;
  RETURN_IF_ERROR(buffer_.Allocate(bytes));
  char* base = buffer_.data();
  x = reinterpret_cast<float*>(base + ox);
  h = reinterpret_cast<uint16_t*>(base + oh);
  qkv = reinterpret_cast<float*>(base + oqkv);
  q = reinterpret_cast<uint16_t*>(base + oq);
  attn = reinterpret_cast<uint16_t*>(base + oattn);
  delta = reinterpret_cast<uint16_t*>(base + odelta);
  gate_up = reinterpret_cast<uint16_t*>(base + ogu);
  act = reinterpret_cast<uint16_t*>(base + oact);
  rope = reinterpret_cast<float*>(base + orope);
  h_rows = reinterpret_cast<uint16_t*>(base + ohr);
  logits = reinterpret_cast<float*>(base + olog);
  norm_parts = reinterpret_cast<float*>(base + oparts);
  tokens_ = T;
  rows_ = R;
  return absl::OkStatus();
}

}  // namespace lazyrag::cuda_backend
