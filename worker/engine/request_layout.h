// Per-mode layout of a request's KV (DESIGN sections 4 and 5): pure functions
// from a request's blocks, resolved page runs and mode to its segments, logical
// positions, the tokens it feeds and its MATERIALIZE copies. No state and no
// allocation: the scheduler resolves the blocks and allocates the pages, then
// asks here where everything goes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "worker/attention/attention_types.h"
#include "worker/cache/document_table.h"
#include "worker/engine/request.h"

namespace lazyrag {

// Pages holding `tokens` tokens (0 for none).
inline int PagesFor(int64_t tokens, int page_size) {
  return int((tokens + page_size - 1) / page_size);
}

// A run of KV at logical positions [start, start + len) of a request, in
// `pages`.
struct Segment {
  int32_t start = 0;
  int32_t len = 0;
  std::vector<int32_t> pages;
};

// A shared block of a LAZY or MATERIALIZE request: the prefix, then each
// document.
struct BlockRef {
  const std::vector<int32_t> *tokens = nullptr;  // points into the prompt
  bool is_doc = false;
};
// The blocks of `prompt` in order, empty blocks left out; none for PREFIX and
// FULL (which compute the concatenated prompt).
std::vector<BlockRef> RequestBlocks(const TokenPrompt &prompt, AttentionMode mode);

// Where a request's KV lives and what it still feeds.
struct RequestLayout {
  std::vector<Segment> fixed;   // LAZY: the blocks at their logical starts, in shared pages
  Segment own;                  // the segment receiving fed tokens
  std::vector<int32_t> feed;    // prompt tokens still to feed into `own` (generated ones follow)
  int64_t computed_tokens = 0;  // prompt tokens this request runs (usage)
  int64_t cached_document_tokens = 0;  // FULL and PREFIX: document tokens in reused pages
};

// LAZY and MATERIALIZE. `runs`: the page runs of RequestBlocks(prompt, mode),
// in that order. The blocks sit back to back from position 0; the own segment
// starts after them, empty.
RequestLayout LayoutBlocks(const TokenPrompt &prompt, const std::vector<DocumentRun> &runs);

// MATERIALIZE: the copies of every fixed segment of `layout` into `pages` (the
// request's own, REQUIRES: at least PagesFor(own.start + 1) of them), keys
// re-rotated by the segment's start. Afterwards the own segment holds the
// blocks (start 0, len = the blocks' tokens, `pages`) and `layout` has no fixed
// segment.
std::vector<MaterializeCopy> MaterializeInto(RequestLayout *layout,
                                             const std::vector<int32_t> &pages);

// PREFIX: the chained hash ids ("prefix:<hex>") of the concatenated prompt's
// full pages.
std::vector<std::string> PrefixPageIds(const TokenPrompt &prompt, const std::string &fingerprint,
                                       const std::string &cache_namespace, int page_size);

// FULL and PREFIX: plain causal attention over prefix + documents + suffix,
// whose first `reused_pages.size()` full pages are already in the KV (PREFIX
// hits; none for FULL).
RequestLayout LayoutConcatenated(const TokenPrompt &prompt,
                                 const std::vector<int32_t> &reused_pages, int page_size);

}  // namespace lazyrag
