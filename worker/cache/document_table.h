// The document table over the page pool: id -> pinned page run. Documents (and PREFIX-mode
// cached pages) are ref-counted while requests reference them; unreferenced entries are
// evicted least recently used when pages run out, except that an entry only prepared so far
// (made resident by a document preparation, used by no request yet) is evicted first, so that
// a bulk preparation does not push out the documents requests use (the LRU insertion policy
// for prefetched entries). Thread-safe.
#pragma once

#include <cstdint>
#include <list>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "worker/cache/page_allocator.h"

namespace lazyrag {

struct DocumentRun {
  std::vector<int32_t> pages;
  int32_t num_tokens = 0;
};

struct DocumentTableStats {
  int entries = 0;
  int pinned_entries = 0;
  int64_t pinned_pages = 0;
  int64_t cached_pages = 0;  // pages held by entries (pinned or not)
  int64_t evictions = 0;
};

class DocumentTable {
 public:
  explicit DocumentTable(PageAllocator* allocator) : allocator_(allocator) {}
  ~DocumentTable();

  // Pins and returns the entry, or NOT_FOUND.
  absl::StatusOr<DocumentRun> Acquire(const std::string& id);
  // Same, and copies the token ids the entry was inserted with into `tokens` (empty when it
  // was inserted without them). For exporting a resident document to a peer worker.
  absl::StatusOr<DocumentRun> Acquire(const std::string& id, std::vector<int32_t>* tokens);
  // Who drops a reference, for the eviction order of an entry whose last reference it is.
  enum class ReleaseBy {
    kRequest,      // a request used the entry: most recently used
    kPreparation,  // a document preparation (Engine::EncodeDocuments): evicted first unless a
                   // request has used the entry, so of prepared entries the latest go first
    kJob,          // the job that made the entry resident: most recently used, not a use
  };
  // Drops one reference taken by Acquire or Insert.
  void Release(const std::string& id, ReleaseBy by = ReleaseBy::kRequest);
  // Adds a computed entry that owns `run.pages`, pinned once for the caller. If the id is
  // already present (a concurrent insert), frees `run.pages`, pins the existing entry and
  // returns it. `tokens`: the block's token ids, kept for Acquire(id, tokens) (documents and
  // prefix blocks; empty for PREFIX-mode pages).
  DocumentRun Insert(const std::string& id, DocumentRun run, std::vector<int32_t> tokens = {});
  // An entry evicted by AllocatePages: its pages are already back in the allocator (their
  // contents stay until they are written again).
  struct Evicted {
    std::string id;
    DocumentRun run;
    std::vector<int32_t> tokens;
  };
  // Allocates pages, evicting unreferenced entries least recently used first; appends the
  // entries it evicted to `evicted` when given.
  absl::StatusOr<std::vector<int32_t>> AllocatePages(int n,
                                                     std::vector<Evicted>* evicted = nullptr);
  void FreePages(const std::vector<int32_t>& pages) { allocator_->Free(pages); }
  // Evicts the entry now, as AllocatePages would: NOT_FOUND when absent, FAILED_PRECONDITION
  // when referenced. Its pages go back to the allocator.
  absl::StatusOr<Evicted> Evict(const std::string& id);
  bool Contains(const std::string& id) const;
  DocumentTableStats Stats() const;
  std::vector<std::string> ResidentIds() const;

 private:
  struct Entry {
    DocumentRun run;
    std::vector<int32_t> tokens;  // the block's token ids; may be empty
    int refcount = 0;
    bool used = false;                     // a request has released a reference to it
    std::list<std::string>::iterator lru;  // valid while refcount == 0
  };
  PageAllocator* allocator_;
  mutable absl::Mutex mu_;
  std::unordered_map<std::string, Entry> entries_ ABSL_GUARDED_BY(mu_);
  std::list<std::string> lru_ ABSL_GUARDED_BY(mu_);  // unreferenced ids, front = oldest
  int64_t evictions_ ABSL_GUARDED_BY(mu_) = 0;
};

}  // namespace lazyrag
