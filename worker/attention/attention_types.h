// Plain attention types shared by the CPU reference, the CUDA kernels, the backends and the
// engine: the head shape, the key layout in the pool, and one MATERIALIZE copy.
#pragma once

#include <cstdint>
#include <vector>

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

// One MATERIALIZE copy (Block-Attention): tokens [src_offset, src_offset + len) of a source page
// run are copied to consecutive slots of a destination page run starting at token offset
// dst_offset, and each key is re-rotated by `delta` (R(delta) R(j) k = R(delta + j) k). Values
// are copied as they are. src_offset > 0 leaves a run's first tokens out (they are recomputed:
// QualityOptions::recompute_first_tokens).
struct MaterializeCopy {
  std::vector<int32_t> src_pages;
  int32_t len = 0;
  std::vector<int32_t> dst_pages;
  int32_t dst_offset = 0;
  int32_t delta = 0;
  int32_t src_offset = 0;
};

}  // namespace lazyrag
