#include "common/metrics.h"

#include <gtest/gtest.h>

#include <limits>
#include <thread>
#include <vector>

namespace lazyrag::metrics {
namespace {

TEST(MetricsTest, CounterAndGaugeExposition) {
  Registry registry;
  auto& requests = registry.AddCounter("lazyrag_requests_total", "Requests served.");
  requests.Add({{"result", "ok"}, {"op", "get"}}).Increment();
  requests.Add({{"op", "get"}, {"result", "ok"}}).Increment(2);      // same label set
  requests.Add({{"op", "put"}, {"result", "error"}}).Increment(-5);  // ignored
  registry.AddGauge("lazyrag_bytes", "Bytes held.").Add().Set(268435456);
  EXPECT_EQ(registry.Serialize(),
            "# HELP lazyrag_requests_total Requests served.\n"
            "# TYPE lazyrag_requests_total counter\n"
            "lazyrag_requests_total{op=\"get\",result=\"ok\"} 3\n"
            "lazyrag_requests_total{op=\"put\",result=\"error\"} 0\n"
            "# HELP lazyrag_bytes Bytes held.\n"
            "# TYPE lazyrag_bytes gauge\n"
            "lazyrag_bytes 268435456\n");
}

TEST(MetricsTest, HistogramBucketsAreCumulativeWithInf) {
  Registry registry;
  auto& h = registry.AddHistogram("lazyrag_fetch_seconds", "Fetch time.", {1, 0.5, 0.5, 2})
                .Add({{"tier", "store"}});
  for (double v : {0.1, 0.5, 0.7, 3.0}) h.Observe(v);
  EXPECT_EQ(registry.Serialize(),
            "# HELP lazyrag_fetch_seconds Fetch time.\n"
            "# TYPE lazyrag_fetch_seconds histogram\n"
            "lazyrag_fetch_seconds_bucket{tier=\"store\",le=\"0.5\"} 2\n"
            "lazyrag_fetch_seconds_bucket{tier=\"store\",le=\"1\"} 3\n"
            "lazyrag_fetch_seconds_bucket{tier=\"store\",le=\"2\"} 3\n"
            "lazyrag_fetch_seconds_bucket{tier=\"store\",le=\"+Inf\"} 4\n"
            "lazyrag_fetch_seconds_sum{tier=\"store\"} 4.3\n"
            "lazyrag_fetch_seconds_count{tier=\"store\"} 4\n");
}

TEST(MetricsTest, Escaping) {
  EXPECT_EQ(internal::EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(internal::EscapeHelp("x\\y\nz \"q\""), "x\\\\y\\nz \"q\"");
  Registry registry;
  registry.AddGauge("g", "line1\nline2").Add({{"path", "C:\\dir \"x\""}}).Set(1);
  EXPECT_EQ(registry.Serialize(),
            "# HELP g line1\\nline2\n# TYPE g gauge\ng{path=\"C:\\\\dir \\\"x\\\"\"} 1\n");
}

TEST(MetricsTest, ValueFormatting) {
  EXPECT_EQ(internal::FormatValue(0), "0");
  EXPECT_EQ(internal::FormatValue(0.1), "0.1");
  EXPECT_EQ(internal::FormatValue(-2.5), "-2.5");
  EXPECT_EQ(internal::FormatValue(3e6), "3000000");
  EXPECT_EQ(internal::FormatValue(1e20), "1e+20");
  EXPECT_EQ(internal::FormatValue(std::numeric_limits<double>::infinity()), "+Inf");
  EXPECT_EQ(internal::FormatValue(-std::numeric_limits<double>::infinity()), "-Inf");
  EXPECT_EQ(internal::FormatValue(std::numeric_limits<double>::quiet_NaN()), "NaN");
}

TEST(MetricsTest, InvalidNamesAreSanitizedAndSameNameReturnsSameFamily) {
  Registry registry;
  auto& a = registry.AddCounter("lazyrag-bad name", "x");
  EXPECT_EQ(a.name(), "lazyrag_bad_name");
  EXPECT_EQ(&registry.AddCounter("lazyrag_bad_name", "y"), &a);
  // Another type under a taken name is not exported twice.
  registry.AddGauge("lazyrag_bad_name", "z").Add().Set(5);
  a.Add({{"9bad", "v"}}).Increment();
  EXPECT_EQ(registry.Serialize(),
            "# HELP lazyrag_bad_name x\n# TYPE lazyrag_bad_name counter\n"
            "lazyrag_bad_name{_bad=\"v\"} 1\n");
}

TEST(MetricsTest, ConcurrentUpdatesAreNotLost) {
  Registry registry;
  auto& family = registry.AddCounter("c_total", "c");
  auto& hist = registry.AddHistogram("h_seconds", "h").Add();
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 10000; ++i) {
        family.Add({{"t", std::to_string(t % 2)}}).Increment();
        hist.Observe(0.01);
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(family.Add({{"t", "0"}}).Value(), 20000);
  EXPECT_EQ(family.Add({{"t", "1"}}).Value(), 20000);
  EXPECT_EQ(hist.Collect().count, 40000u);
}

}  // namespace
}  // namespace lazyrag::metrics
