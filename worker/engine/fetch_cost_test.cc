#include "worker/engine/fetch_cost.h"

#include <gtest/gtest.h>

namespace lazyrag {
namespace {

TEST(FetchCostModelTest, FetchesUntilBothCostsAreKnown) {
  FetchCostModel m;
  EXPECT_FALSE(m.PreferCompute());
  m.ObserveFetch(100, 1.0);  // 10 ms a token: slow
  EXPECT_FALSE(m.PreferCompute()) << "no compute estimate yet";
  m.ObserveCompute(16, 0.001);  // below min_compute_tokens: ignored
  EXPECT_EQ(m.compute_s_per_token(), 0);
  EXPECT_FALSE(m.PreferCompute());
  m.ObserveCompute(100, 0.01);  // 0.1 ms a token
  EXPECT_TRUE(m.PreferCompute());
}

TEST(FetchCostModelTest, PrefersComputeOnlyBeyondTheMarginAndProbes) {
  FetchCostOptions o;
  o.margin = 2;
  o.probe_every = 4;
  FetchCostModel m(o);
  m.ObserveCompute(100, 0.1);  // 1 ms a token
  m.ObserveFetch(100, 0.15);   // 1.5 ms: within the margin
  EXPECT_FALSE(m.PreferCompute());
  FetchCostModel slow(o);
  slow.ObserveCompute(100, 0.1);
  slow.ObserveFetch(100, 0.5);  // 5 ms: compute wins, but every 4th decision probes
  int computed = 0, fetched = 0;
  for (int i = 0; i < 12; ++i) (slow.PreferCompute() ? computed : fetched)++;
  EXPECT_EQ(fetched, 3);
  EXPECT_EQ(computed, 9);
}

TEST(FetchCostModelTest, MovingAveragesFollowNewObservations) {
  FetchCostModel m;
  m.ObserveCompute(100, 0.1);
  m.ObserveFetch(100, 1.0);
  EXPECT_TRUE(m.PreferCompute());
  for (int i = 0; i < 40; ++i) m.ObserveFetch(100, 0.01);  // the store got fast
  EXPECT_NEAR(m.fetch_s_per_token(), 1e-4, 1e-5);
  EXPECT_FALSE(m.PreferCompute());
}

}  // namespace
}  // namespace lazyrag
