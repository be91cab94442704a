// Issue 27: every labelled series whose label values are known is exported at zero before its
// first use, and the KV pool's hit tier is named by the device.
#include "worker/engine/engine_metrics.h"

#include <gtest/gtest.h>

#include <string>

namespace lazyrag {
namespace {

bool Has(const std::string &text, const std::string &line) {
  return text.find("\n" + line + "\n") != std::string::npos;
}

TEST(EngineMetricsTest, SeriesExistAtZeroBeforeFirstUse) {
  metrics::Registry registry;
  EngineMetrics m(&registry, "tiny", "cpu");
  const std::string text = registry.Serialize();
  for (const char *mode : {"lazy", "materialize", "prefix", "full"}) {
    const std::string labels = std::string("mode=\"") + mode + "\",model=\"tiny\"";
    for (const char *outcome : {"length", "stop", "eos", "cancelled", "invalid_argument"}) {
      EXPECT_TRUE(Has(text, "lazyrag_requests_finished_total{" + labels + ",outcome=\"" +
                                outcome + "\"} 0"))
          << mode << " " << outcome;
    }
    EXPECT_TRUE(Has(text, "lazyrag_time_to_first_token_seconds_count{" + labels + "} 0"));
    EXPECT_TRUE(Has(text, "lazyrag_queue_time_seconds_count{" + labels + "} 0"));
    EXPECT_TRUE(Has(text, "lazyrag_prompt_tokens_total{" + labels + "} 0"));
  }
  for (const char *tier : {"cpu", "host", "peer", "store"}) {
    EXPECT_TRUE(Has(text, std::string("lazyrag_doc_cache_hits_total{model=\"tiny\",tier=\"") +
                              tier + "\"} 0"))
        << tier;
  }
  EXPECT_EQ(text.find("tier=\"gpu\""), std::string::npos) << "a CPU pool is not a GPU";
  EXPECT_STREQ(m.pool_tier(), "cpu");
  EXPECT_TRUE(Has(text, "lazyrag_kvstore_requests_total{op=\"get\",result=\"hit\"} 0"));
  EXPECT_TRUE(Has(text, "lazyrag_kvstore_requests_total{op=\"put\",result=\"ok\"} 0"));
}

TEST(EngineMetricsTest, CudaPoolTierIsGpu) {
  metrics::Registry registry;
  EngineMetrics m(&registry, "m", "gpu");
  EXPECT_NE(registry.Serialize().find("lazyrag_doc_cache_hits_total{model=\"m\",tier=\"gpu\"} 0"),
            std::string::npos);
}

}  // namespace
}  // namespace lazyrag
