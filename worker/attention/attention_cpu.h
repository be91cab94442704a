// CPU reference attention over the segment view (worker/attention/segment_view.h). The ground
// truth every CUDA kernel is tested against; also the attention of the CPU backend.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/attention/attention_types.h"
#include "worker/attention/segment_view.h"

namespace lazyrag {

// q:       [num_q, num_heads, head_dim], NOT rotated (rotation happens per segment here).
// k_cache: [num_pages, page_size, num_kv_heads, head_dim] of one layer; v_cache likewise.
// inv_freq:[head_dim / 2] (worker/attention/rope.h).
// out:     [num_q, num_heads, head_dim]. Rows that attend to no key are written as zeros.
// Threads over (query row, head) with common/parallel.h.
void PagedAttentionCpu(const AttentionShape& shape, const SegmentView& view,
                       const float* inv_freq, const float* q, const float* k_cache,
                       const float* v_cache, float* out,
                       KeyLayout layout = KeyLayout::kRotatedLocal);

// Applies `copies` to one layer's caches (src and dst may be the same pool).
void MaterializeCpu(const std::vector<MaterializeCopy>& copies, int page_size, int num_kv_heads,
                    int head_dim, const float* inv_freq, float* k_cache, float* v_cache);

}  // namespace lazyrag
