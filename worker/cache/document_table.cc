#include "worker/cache/document_table.h"

#include "absl/strings/str_cat.h"

namespace lazyrag {

DocumentTable::~DocumentTable() {
  absl::MutexLock lock(&mu_);
  for (auto& [id, e] : entries_) allocator_->Free(e.run.pages);
}

absl::StatusOr<DocumentRun> DocumentTable::Acquire(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return absl::NotFoundError("document not resident");
  Entry& e = it->second;
  if (e.refcount++ == 0) lru_.erase(e.lru);
  return e.run;
}

absl::StatusOr<DocumentRun> DocumentTable::Acquire(const std::string& id,
                                                   std::vector<int32_t>* tokens) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return absl::NotFoundError("document not resident");
  Entry& e = it->second;
  if (e.refcount++ == 0) lru_.erase(e.lru);
  *tokens = e.tokens;
  return e.run;
}

void DocumentTable::Release(const std::string& id, ReleaseBy by) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end() || it->second.refcount == 0) return;
  Entry& e = it->second;
  if (by == ReleaseBy::kRequest) e.used = true;
  if (--e.refcount > 0) return;
  const bool first_out = by == ReleaseBy::kPreparation && !e.used;
  e.lru = lru_.insert(first_out ? lru_.begin() : lru_.end(), id);
}

DocumentRun DocumentTable::Insert(const std::string& id, DocumentRun run,
                                  std::vector<int32_t> tokens) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it != entries_.end()) {
    allocator_->Free(run.pages);
    if (it->second.refcount++ == 0) lru_.erase(it->second.lru);
    return it->second.run;
  }
  Entry& e = entries_[id];
  e.run = std::move(run);
  e.tokens = std::move(tokens);
  e.refcount = 1;
  return e.run;
}

absl::StatusOr<std::vector<int32_t>> DocumentTable::AllocatePages(int n,
                                                                  std::vector<Evicted>* evicted) {
  for (;;) {
    auto pages = allocator_->Allocate(n);
    if (pages.ok()) return pages;
    absl::MutexLock lock(&mu_);
    if (lru_.empty()) return pages.status();
    auto it = entries_.find(lru_.front());
    lru_.pop_front();
    allocator_->Free(it->second.run.pages);
    if (evicted != nullptr) {
      evicted->push_back({it->first, std::move(it->second.run), std::move(it->second.tokens)});
    }
    entries_.erase(it);
    ++evictions_;
  }
}

absl::StatusOr<DocumentTable::Evicted> DocumentTable::Evict(const std::string& id) {
  absl::MutexLock lock(&mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) {
    return absl::NotFoundError(absl::StrCat("document ", id, " is not resident"));
  }
  if (it->second.refcount > 0) {
    return absl::FailedPreconditionError(absl::StrCat("document ", id, " is in use"));
  }
  lru_.erase(it->second.lru);
  allocator_->Free(it->second.run.pages);
  Evicted e{it->first, std::move(it->second.run), std::move(it->second.tokens)};
  entries_.erase(it);
  ++evictions_;
  return e;
}

bool DocumentTable::Contains(const std::string& id) const {
  absl::MutexLock lock(&mu_);
  return entries_.count(id) > 0;
}

DocumentTableStats DocumentTable::Stats() const {
  absl::MutexLock lock(&mu_);
  DocumentTableStats s;
  s.entries = int(entries_.size());
  s.evictions = evictions_;
  for (const auto& [id, e] : entries_) {
    s.cached_pages += e.run.pages.size();
    if (e.refcount > 0) {
      ++s.pinned_entries;
      s.pinned_pages += e.run.pages.size();
    }
  }
  return s;
}

std::vector<std::string> DocumentTable::ResidentIds() const {
  absl::MutexLock lock(&mu_);
  std::vector<std::string> ids;
  for (const auto& [id, e] : entries_) ids.push_back(id);
  return ids;
}

}  // namespace lazyrag
