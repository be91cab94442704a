// A cancellation signal one thread raises and another thread's blocking work reacts to (an HTTP
// connection that closed cancelling the gRPC call it started). No gRPC, no I/O.
#pragma once

#include <functional>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace lazyrag {

// Thread-safe. Cancel() is sticky: once cancelled, cancelled() stays true and every callback set
// later runs at once.
class Cancellation {
 public:
  Cancellation() = default;
  Cancellation(const Cancellation&) = delete;
  Cancellation& operator=(const Cancellation&) = delete;

  // Marks the signal and runs the current callback (once), on the calling thread.
  void Cancel();
  bool cancelled() const;

  // Sets what Cancel() runs (replacing the previous one); runs it now when already cancelled. The
  // callback must be cheap and must not call back into this object. ClearCallback() before whatever
  // it touches goes away: after ClearCallback() returns, the old callback is not running and never
  // runs again.
  void SetCallback(std::function<void()> on_cancel);
  void ClearCallback();

 private:
  mutable absl::Mutex mu_;
  bool cancelled_ ABSL_GUARDED_BY(mu_) = false;
  std::function<void()> on_cancel_ ABSL_GUARDED_BY(mu_);
};

}  // namespace lazyrag
