// MATERIALIZE (Block-Attention's path): copy cached document KV into a request's own pages
// and re-rotate every key by the document's rope delta, R(delta) R(j) k = R(delta + j) k.
// Values are copied as they are. Bandwidth-bound: 16-byte loads and stores, one launch for
// all copies and all layers. Matches MaterializeCpu (worker/attention/attention_cpu.h).
#pragma once

#include <cstdint>

#include "absl/status/status.h"

struct CUstream_st;
typedef struct CUstream_st* cudaStream_t;

namespace lazyrag::kernels {

// Copy c moves tokens [s, s + len[c]) of the page run src_pages[src_page_indptr[c] ..],
// s = src_offset[c] (0 when src_offset is null), to
// consecutive token slots dst_offset[c] .. of the page run dst_pages[dst_page_indptr[c] ..],
// in every layer. All arrays in device memory.
// REQUIRES: source and destination token slots do not overlap (within and across copies).
struct MaterializeParams {
  uint16_t* k_cache = nullptr;  // layer l: k_cache + l * layer_stride,
  uint16_t* v_cache = nullptr;  //   [num_pages, page_size, num_kv_heads, head_dim] bf16
  int64_t layer_stride = 0;     // elements between consecutive layers' pools
  int num_layers = 1;
  int page_size = 16;
  int num_kv_heads = 0;
  int head_dim = 0;                 // 64 or 128
  const float* inv_freq = nullptr;  // [head_dim / 2]

  int num_copies = 0;
  const int32_t* src_page_indptr = nullptr;  // [num_copies + 1]
  const int32_t* src_pages = nullptr;
  const int32_t* dst_page_indptr = nullptr;  // [num_copies + 1]
  const int32_t* dst_pages = nullptr;
  const int32_t* len = nullptr;         // [num_copies] tokens
  const int32_t* dst_offset = nullptr;  // [num_copies] first destination token slot
  const int32_t* delta = nullptr;       // [num_copies] rope delta added to every key
  const int32_t* src_offset = nullptr;  // [num_copies] first source token, or nullptr (all 0)
  int max_len = 0;                      // host hint, REQUIRES >= every len[c]; sizes the grid
};

absl::Status Materialize(const MaterializeParams& params, cudaStream_t stream);

}  // namespace lazyrag::kernels
