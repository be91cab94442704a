// Document KV between the paged pool and its transport form (Backend::ExportKv's layout), on
// the device: the kvstore and peer byte paths through a device buffer, and the checksum of the
// host tier's copies. Host launchers in the style of model_kernels.h (stream in, Status out; bf16
// as raw 16-bit patterns).
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

// *checksum = KvChecksum (common/kv_checksum.h: XOR of mixed 64-bit words, so blocks combine in
// any order) of the run's transport form, read from the pool in place: the host tier moves the
// bytes with the copy engines and checks the pool's side of each copy here (kv.buffer unused).
// Zeroed and accumulated on `stream`. REQUIRES: kv_dim % 4 == 0; `checksum` a device uint64.
struct KvChecksumParams {
  KvTransportParams kv;
  unsigned long long* checksum = nullptr;
};
absl::Status LaunchKvChecksum(const KvChecksumParams& p, cudaStream_t stream);

}  // namespace lazyrag::cuda_model
