// CPU reference attention over the segment view (worker/backend/segment_view.h). The ground
// truth every CUDA kernel is tested against; also the attention of the CPU backend.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/backend/segment_view.h"

namespace lazyrag {

struct AttentionShape {
  int num_heads = 0;
  int num_kv_heads = 0;  // num_heads % num_kv_heads == 0 (GQA group = num_heads / num_kv_heads)
  int head_dim = 0;
  float scale = 0.0f;    // usually 1/sqrt(head_dim)
};

enum class KeyLayout {
  kRotatedLocal,  // keys stored rotated at local positions; query rotated per segment (LAZY)
  kUnrotated,     // keys stored un-rotated; each key rotated at seg_start + j (MEPIC variant)
};

// q:       [num_q, num_heads, head_dim], NOT rotated (rotation happens per segment here).
// k_cache: [num_pages, page_size, num_kv_heads, head_dim] of one layer; v_cache likewise.
// inv_freq:[head_dim / 2] (worker/backend/rope.h).
// out:     [num_q, num_heads, head_dim]. Rows that attend to no key are written as zeros.
// Threads over (query row, head) with common/parallel.h.
void PagedAttentionCpu(const AttentionShape& shape, const SegmentView& view,
                       const float* inv_freq, const float* q, const float* k_cache,
                       const float* v_cache, float* out,
                       KeyLayout layout = KeyLayout::kRotatedLocal);

// One MATERIALIZE copy (Block-Attention): tokens [0, len) of a source page run are copied to
// consecutive slots of a destination page run starting at token offset dst_offset, and each
// key is re-rotated by `delta` (R(delta) R(j) k = R(delta + j) k). Values are copied as they are.
struct MaterializeCopy {
  std::vector<int32_t> src_pages;
  int32_t len = 0;
  std::vector<int32_t> dst_pages;
  int32_t dst_offset = 0;
  int32_t delta = 0;
};

// Applies `copies` to one layer's caches (src and dst may be the same pool).
void MaterializeCpu(const std::vector<MaterializeCopy>& copies, int page_size, int num_kv_heads,
                    int head_dim, const float* inv_freq, float* k_cache, float* v_cache);

}  // namespace lazyrag
