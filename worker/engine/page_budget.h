// The KV pool as the scheduler spends it: page allocation that evicts
// unreferenced documents and then preempts requests, the choice of whom to
// preempt, and the admission check (does a request's worst case fit beside what
// the running ones may still claim). Scheduler thread only; the table and
// allocator it wraps are thread-safe themselves.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "worker/cache/document_table.h"
#include "worker/cache/page_allocator.h"
#include "worker/engine/engine.h"

namespace lazyrag {

// A running request as the budget sees it when choosing whom to preempt.
struct PreemptionCandidate {
  uint64_t order = 0;        // larger = younger (submitted later)
  bool packed = false;       // in the step being planned: never preempted
  bool holds_pages = false;  // owns pages or pins documents
};

// The youngest candidate younger than `requester_order` that is not packed and
// holds pages; -1 when there is none.
int ChooseVictim(std::span<const PreemptionCandidate> candidates, uint64_t requester_order);

class PageBudget {
 public:
  // Not owned; must outlive the budget.
  PageBudget(DocumentTable *table, PageAllocator *allocator, int page_size);

  int page_size() const { return page_size_; }
  // Called with the documents each Allocate evicts, right after (before their pages are
  // written again).
  void set_on_evicted(std::function<void(std::vector<DocumentTable::Evicted>)> on_evicted) {
    on_evicted_ = std::move(on_evicted);
  }

  // Allocates n pages: free ones, then evicting unreferenced documents least
  // recently used first; while the pool is still short, calls `preempt_one`
  // (which frees some pages and returns true, or returns false when it has no
  // victim). RESOURCE_EXHAUSTED then.
  absl::StatusOr<std::vector<int32_t>> Allocate(int n, const std::function<bool()> &preempt_one);

  // Pages a request's own segment may hold at most: its query block and its
  // documents' recomputed first tokens (LAZY) or whole prompt (the other modes)
  // plus max_tokens. `quality`: the request's resolved settings.
  int64_t OwnPagesAtMost(const TokenPrompt &prompt, const TokenRunOptions &options,
                         const QualitySettings &quality) const;
  // A request's worst case at admission: OwnPagesAtMost plus its blocks that
  // are not resident.
  int64_t AdmissionPages(const TokenPrompt &prompt, const TokenRunOptions &options,
                         const QualitySettings &quality, const std::string &fingerprint) const;
  // True when `need` pages fit on top of `reserved` (what running requests may
  // still claim), counting unpinned cached documents as free.
  bool Fits(int64_t need, int64_t reserved) const;

 private:
  DocumentTable *table_;
  PageAllocator *allocator_;
  const int page_size_;
  std::function<void(std::vector<DocumentTable::Evicted>)> on_evicted_;
};

}  // namespace lazyrag
