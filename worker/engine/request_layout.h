// Per-mode layout of a request's KV (DESIGN sections 4 and 5): pure functions
// from a request's blocks, resolved page runs and mode to its segments, logical
// positions, the tokens it feeds and its MATERIALIZE copies. No state and no
// allocation: the scheduler resolves the blocks and allocates the pages, then
// asks here where everything goes.
#pragma once

#include <algorithm>
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
// `pages`; its keys [0, skip) are not attended (SegmentView::seg_skip).
struct Segment {
  int32_t start = 0;
  int32_t len = 0;
  std::vector<int32_t> pages;
  int32_t skip = 0;
  float scale = 1.0f;  // SegmentView::seg_scale / seg_bias
  float bias = 0.0f;
};

// Tokens of a document that a request recomputes at their true positions
// (QualityOptions::recompute_first_tokens): the first min(k, size) of each.
inline int32_t RecomputedTokens(int k, int64_t document_tokens) {
  return int32_t(std::min<int64_t>(k, document_tokens));
}

// A shared block of a LAZY or MATERIALIZE request: the engine's shared prefix
// (the sink), the prefix, then each document.
struct BlockRef {
  const std::vector<int32_t> *tokens = nullptr;  // points into the prompt
  bool is_doc = false;
  bool is_sink = false;  // cached once under the engine's sink id, whatever the namespace
};
// The blocks of `prompt` in order, empty blocks left out; none for PREFIX and
// FULL (which compute the concatenated prompt).
std::vector<BlockRef> RequestBlocks(const TokenPrompt &prompt, AttentionMode mode);

// Where a request's KV lives and what it still feeds.
//
// The request's own run (own.pages) holds, in order: `own.len` tokens reserved
// at layout time (the slots of `fill_slot`), then the tokens fed after the
// fills, appended at own.len. Key i of the own run is rotated at local position
// i; `own` and each of `own_pieces` are segments over that run that attend
// different parts of it at different logical starts (their `skip` and `len`).
struct RequestLayout {
  std::vector<Segment> fixed;   // LAZY: the blocks at their logical starts, in shared pages
  // LAZY with recompute_first_tokens: one segment per document over the own run
  // (pages empty here: own.pages when the step is built) holding its
  // recomputed first tokens at their true positions.
  std::vector<Segment> own_pieces;
  Segment own;                  // the segment receiving fed tokens
  std::vector<int32_t> feed;    // prompt tokens still to feed into `own` (generated ones follow)
  // feed[i] for i < fill_slot.size() is written at own-run index fill_slot[i]
  // (within own.len, reserved) and logical position fill_pos[i]; later tokens
  // follow at own.len, logical position own.start + own.len.
  std::vector<int32_t> fill_slot;
  std::vector<int32_t> fill_pos;
  int32_t blocks_tokens = 0;    // LAZY / MATERIALIZE: tokens of the prefix and documents
  // LAZY / MATERIALIZE with document temperature / scale or dropped first tokens: each
  // block's logical range (start, len), its dropped first tokens (skip) and its score scale
  // and bias (pages empty), for MaterializeInto.
  std::vector<Segment> block_spans;
  int64_t computed_tokens = 0;  // prompt tokens this request runs (usage)
  int64_t recomputed_document_tokens = 0;  // of those, document tokens (first-k)
  int64_t cached_document_tokens = 0;  // FULL and PREFIX: document tokens in reused pages
};

// LAZY and MATERIALIZE. `runs`: the page runs of RequestBlocks(prompt, mode),
// in that order. The blocks sit back to back from position 0. With
// recompute_first_tokens = k > 0, each document's first min(k, size) tokens are
// fed first (own-run slots 0, 1, ... in document order, at their logical
// positions), its shared segment skips them, and the query follows; with k = 0
// the own segment starts after the blocks, empty, and nothing is reserved.
// Document segments (shared and recomputed) carry the settings' temperature and
// scale as their score scale and bias. With drop_first_tokens = m > 0 each
// document's shared segment skips its first min(m, size) tokens and nothing
// replaces them.
RequestLayout LayoutBlocks(const TokenPrompt &prompt, const std::vector<DocumentRun> &runs,
                           const QualitySettings &quality = {});

// MATERIALIZE: the copies of every fixed segment of `layout` into `pages` (the
// request's own, REQUIRES: at least PagesFor(blocks_tokens + 1) of them), keys
// re-rotated by the segment's start, its skipped first tokens left out (they
// are fed into their logical slots: fill_slot becomes fill_pos). Afterwards the
// own segment holds the blocks (start 0, len = blocks_tokens, `pages`) and
// `layout` has no fixed segment; when blocks scale their scores or drop tokens,
// the own run is instead cut into one piece per block (start 0, skip = the
// block's start plus its dropped tokens) and an own segment skipping all
// blocks, so MATERIALIZE attends and scores as LAZY does.
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
