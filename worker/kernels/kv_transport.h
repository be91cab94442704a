// Document KV between the paged pool and its transport form (Backend::ExportKv's layout), on
// the device: the kvstore and peer byte paths through a device buffer, and the host tier's
// copies straight to and from pinned host memory with their checksum. Host launchers in the
// style of model_kernels.h (stream in, Status out; bf16 as raw 16-bit patterns).
#pragma once

#include <cstdint>

#include "absl/status/status.h"

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace lazyrag::cuda_model {

// Document KV between the paged pool and the transport form: for each layer, K then V, each
// [num_tokens, kv_dim]; token j lives in slot pages[j / page_size] * page_size + j % page_size.
struct KvTransportParams {
  uint16_t* pool = nullptr;  // layer l's K at pool + l * layer_stride, V at + v_offset
  int64_t layer_stride = 0;  // elements
  int64_t v_offset = 0;      // elements
  int num_layers = 0;
  int page_size = 0;
  int kv_dim = 0;
  const int32_t* pages = nullptr;
  int num_tokens = 0;
  uint16_t* buffer = nullptr;  // [num_layers, 2, num_tokens, kv_dim]
  bool to_buffer = true;       // true: export (pool -> buffer); false: import
};
absl::Status LaunchKvTransport(const KvTransportParams& p, cudaStream_t stream);

// The host tier's copy: KvTransport with `buffer` in pinned host memory that the kernel reads
// or writes directly over the bus (mapped through unified addressing; no device staging), and
// *checksum = KvChecksum of the buffer's bytes (common/kv_checksum.h: XOR of mixed 64-bit
// words, so blocks combine in any order), zeroed and accumulated on `stream`.
// REQUIRES: kv_dim % 4 == 0; `buffer` 16-byte aligned; `checksum` a device uint64.
struct KvHostTransportParams {
  KvTransportParams kv;  // kv.buffer: the host buffer's device address
  unsigned long long* checksum = nullptr;
};
absl::Status LaunchKvHostTransport(const KvHostTransportParams& p, cudaStream_t stream);

}  // namespace lazyrag::cuda_model
