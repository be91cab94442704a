// Device and pinned host memory for the CUDA backend: owning buffers, the staged upload of a
// step's host arrays, and the activation scratch of a forward step.
//
// Thread safety: none; the backend serializes every call under its lock. Every method runs on
// the caller's current device (the backend sets it first).
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <functional>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "worker/model/config.h"

namespace lazyrag::cuda_backend {

inline constexpr size_t kAlign = 256;

inline size_t AlignUp(size_t n, size_t a = kAlign) { return (n + a - 1) / a * a; }

// Owning device allocation (cudaMalloc). Freeing synchronizes the device, so a buffer may be
// replaced while earlier work on it is still queued.
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  ~DeviceBuffer() { Release(); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  // Replaces the allocation with one of `bytes` (none for 0); contents are not kept.
  // RESOURCE_EXHAUSTED when the device is out of memory (the error is cleared, not sticky).
  absl::Status Allocate(size_t bytes);
  // Grows (never shrinks) to at least `bytes`; contents are not kept.
  absl::Status Reserve(size_t bytes) {
    if (bytes <= bytes_) return absl::OkStatus();
    return Allocate(std::max(bytes, bytes_ + bytes_ / 2));
  }
  void Release();
  char* data() const { return static_cast<char*>(ptr_); }
  size_t size() const { return bytes_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Owning page-locked host allocation (cudaMallocHost).
class PinnedBuffer {
 public:
  PinnedBuffer() = default;
  ~PinnedBuffer() { Release(); }
  PinnedBuffer(const PinnedBuffer&) = delete;
  PinnedBuffer& operator=(const PinnedBuffer&) = delete;

  // Grows (never shrinks, at least 64 KiB) to hold `bytes`; contents are not kept.
  absl::Status Reserve(size_t bytes);
  void Release();
  char* data() const { return static_cast<char*>(ptr_); }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// Host arrays gathered into one buffer at 16-byte aligned offsets, uploaded with one copy.
// Holds pointers to the arrays: they must outlive CopyTo.
class UploadPlan {
 public:
  // Returns the array's byte offset in the upload.
  template <typename T>
  size_t Add(const T* data, size_t count) {
    const size_t offset = bytes_;
    parts_.push_back({offset, count * sizeof(T), data});
    bytes_ = AlignUp(offset + count * sizeof(T), 16);
    return offset;
  }
  template <typename T>
  size_t Add(const std::vector<T>& v) {
    return Add(v.data(), v.size());
  }
  size_t bytes() const { return std::max<size_t>(bytes_, 16); }
  void CopyTo(char* dst) const {
    for (const Part& p : parts_) {
      if (p.bytes > 0) std::memcpy(dst + p.offset, p.src, p.bytes);
    }
  }

 private:
  struct Part {
    size_t offset;
    size_t bytes;
    const void* src;
  };
  std::vector<Part> parts_;
  size_t bytes_ = 0;
};

// Uploads an UploadPlan through one pinned buffer into one device buffer on a stream. Both
// buffers are reused from call to call; the device buffer stays where it is until an upload
// needs more room.
class StagedUpload {
 public:
  StagedUpload() = default;
  ~StagedUpload();
  StagedUpload(const StagedUpload&) = delete;
  StagedUpload& operator=(const StagedUpload&) = delete;

  // Creates the event that guards the pinned buffer. REQUIRES: called once, before Upload.
  absl::Status Init();
  // Copies `plan` into the pinned buffer (after the previous upload has left it) and into
  // device memory on `stream`; returns the device base address. `before_move` runs before the
  // device buffer is reallocated (whatever still addresses it must let go).
  absl::StatusOr<char*> Upload(const UploadPlan& plan, cudaStream_t stream,
                               const std::function<void()>& before_move);

 private:
  cudaEvent_t done_ = nullptr;  // the pinned buffer may be rewritten after it
  PinnedBuffer host_;
  DeviceBuffer device_;
};

// The activation scratch of one forward step, sized for at most tokens() rows and rows()
// logit rows, carved from one device allocation. Pointers stay valid until the next Reserve
// that grows it.
class StepActivations {
 public:
  explicit StepActivations(const ModelConfig& config) : config_(config) {}

  bool Fits(int tokens, int rows) const { return tokens <= tokens_ && rows <= rows_; }
  // Grows to at least `tokens` rows (rounded up to 64) and `rows` logit rows (rounded up to 8);
  // a no-op when they fit.
  absl::Status Reserve(int tokens, int rows);
  int tokens() const { return tokens_; }
  int rows() const { return rows_; }

  float* x = nullptr;           // [T, hidden] fp32 residual stream
  uint16_t* h = nullptr;        // [T, hidden] bf16 normed
  float* qkv = nullptr;         // [T, q_dim + 2 kv_dim] fp32
  uint16_t* q = nullptr;        // [T, q_dim] bf16
  uint16_t* attn = nullptr;     // [T, q_dim] bf16
  uint16_t* delta = nullptr;    // [T, hidden] bf16 projection output, added by the next RMSNorm
  uint16_t* gate_up = nullptr;  // [T, 2 ff] bf16
  uint16_t* act = nullptr;      // [T, ff] bf16
  float* rope = nullptr;        // [T, head_dim / 2, 2]
  uint16_t* h_rows = nullptr;   // [R, hidden] bf16 final-normed logit rows
  float* logits = nullptr;      // [R, vocab] fp32
  // [hidden + 64]: the sum-of-squares parts of folded RMSNorms: a one-token step's (gemv.h), at
  // most one per output of the projection before the norm, or 2-64 rows' (wgmma_gemm.h,
  // LaunchResidualScale), one per row and 64 or more columns.
  float* norm_parts = nullptr;

 private:
  const ModelConfig config_;
  DeviceBuffer buffer_;
  int tokens_ = 0;
  int rows_ = 0;
};

}  // namespace lazyrag::cuda_backend
