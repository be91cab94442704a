// ForwardBatch builders for backend tests: a document encoded alone from position 0, and a
// query block after one cached document. Header-only; include from test files only.
#pragma once

#include <cstdint>
#include <vector>

#include "worker/backend/backend.h"

namespace lazyrag::backend_test {

// `tokens` at positions 0..n-1 into `pages`; logits of the last row.
inline ForwardBatch DocumentBatch(const std::vector<int32_t>& tokens, const std::vector<int32_t>& pages,
                           int page_size) {
  ForwardBatch b;
  const int n = int(tokens.size());
  b.tokens = tokens;
  b.view.page_size = page_size;
  std::vector<int32_t> pos(n);
  for (int j = 0; j < n; ++j) {
    pos[j] = j;
    b.kv_pos.push_back(j);
    b.kv_slot.push_back(int64_t(pages[j / page_size]) * page_size + j % page_size);
  }
  b.view.AddSegment(0, n, pages);
  b.view.EndRequest(pos);
  b.logit_rows = {n - 1};
  return b;
}

// `tokens` after a cached document of `doc_len` tokens in `doc_pages`, into `pages`; logits of
// every row.
inline ForwardBatch QueryBatch(const std::vector<int32_t>& doc_pages, int doc_len,
                        const std::vector<int32_t>& tokens, const std::vector<int32_t>& pages,
                        int page_size) {
  ForwardBatch b;
  const int m = int(tokens.size());
  b.tokens = tokens;
  b.view.page_size = page_size;
  std::vector<int32_t> pos(m);
  for (int j = 0; j < m; ++j) {
    pos[j] = doc_len + j;
    b.kv_pos.push_back(j);
    b.kv_slot.push_back(int64_t(pages[j / page_size]) * page_size + j % page_size);
    b.logit_rows.push_back(j);
  }
  b.view.AddSegment(0, doc_len, doc_pages);
  b.view.AddSegment(doc_len, m, pages);
  b.view.EndRequest(pos);
  return b;
}

}  // namespace lazyrag::backend_test
