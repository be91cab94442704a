#include "worker/cache/page_allocator.h"

#include "absl/strings/str_cat.h"

namespace lazyrag {

PageAllocator::PageAllocator(int num_pages) : num_pages_(num_pages) {
  free_.reserve(num_pages);
  // A stack whose top is the lowest page: runs are handed out in ascending order (and return
  // so), which keeps a document's pages contiguous for the host tier's copies.
  for (int i = num_pages - 1; i >= 0; --i) free_.push_back(i);
}

absl::StatusOr<std::vector<int32_t>> PageAllocator::Allocate(int n) {
  absl::MutexLock lock(&mu_);
  if (n < 0 || n > int(free_.size())) {
    return absl::ResourceExhaustedError(
        absl::StrCat("kv pool: ", n, " pages wanted, ", free_.size(), " free of ", num_pages_));
  }
  std::vector<int32_t> out(free_.rbegin(), free_.rbegin() + n);
  free_.resize(free_.size() - n);
  return out;
}

void PageAllocator::Free(const std::vector<int32_t>& pages) {
  absl::MutexLock lock(&mu_);
  free_.insert(free_.end(), pages.rbegin(), pages.rend());
}

int PageAllocator::num_free() const {
  absl::MutexLock lock(&mu_);
  return int(free_.size());
}

}  // namespace lazyrag
