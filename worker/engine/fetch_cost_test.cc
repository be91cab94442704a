#include "worker/engine/fetch_cost.h"

#include <gtest/gtest.h>

namespace lazyrag {
namespace {

TEST(FetchCostModelTest, FetchesUntilBothCostsAreKnown) {
  FetchCostModel m;
  EXPECT_FALSE(m.PreferCompute(100));
  m.ObserveFetch(100, 1.0);  // 10 ms a token: slow
  EXPECT_FALSE(m.PreferCompute(100)) << "no compute estimate yet";
  EXPECT_EQ(m.PredictComputeSeconds(100), 0);
  m.ObserveCompute(100, 0.01);  // 0.1 ms a token
  EXPECT_TRUE(m.PreferCompute(100));
  EXPECT_NEAR(m.PredictComputeSeconds(100), 0.01, 1e-9) << "one step size: its cost per token";
  EXPECT_NEAR(m.PredictFetchSeconds(100), 1.0, 1e-9);
}

TEST(FetchCostModelTest, HedgesAfterTwiceTheComputeAndNotBeforeAStepIsSeen) {
  FetchCostModel m;
  EXPECT_EQ(m.HedgeAfterSeconds(2048), 0) << "nothing known: never give a fetch up";
  m.ObserveFetch(2048, 0.5);
  EXPECT_EQ(m.HedgeAfterSeconds(2048), 0);
  m.ObserveCompute(2048, 0.3);  // a step of 2048 tokens in 0.3 s
  EXPECT_NEAR(m.HedgeAfterSeconds(2048), 0.6, 1e-9);
  EXPECT_NEAR(m.HedgeAfterSeconds(16), 0.2, 1e-9) << "the floor";
  FetchCostOptions o;
  o.hedge_factor = 3;
  o.hedge_floor_seconds = 0;
  FetchCostModel m3(o);
  m3.ObserveCompute(100, 0.01);
  EXPECT_NEAR(m3.HedgeAfterSeconds(100), 0.03, 1e-9);
}

TEST(FetchCostModelTest, PrefersComputeOnlyBeyondTheMarginAndProbes) {
  FetchCostOptions o;
  o.margin = 2;
  o.probe_every = 4;
  FetchCostModel m(o);
  m.ObserveCompute(100, 0.1);  // 1 ms a token
  m.ObserveFetch(100, 0.15);   // 1.5 ms: within the margin
  EXPECT_FALSE(m.PreferCompute(100));
  FetchCostModel slow(o);
  slow.ObserveCompute(100, 0.1);
  slow.ObserveFetch(100, 0.5);  // 5 ms: compute wins, but every 4th decision probes
  int computed = 0, fetched = 0;
  for (int i = 0; i < 12; ++i) (slow.PreferCompute(100) ? computed : fetched)++;
  EXPECT_EQ(fetched, 3);
  EXPECT_EQ(computed, 9);
}

TEST(FetchCostModelTest, FetchAverageFollowsNewObservations) {
  FetchCostModel m;
  m.ObserveCompute(100, 0.1);
  m.ObserveFetch(100, 1.0);
  EXPECT_TRUE(m.PreferCompute(100));
  for (int i = 0; i < 40; ++i) m.ObserveFetch(100, 0.01);  // the store got fast
  EXPECT_NEAR(m.PredictFetchSeconds(1), 1e-4, 1e-5);
  EXPECT_FALSE(m.PreferCompute(100));
}

// What an H200 worker sees in LAZY serving with a kvstore (bench/HISTORY.md): only small steps,
// each ~5 ms of weight reads plus ~0.03 ms a token (decode batches of 1-16 rows, 32-token query
// blocks with decode rows beside them), and store hits at ~0.24 ms a token (a 2,048-token
// document in ~0.5 s). Recomputing that document takes ~75 ms. Dividing the steps' time by
// their tokens (the model before) priced a token at ~0.2 ms, nearly the fetch's, and fetched;
// the line through the steps predicts ~70 ms and computes.
TEST(FetchCostModelTest, SmallStepsDoNotMakeComputeLookExpensive) {
  FetchCostOptions o;
  o.chunk_tokens = 2048;
  FetchCostModel m(o);
  for (int i = 0; i < 200; ++i) {
    const int tokens = i % 3 == 0 ? 32 + i % 5 : 1 + i % 16;
    const double jitter = (i % 7 - 3) * 2e-5;
    m.ObserveCompute(tokens, 0.005 + 3e-5 * tokens + jitter);
  }
  m.ObserveFetch(2048, 0.49);
  const double compute = m.PredictComputeSeconds(2048);
  EXPECT_GT(compute, 0.055);
  EXPECT_LT(compute, 0.075);
  EXPECT_TRUE(m.PreferCompute(2048));
  // Four 2,048-token steps: the line's fixed cost once per chunk.
  EXPECT_NEAR(m.PredictComputeSeconds(4 * 2048), 4 * 0.005 + 3e-5 * 4 * 2048, 0.01);
}

// A store fast enough for one document is not when others wait for the fetch thread first.
TEST(FetchCostModelTest, QueuedFetchesCount) {
  FetchCostModel m;
  for (int tokens : {1, 8, 16, 32, 64, 128}) m.ObserveCompute(tokens, 0.005 + 3e-5 * tokens);
  m.ObserveFetch(2048, 0.06);  // 60 ms vs ~66 ms to compute: fetch
  EXPECT_FALSE(m.PreferCompute(2048));
  EXPECT_TRUE(m.PreferCompute(2048, /*fetch_backlog_tokens=*/4 * 2048));
}

// Noise that tilts the line downwards (same-sized steps but one) falls back to the cost per
// token, which leans to fetching.
TEST(FetchCostModelTest, NegativeSlopeFallsBackToCostPerToken) {
  FetchCostModel m;
  m.ObserveCompute(10, 0.006);
  m.ObserveCompute(20, 0.005);
  EXPECT_NEAR(m.PredictComputeSeconds(30), 0.011, 2e-4);
}


// The host tier: promoted until a promotion and a step are known; recomputed only when the
// promotion, behind those in flight, is predicted past the margin (with probes); on an H200-like
// machine (a promotion ~2.6 us a token, a 2,048-token document recomputed in ~55 ms) never.
TEST(FetchCostModelTest, HostTierIsPromotedUnlessSlowerThanComputing) {
  FetchCostModel m;
  EXPECT_FALSE(m.PreferComputeToHost(2048));  // nothing observed
  m.ObserveCompute(2048, 0.055);
  m.ObserveCompute(32, 0.006);
  EXPECT_FALSE(m.PreferComputeToHost(2048));  // no promotion observed
  m.ObserveHostCopy(2048, 0.0053);
  EXPECT_NEAR(m.PredictHostSeconds(2048), 0.0053, 1e-9);
  EXPECT_FALSE(m.PreferComputeToHost(2048));
  EXPECT_FALSE(m.PreferComputeToHost(2048, 8 * 2048));  // eight promotions ahead: still faster
  // A host tier as slow as computing (a slow bus, a tiny model): recomputed, probing every 8th.
  FetchCostModel slow;
  slow.ObserveCompute(2048, 0.055);
  slow.ObserveCompute(32, 0.006);
  slow.ObserveHostCopy(2048, 0.5);
  int promoted = 0;
  for (int i = 0; i < 16; ++i) promoted += slow.PreferComputeToHost(2048) ? 0 : 1;
  EXPECT_EQ(promoted, 2);
  EXPECT_EQ(slow.PredictHostSeconds(-5), 0);
}

}  // namespace
}  // namespace lazyrag
