#include "worker/engine/request_layout.h"

#include <algorithm>
#include <cmath>
#include <utility>

#include "common/sha256.h"

namespace lazyrag {
namespace {

std::vector<int32_t> Concatenated(const TokenPrompt &p,
                                  std::vector<std::pair<int64_t, int64_t>> *doc_spans) {
  std::vector<int32_t> all(p.sink);
  all.insert(all.end(), p.prefix.begin(), p.prefix.end());
  for (const auto &d : p.documents) {
    if (doc_spans) doc_spans->push_back({int64_t(all.size()), int64_t(all.size() + d.size())});
    all.insert(all.end(), d.begin(), d.end());
  }
  all.insert(all.end(), p.suffix.begin(), p.suffix.end());
  return all;
}

}  // namespace

std::vector<BlockRef> RequestBlocks(const TokenPrompt &prompt, AttentionMode mode) {
  std::vector<BlockRef> out;
  if (mode != AttentionMode::kLazy && mode != AttentionMode::kMaterialize) return out;
  if (!prompt.sink.empty()) out.push_back({&prompt.sink, false, true});
  if (!prompt.prefix.empty()) out.push_back({&prompt.prefix, false});
  for (const auto &d : prompt.documents) {
    if (!d.empty()) out.push_back({&d, true});
  }
  return out;
}

RequestLayout LayoutBlocks(const TokenPrompt &prompt, const std::vector<DocumentRun> &runs,
                           const QualitySettings &quality) {
  const int recompute_first_tokens = quality.recompute_first_tokens;
  const float doc_scale = 1.0f / quality.document_temperature;
  const float doc_bias = std::log(quality.document_scale);
  const bool scaled = doc_scale != 1.0f || doc_bias != 0.0f;
  // Blocks that drop tokens or scale scores are spans of their own when MATERIALIZE copies them.
  const bool spans = scaled || quality.drop_first_tokens > 0;
  RequestLayout l;
  const std::vector<BlockRef> blocks = RequestBlocks(prompt, AttentionMode::kLazy);
  int32_t start = 0, reserved = 0;
  for (size_t b = 0; b < runs.size(); ++b) {
    const DocumentRun &run = runs[b];
    const bool is_doc = b < blocks.size() && blocks[b].is_doc;
    const int32_t k = is_doc ? RecomputedTokens(recompute_first_tokens, run.num_tokens) : 0;
    const int32_t dropped =
        is_doc ? int32_t(std::min<int64_t>(quality.drop_first_tokens, run.num_tokens)) : 0;
    const float scale = is_doc ? doc_scale : 1.0f, bias = is_doc ? doc_bias : 0.0f;
    if (spans) l.block_spans.push_back(Segment{start, run.num_tokens, {}, dropped, scale, bias});
    // A document recomputed (or dropped) whole keeps no shared segment.
    const int32_t skip = std::max(k, dropped);
    if (skip < run.num_tokens) {
      l.fixed.push_back(Segment{start, run.num_tokens, run.pages, skip, scale, bias});
    }
    if (k > 0) {
      // Own-run slots [reserved, reserved + k) at logical [start, start + k).
      l.own_pieces.push_back(Segment{start - reserved, reserved + k, {}, reserved, scale, bias});
      for (int32_t j = 0; j < k; ++j) {
        l.feed.push_back((*blocks[b].tokens)[j]);
        l.fill_slot.push_back(reserved + j);
        l.fill_pos.push_back(start + j);
      }
      reserved += k;
    }
    start += run.num_tokens;
  }
  l.blocks_tokens = start;
  l.own = Segment{start - reserved, reserved, {}, reserved};
  l.feed.insert(l.feed.end(), prompt.suffix.begin(), prompt.suffix.end());
  l.recomputed_document_tokens = reserved;
  l.computed_tokens = int64_t(prompt.suffix.size()) + reserved;
  return l;
}

std::vector<MaterializeCopy> MaterializeInto(RequestLayout *l, const std::vector<int32_t> &pages) {
  std::vector<MaterializeCopy> copies;
  for (const Segment &f : l->fixed) {
    if (f.len > f.skip) {
      copies.push_back(
          MaterializeCopy{f.pages, f.len - f.skip, pages, f.start + f.skip, f.start, f.skip});
    }
  }
  l->own = Segment{0, l->blocks_tokens, pages, 0};
  l->own_pieces.clear();
  if (!l->block_spans.empty()) {
    for (const Segment &b : l->block_spans) {
      if (b.skip < b.len) {
        l->own_pieces.push_back(Segment{0, b.start + b.len, {}, b.start + b.skip, b.scale, b.bias});
      }
    }
    l->own.skip = l->blocks_tokens;
  }
  l->fill_slot = l->fill_pos;  // start 0: own-run index == logical position
  l->fixed.clear();
  return copies;
}

std::vector<std::string> PrefixPageIds(const TokenPrompt &prompt, const std::string &fingerprint,
                                       const std::string &ns, int ps) {
  const std::vector<int32_t> all = Concatenated(prompt, nullptr);
  std::vector<std::string> ids;
  Digest256 chain{};
  for (int64_t k = 0; (k + 1) * ps <= int64_t(all.size()); ++k) {
    Sha256 h;
    h.Update("lazyrag.prefix.v1");
    h.Update(fingerprint);
    h.Update(ns);
    h.Update(chain.data(), chain.size());
    h.Update(&all[k * ps], sizeof(int32_t) * ps);
    chain = h.Finish();
    ids.push_back("prefix:" + ToHex(chain));
  }
  return ids;
}

RequestLayout LayoutConcatenated(const TokenPrompt &prompt,
                                 const std::vector<int32_t> &reused_pages, int ps) {
  std::vector<std::pair<int64_t, int64_t>> doc_spans;
  const std::vector<int32_t> all = Concatenated(prompt, &doc_spans);
  const int64_t reused_tokens = int64_t(reused_pages.size()) * ps;
  RequestLayout l;
  for (auto [b, e] : doc_spans) {
    l.cached_document_tokens += std::max<int64_t>(0, std::min(e, reused_tokens) - b);
  }
  l.computed_tokens = int64_t(all.size()) - reused_tokens;
  l.own = Segment{0, int32_t(reused_tokens), reused_pages};
  l.feed.assign(all.begin() + reused_tokens, all.end());
  return l;
}

}  // namespace lazyrag
