// The request view handed to attention kernels (DESIGN section 4), shared by the CPU reference
// and the CUDA kernels. A batch of requests in CSR form:
//
//   request b   : query rows   [q_indptr[b],   q_indptr[b+1])   of q / out
//                 segments     [seg_indptr[b], seg_indptr[b+1])
//   segment s   : pages        page_indices[page_indptr[s] .. page_indptr[s+1])
//                 seg_len[s]   valid tokens (the tail of the last page is padding, masked)
//                 seg_start[s] logical position of its first token == its RoPE delta
//                 seg_skip[s]  keys j < seg_skip[s] are not attended (held by another segment:
//                              a document's first tokens recomputed in the request's own pages,
//                              or other parts of the request's own run); nullptr = all 0.
//                              REQUIRES 0 <= seg_skip[s] <= seg_len[s]
//
// Key j of segment s lives in page page_indices[page_indptr[s] + j / page_size], slot
// j % page_size, and is stored rotated at its LOCAL position j (document-local for shared
// documents; local to the request's own segment for query and generated tokens). Its logical
// position is seg_start[s] + j. A query row with logical position p attends key (s, j) iff
// seg_start[s] + j <= p, and its score uses the query rotated by p - seg_start[s] (LAZY:
// one rotation of the query per segment instead of one per cached key).
//
//                 seg_scale[s], seg_bias[s]: the score of a key of the segment is
//                              (q . k) * shape.scale * seg_scale[s] + seg_bias[s] (a
//                              temperature 1 / seg_scale and a weight exp(seg_bias) on the
//                              segment's attention, APE-style); nullptr = 1 and 0.
// A query row attends key (s, j) iff seg_skip[s] <= j < seg_len[s] and seg_start[s] + j <= p.
//
// MATERIALIZE and FULL use the same view with a single segment starting at 0.
//
// KV pool layout (one tensor per layer for K and one for V):
//   [num_pages, page_size, num_kv_heads, head_dim]
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace lazyrag {

// Non-owning view; pointers are host or device memory depending on who consumes it.
struct SegmentView {
  int num_requests = 0;
  int num_q = 0;                         // total query rows
  int page_size = 16;
  const int32_t* q_indptr = nullptr;     // [num_requests + 1]
  const int32_t* q_pos = nullptr;        // [num_q] logical positions
  const int32_t* seg_indptr = nullptr;   // [num_requests + 1]
  const int32_t* seg_start = nullptr;    // [num_segs]
  const int32_t* seg_len = nullptr;      // [num_segs]
  const int32_t* page_indptr = nullptr;  // [num_segs + 1]
  const int32_t* page_indices = nullptr; // [page_indptr[num_segs]]
  const int32_t* seg_skip = nullptr;     // [num_segs] or nullptr (none skipped)
  const float* seg_scale = nullptr;      // [num_segs] or nullptr (all 1)
  const float* seg_bias = nullptr;       // [num_segs] or nullptr (all 0)
};

// Owning host form; Add* helpers keep the CSR arrays consistent.
struct SegmentViewHost {
  int page_size = 16;
  std::vector<int32_t> q_indptr{0};
  std::vector<int32_t> q_pos;
  std::vector<int32_t> seg_indptr{0};
  std::vector<int32_t> seg_start;
  std::vector<int32_t> seg_len;
  std::vector<int32_t> page_indptr{0};
  std::vector<int32_t> page_indices;
  std::vector<int32_t> seg_skip;  // [num_segs]
  std::vector<float> seg_scale;   // [num_segs]
  std::vector<float> seg_bias;    // [num_segs]

  // Appends a segment to the request being built (call before EndRequest).
  void AddSegment(int32_t start, int32_t len, const std::vector<int32_t>& pages,
                  int32_t skip = 0, float scale = 1.0f, float bias = 0.0f) {
    seg_start.push_back(start);
    seg_len.push_back(len);
    seg_skip.push_back(skip);
    seg_scale.push_back(scale);
    seg_bias.push_back(bias);
    page_indices.insert(page_indices.end(), pages.begin(), pages.end());
    page_indptr.push_back(static_cast<int32_t>(page_indices.size()));
  }
  // Closes the current request with its query rows' logical positions.
  void EndRequest(const std::vector<int32_t>& positions) {
    q_pos.insert(q_pos.end(), positions.begin(), positions.end());
    q_indptr.push_back(static_cast<int32_t>(q_pos.size()));
    seg_indptr.push_back(static_cast<int32_t>(seg_start.size()));
  }
  int num_requests() const { return static_cast<int>(q_indptr.size()) - 1; }
  int num_segments() const { return static_cast<int>(seg_start.size()); }
  // True when some segment skips keys or scales its scores (a backend without
  // SupportsQualityViews rejects it).
  bool any_quality() const {
    for (int32_t k : seg_skip) {
      if (k != 0) return true;
    }
    for (float x : seg_scale) {
      if (x != 1.0f) return true;
    }
    for (float x : seg_bias) {
      if (x != 0.0f) return true;
    }
    return false;
  }

  SegmentView View() const {
    SegmentView v;
    v.num_requests = num_requests();
    v.num_q = static_cast<int>(q_pos.size());
    v.page_size = page_size;
    v.q_indptr = q_indptr.data();
    v.q_pos = q_pos.data();
    v.seg_indptr = seg_indptr.data();
    v.seg_start = seg_start.data();
    v.seg_len = seg_len.data();
    v.page_indptr = page_indptr.data();
    v.page_indices = page_indices.data();
    v.seg_skip = seg_skip.size() == seg_start.size() ? seg_skip.data() : nullptr;
    v.seg_scale = seg_scale.size() == seg_start.size() ? seg_scale.data() : nullptr;
    v.seg_bias = seg_bias.size() == seg_start.size() ? seg_bias.data() : nullptr;
    return v;
  }
};

}  // namespace lazyrag
