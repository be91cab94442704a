// Fixed-size page allocator over the backend's KV pool (DESIGN section 4). Thread-safe.
#pragma once

#include <cstdint>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace lazyrag {

class PageAllocator {
 public:
  explicit PageAllocator(int num_pages);
  // n pages, or RESOURCE_EXHAUSTED (nothing allocated) when fewer are free. The most recently
  // freed pages go first, each freed run in its own order: a fresh pool hands out ascending
  // runs.
  absl::StatusOr<std::vector<int32_t>> Allocate(int n);
  // REQUIRES: every page was returned by Allocate and not freed since.
  void Free(const std::vector<int32_t>& pages);
  int num_free() const;
  int num_pages() const { return num_pages_; }

 private:
  const int num_pages_;
  mutable absl::Mutex mu_;
  std::vector<int32_t> free_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazyrag
