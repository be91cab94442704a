#include "worker/engine/clock.h"

#include "absl/time/clock.h"

namespace lazyrag {
namespace {

class WallClock final : public Clock {
 public:
  absl::Time Now() const override { return absl::Now(); }
};

}  // namespace

Clock *RealClock() {
  static WallClock *const clock = new WallClock();
  return clock;
}

}  // namespace lazyrag
