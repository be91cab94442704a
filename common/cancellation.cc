#include "common/cancellation.h"

#include <utility>

namespace lazyrag {

// The callback runs under mu_, so that ClearCallback() cannot return while it runs.
void Cancellation::Cancel() {
  absl::MutexLock lock(&mu_);
  if (cancelled_) return;
  cancelled_ = true;
  if (on_cancel_) on_cancel_();
}

bool Cancellation::cancelled() const {
  absl::MutexLock lock(&mu_);
  return cancelled_;
}

void Cancellation::SetCallback(std::function<void()> on_cancel) {
  absl::MutexLock lock(&mu_);
  on_cancel_ = std::move(on_cancel);
  if (cancelled_ && on_cancel_) on_cancel_();
}

void Cancellation::ClearCallback() {
  absl::MutexLock lock(&mu_);
  on_cancel_ = nullptr;
}

}  // namespace lazyrag
