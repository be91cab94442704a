#include "worker/engine/request_layout.h"

#include <algorithm>
#include <utility>

#include "common/sha256.h"

namespace lazyrag {
namespace {

std::vector<int32_t> Concatenated(const TokenPrompt &p,
                                  std::vector<std::pair<int64_t, int64_t>> *doc_spans) {
  std::vector<int32_t> all(p.prefix);
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
  if (!prompt.prefix.empty()) out.push_back({&prompt.prefix, false});
  for (const auto &d : prompt.documents) {
    if (!d.empty()) out.push_back({&d, true});
  }
  return out;
}

RequestLayout LayoutBlocks(const TokenPrompt &prompt, const std::vector<DocumentRun> &runs) {
  RequestLayout l;
  int32_t start = 0;
  for (const DocumentRun &run : runs) {
    l.fixed.push_back(Segment{start, run.num_tokens, run.pages});
    start += run.num_tokens;
  }
  l.own = Segment{start, 0, {}};
  l.feed = prompt.suffix;
  l.computed_tokens = int64_t(prompt.suffix.size());
  return l;
}

std::vector<MaterializeCopy> MaterializeInto(RequestLayout *l, const std::vector<int32_t> &pages) {
  std::vector<MaterializeCopy> copies;
  for (const Segment &f : l->fixed) {
    copies.push_back(MaterializeCopy{f.pages, f.len, pages, f.start, f.start});
  }
  l->own = Segment{0, l->own.start, pages};
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
