// The time source of the engine (scheduler, document fetcher): deadlines, hedge
// times, the store's down windows, fetch and step costs and request timings are
// read only through it, so tests can drive time instead of sleeping
// (engine_test_util.h: FakeClock).
#pragma once

#include "absl/time/time.h"

namespace lazyrag {

// Thread-safe: Now may be called from any thread.
class Clock {
 public:
  virtual ~Clock() = default;
  virtual absl::Time Now() const = 0;
};

// The process's wall clock (absl::Now). Never null; lives as long as the
// process.
Clock *RealClock();

}  // namespace lazyrag
