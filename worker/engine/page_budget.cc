#include "worker/engine/page_budget.h"

#include "absl/strings/str_cat.h"
#include "common/document_id.h"
#include "worker/engine/request_layout.h"

namespace lazyrag {

int ChooseVictim(std::span<const PreemptionCandidate> candidates, uint64_t requester_order) {
  int victim = -1;
  for (size_t i = 0; i < candidates.size(); ++i) {
    const PreemptionCandidate &c = candidates[i];
    if (c.order <= requester_order || c.packed || !c.holds_pages) continue;
    if (victim < 0 || c.order > candidates[victim].order) victim = int(i);
  }
  return victim;
}

PageBudget::PageBudget(DocumentTable *table, PageAllocator *allocator, int page_size)
    : table_(table), allocator_(allocator), page_size_(page_size) {}

absl::StatusOr<std::vector<int32_t>> PageBudget::Allocate(
    int n, const std::function<bool()> &preempt_one) {
  for (;;) {
    std::vector<DocumentTable::Evicted> evicted;
    // Evicts unreferenced documents LRU first.
    auto pages = table_->AllocatePages(n, on_evicted_ ? &evicted : nullptr);
    if (!evicted.empty()) on_evicted_(std::move(evicted));
    if (pages.ok() || !absl::IsResourceExhausted(pages.status())) return pages;
    if (!preempt_one()) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "KV pool exhausted (", allocator_->num_pages(), " pages of ", page_size_, " tokens)"));
    }
  }
}

int64_t PageBudget::OwnPagesAtMost(const TokenPrompt &p, const TokenRunOptions &o,
                                   const QualitySettings &q) const {
  const int64_t gen = o.max_tokens;
  int64_t tokens = p.total_tokens() + gen;
  if (o.mode == AttentionMode::kLazy) {
    tokens = int64_t(p.suffix.size()) + gen;
    for (const auto &d : p.documents) tokens += RecomputedTokens(q.recompute_first_tokens, d.size());
  }
  return PagesFor(tokens, page_size_);
}

int64_t PageBudget::AdmissionPages(const TokenPrompt &p, const TokenRunOptions &o,
                                   const QualitySettings &q,
                                   const std::string &fingerprint) const {
  int64_t need = OwnPagesAtMost(p, o, q);
  for (const BlockRef &b : RequestBlocks(p, o.mode)) {
    if (b.is_sink) continue;  // pinned by the engine for its lifetime
    if (!table_->Contains(DocumentId(fingerprint, o.cache_namespace, *b.tokens))) {
      need += PagesFor(int64_t(b.tokens->size()), page_size_);
    }
  }
  return need;
}

bool PageBudget::Fits(int64_t need, int64_t reserved) const {
  const DocumentTableStats st = table_->Stats();
  const int64_t available = allocator_->num_free() + (st.cached_pages - st.pinned_pages);
  return need + reserved <= available;
}

}  // namespace lazyrag
